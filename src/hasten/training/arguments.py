"""The `Accelerator` constructor's arguments, checked and resolved into the values it keeps.

Each resolver refuses a pair of arguments that exclude each other, or a value of the wrong type,
with the fix; the launcher's settings (ACCELERATE_* variables) apply where an argument is left
at its default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hasten.config import envvars
from hasten.config.dynamo import TorchDynamoPlugin
from hasten.config.enums import parse_mixed_precision
from hasten.config.project import DataLoaderConfiguration, GradientAccumulationPlugin
from hasten.core.coerce import whole_number
from hasten.core.environment import str_to_bool

if TYPE_CHECKING:
    from hasten.config.deepspeed import DeepSpeedPlugin
    from hasten.config.enums import DynamoBackend
    from hasten.config.kwargs import KwargsHandler

__all__ = [
    "FP8_SLOTS",
    "UNSET",
    "resolve_accumulation",
    "resolve_data_config",
    "resolve_deepspeed",
    "resolve_dynamo",
    "resolve_mixed_precision",
    "sort_handlers",
]

#: The default of an argument whose absence differs from any value (``split_batches``).
UNSET: Any = object()


def _handler_slots() -> dict[type[KwargsHandler], str]:
    """Which attribute of the Accelerator holds each kind of kwargs handler."""
    from hasten.config import kwargs

    return {
        kwargs.DistributedDataParallelKwargs: "ddp_handler",
        kwargs.GradScalerKwargs: "scaler_handler",
        kwargs.InitProcessGroupKwargs: "init_handler",
        kwargs.AutocastKwargs: "autocast_handler",
        kwargs.ProfileKwargs: "profile_handler",
        # FP8RecipeKwargs subclasses the TE and MS-AMP recipes: it must be matched first.
        kwargs.FP8RecipeKwargs: "fp8_recipe_handler",
        kwargs.AORecipeKwargs: "ao_recipe_handler",
        kwargs.TERecipeKwargs: "te_recipe_handler",
        kwargs.MSAMPRecipeKwargs: "msamp_recipe_handler",
    }


#: The Accelerator's attributes that may hold an fp8 recipe (one at most).
FP8_SLOTS = (
    "fp8_recipe_handler",
    "ao_recipe_handler",
    "te_recipe_handler",
    "msamp_recipe_handler",
)


def sort_handlers(handlers: Sequence[KwargsHandler] | None) -> dict[str, KwargsHandler]:
    """Map each handler to its Accelerator slot, refusing unknown types and duplicates."""
    found: dict[str, KwargsHandler] = {}
    slots = _handler_slots() if handlers else {}
    for handler in handlers or ():
        slot = next((s for cls, s in slots.items() if isinstance(handler, cls)), None)
        if slot is None:
            allowed = sorted(cls.__name__ for cls in slots)
            raise TypeError(
                f"Unsupported kwargs handler {handler!r}: kwargs_handlers accepts instances of "
                f"{allowed}. Pass each handler as an instance, e.g. "
                "kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)]."
            )
        if slot in found:
            raise ValueError(
                f"Two {type(handler).__name__} were passed in kwargs_handlers; pass only one, "
                "with all its settings."
            )
        found[slot] = handler
    recipes = [type(found[slot]).__name__ for slot in FP8_SLOTS if slot in found]
    if len(recipes) > 1:
        raise ValueError(
            f"Several fp8 recipes were passed in kwargs_handlers ({', '.join(recipes)}); pass "
            "only the one of the fp8 backend you train with."
        )
    return found


def resolve_accumulation(
    steps: int, plugin: GradientAccumulationPlugin | None
) -> GradientAccumulationPlugin:
    """Build the accumulation plugin from the argument, the plugin, or ACCELERATE_GRADIENT_..."""
    if plugin is not None:
        if steps != 1:
            raise ValueError(
                f"gradient_accumulation_steps={steps!r} and a GradientAccumulationPlugin were "
                "both passed; pass only one: put num_steps in the plugin, e.g. "
                f"GradientAccumulationPlugin(num_steps={steps!r})."
            )
        return plugin
    count = whole_number(steps)  # np.int64(2) -> 2, as Accelerate accepts it
    if count is None:
        raise TypeError(
            f"gradient_accumulation_steps must be an int >= 1, got {type(steps).__name__} "
            f"{steps!r}."
        )
    steps = count
    source = "gradient_accumulation_steps"
    if steps == 1:  # the default: the launcher's setting applies
        from_env = envvars.setting("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
        if from_env is not None:
            steps, source = int(from_env), "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"
    if steps < 1:
        raise ValueError(
            f"{source}={steps!r} is invalid: it must be >= 1 (1 means no accumulation). "
            "Pass a positive number of micro-batches per optimizer step."
        )
    return GradientAccumulationPlugin(num_steps=steps)


def resolve_mixed_precision(value: Any) -> str | None:
    """Validate the user's mixed_precision value (None: the launcher's setting applies)."""
    if value is None:
        return None
    return parse_mixed_precision(
        value,
        "Accelerator(mixed_precision=...)",
        "pass one of them, or None to use ACCELERATE_MIXED_PRECISION / the config file",
    )


def resolve_dynamo(
    backend: DynamoBackend | str | None, plugin: TorchDynamoPlugin | None
) -> TorchDynamoPlugin:
    if backend is not None and plugin is not None:
        raise ValueError(
            f"dynamo_backend={backend!r} and dynamo_plugin were both passed; pass only one "
            "(TorchDynamoPlugin(backend=...) holds the backend too)."
        )
    if backend is not None:
        return TorchDynamoPlugin(backend=backend)  # type: ignore[arg-type]  # a name is parsed
    return plugin if plugin is not None else TorchDynamoPlugin()


def resolve_data_config(
    config: DataLoaderConfiguration | None, split_batches: Any
) -> DataLoaderConfiguration:
    config = config if config is not None else DataLoaderConfiguration()
    # Accelerate 1.15 ignores this deprecated argument; hasten applies it when it is given
    # (None counts as not given), as a flag: a bool, a number, or text such as "true".
    if split_batches is UNSET or split_batches is None:
        return config
    if isinstance(split_batches, str):
        try:
            split_batches = str_to_bool(split_batches, to_bool=True)
        except ValueError as err:
            raise TypeError(f"split_batches must be a bool: {err}.") from None
    config.split_batches = bool(split_batches)
    return config


def resolve_deepspeed(
    deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None,
    deepspeed_plugins: dict[str, DeepSpeedPlugin] | None,
) -> DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None:
    """The DeepSpeed request (one plugin or a dict of named ones); the engine is chosen later."""
    if deepspeed_plugin is not None and deepspeed_plugins is not None:
        raise ValueError(
            "deepspeed_plugin and deepspeed_plugins were both passed; pass only one "
            "(deepspeed_plugins takes a dict of named plugins)."
        )
    return deepspeed_plugins if deepspeed_plugins is not None else deepspeed_plugin
