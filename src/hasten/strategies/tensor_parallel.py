"""Tensor-parallel plans: shard a model's layers over the ``tp`` mesh from its plan.

A model carries its plan the transformers way, as ``tp_plan`` / ``_tp_plan``: a mapping of
module-name patterns (``*`` matches one name segment, e.g. ``"layers.*.mlp.up"``) to styles
("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence_parallel") or to torch
`ParallelStyle` objects. hasten resolves the patterns once, checks that every size divides, and
hands the result to torch's ``parallelize_module``. Models that already hold DTensor parameters
(transformers' ``from_pretrained(tp_plan="auto")``) are accepted unchanged.

Parameters the plan leaves alone stay plain tensors: they are copied from the group's first
process once, and every process of the group computes the same gradients for them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hasten.core.constants import BETA_TP_AVAILABLE_TRANSFORMERS_VERSION
from hasten.core.versions import compare_versions
from hasten.strategies.unwrap import extract_model_from_parallel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "TP_STYLES",
    "apply_tp_plan",
    "clip_mixed_grad_norm_",
    "find_tp_plan",
    "full_tensors",
    "get_model_tp_size",
    "model_has_dtensor",
    "resolve_tp_plan",
    "shard_by_plan",
]

#: Style names hasten understands (the transformers spelling) and what each does.
TP_STYLES = {
    "colwise": "shard the output features; the output stays sharded",
    "rowwise": "shard the input features (embeddings: the vocabulary); the output is all-reduced",
    "colwise_rep": "shard the output features, then gather the output on every process",
    "rowwise_rep": "take a replicated input, shard the input features; the output is all-reduced",
    "sequence_parallel": (
        "norms/dropout on activations sharded along the sequence dimension; the layers around "
        "it must produce and take sequence-sharded tensors (e.g. RowwiseParallel("
        "output_layouts=Shard(1)) objects in the plan)"
    ),
}


def model_has_dtensor(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a DTensor (sharded by tensor parallelism or FSDP2)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def get_model_tp_size(model: nn.Module) -> int | None:
    """The tensor-parallel degree ``model`` was sharded with, or None when it was not."""
    from torch.distributed.tensor import DTensor

    model = extract_model_from_parallel(model)
    size = getattr(model, "_tp_size", None) or getattr(model, "tp_size", None)
    if size is None:
        # transformers >= 5 keeps it in the config's distributed_config (a dict after JSON)
        config = getattr(getattr(model, "config", None), "distributed_config", None)
        size = (
            config.get("tp_size") if isinstance(config, dict) else getattr(config, "tp_size", None)
        )
    if isinstance(size, int) and size > 1:
        return size
    for param in model.parameters():
        if isinstance(param, DTensor):
            names = param.device_mesh.mesh_dim_names or ()
            if "tp" in names:
                return int(param.device_mesh["tp"].size())
            if len(names) <= 1:
                return int(param.device_mesh.size())
    return None


def find_tp_plan(model: nn.Module) -> Mapping[str, Any] | None:
    """The model's plan: ``tp_plan`` (transformers' property, or a user attribute), else ``_tp_plan``."""
    for attribute in ("tp_plan", "_tp_plan"):
        try:
            plan = getattr(model, attribute, None)
        except (AttributeError, RuntimeError):  # some properties need a distributed setup
            plan = None
        if plan:
            return dict(plan)
    return None


def _pattern(key: str) -> re.Pattern[str]:
    return re.compile(
        "\\.".join("[^.]+" if part == "*" else re.escape(part) for part in key.split("."))
    )


def _style(name: str, value: Any, module: nn.Module) -> Any:
    """The torch `ParallelStyle` for plan entry ``value`` on ``module``."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        SequenceParallel,
    )

    if isinstance(value, ParallelStyle):
        return value
    embedding = isinstance(module, nn.Embedding)
    styles: dict[str, Callable[[], ParallelStyle]] = {
        "colwise": ColwiseParallel,
        # an embedding's input is token ids: replicated, never sharded
        "rowwise": lambda: (
            RowwiseParallel(input_layouts=Replicate()) if embedding else RowwiseParallel()
        ),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": SequenceParallel,
    }
    if value not in styles:
        raise ValueError(
            f"tp_plan[{name!r}] = {value!r} is not a tensor-parallel style hasten applies; use one "
            f"of {sorted(styles)} or a torch.distributed.tensor.parallel.ParallelStyle object"
        )
    return styles[value]()


def _sharded_dim(module: nn.Module, style: str) -> tuple[str, int] | None:
    """The (attribute, size) a named style splits on ``module``, or None when it splits none."""
    colwise = style.startswith("colwise")
    if isinstance(module, nn.Linear) and style in (
        "colwise",
        "colwise_rep",
        "rowwise",
        "rowwise_rep",
    ):
        return (
            ("out_features", module.out_features)
            if colwise
            else ("in_features", module.in_features)
        )
    if isinstance(module, nn.Embedding) and style in (
        "colwise",
        "colwise_rep",
        "rowwise",
        "rowwise_rep",
    ):
        if colwise:
            return "embedding_dim", module.embedding_dim
        return "num_embeddings", module.num_embeddings
    return None


def _check_divides(name: str, module: nn.Module, value: Any, tp_size: int) -> None:
    """Sharded dimensions must split evenly over the tensor-parallel processes."""
    found = _sharded_dim(module, value) if isinstance(value, str) else None
    if found is None or found[1] % tp_size == 0:
        return
    dim, size = found
    raise ValueError(
        f"tp_plan[{name!r}] = {value!r} shards {type(module).__name__}.{dim} = {size} "
        f"over tp_size={tp_size}, which does not divide it; pick a tp_size that divides "
        f"{size} (e.g. {math.gcd(size, tp_size)}) or leave this module out of the plan"
    )


def resolve_tp_plan(model: nn.Module, plan: Mapping[str, Any], tp_size: int) -> dict[str, Any]:
    """Resolve ``plan``'s patterns to concrete module names with torch styles.

    Raises:
        ValueError: a pattern matches no module (all such patterns are named), a style is
            unknown, or a sharded size is not divisible by ``tp_size``.
    """
    modules = dict(model.named_modules())
    resolved: dict[str, Any] = {}
    missing: list[str] = []
    for key, value in plan.items():
        pattern = _pattern(key)
        matches = [name for name in modules if name and pattern.fullmatch(name)]
        if not matches:
            missing.append(key)
        for name in matches:
            _check_divides(name, modules[name], value, tp_size)
            resolved[name] = _style(name, value, modules[name])
    if missing:
        sample = [name for name in modules if name][:12]
        raise ValueError(
            f"The tensor-parallel plan names modules {type(model).__name__} does not have: "
            f"{missing}. Its modules include {sample}; fix the plan's keys (module paths, with "
            "'*' for one name segment such as a layer index)."
        )
    return resolved


def _sync_plain_tensors(model: nn.Module, mesh: DeviceMesh) -> None:
    """Copy unsharded parameters and buffers from the group's first process (done once)."""
    from torch.distributed.tensor import DTensor

    group = mesh.get_group()
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if not isinstance(tensor, DTensor):
                dist.broadcast(tensor.data, group_src=0, group=group)


def apply_tp_plan(
    model: nn.Module, mesh: DeviceMesh, plan: Mapping[str, Any] | None = None
) -> nn.Module:
    """Shard ``model`` in place over the 1-D ``mesh`` from ``plan`` (default: the model's own).

    Raises:
        ValueError: the model has no plan, or the plan does not fit it (see `resolve_tp_plan`).
    """
    from torch.distributed.tensor.parallel import parallelize_module

    plan = find_tp_plan(model) if plan is None else plan
    tp_size = int(mesh.size())
    if not plan:
        raise ValueError(
            f"ParallelismConfig(tp_size={tp_size}) needs a tensor-parallel plan, but "
            f"{type(model).__name__} has no `tp_plan` / `_tp_plan`. Give the model one, e.g. "
            "model.tp_plan = {'layers.*.up': 'colwise', 'layers.*.down': 'rowwise'}; or load a "
            "transformers model with from_pretrained(..., tp_plan='auto'); or set tp_size=1."
        )
    resolved = resolve_tp_plan(model, plan, tp_size)
    parallelize_module(model, mesh, resolved)
    _sync_plain_tensors(model, mesh)
    return model


def _is_transformers_model(model: nn.Module) -> bool:
    return any(cls.__module__.startswith("transformers.") for cls in type(model).__mro__)


def shard_by_plan(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Apply ``model``'s plan over ``tp_mesh``, or accept it unchanged when it is already sharded.

    Raises:
        ImportError: a transformers model with a transformers too old for tensor parallelism.
        ValueError: a pre-sharded model's tensor-parallel degree differs from the mesh's, or
            the plan does not fit the model (see `apply_tp_plan`).
    """
    tp_size = int(tp_mesh.size())
    if _is_transformers_model(model) and not compare_versions(
        "transformers", ">=", BETA_TP_AVAILABLE_TRANSFORMERS_VERSION
    ):
        raise ImportError(
            "Tensor parallelism of transformers models needs transformers >= "
            f"{BETA_TP_AVAILABLE_TRANSFORMERS_VERSION}; pip install -U transformers"
        )
    if model_has_dtensor(model):
        size = get_model_tp_size(model)
        if size is not None and size != tp_size:
            raise ValueError(
                f"The model was already sharded with tensor-parallel degree {size}, but "
                f"ParallelismConfig has tp_size={tp_size}; make them equal"
            )
        return model
    return apply_tp_plan(model, tp_mesh)


def full_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """Replace each DTensor of ``state`` by the full tensor (a collective: every process calls)."""
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}


def clip_mixed_grad_norm_(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """`clip_grad_norm_` over gradients on different meshes, or plain (torch refuses to mix them).

    Gradients are grouped by mesh (plain tensors form one group); each group's norm is reduced
    over its mesh, the groups' norms are combined into the global norm, and every gradient is
    scaled by the same factor. Returns the global norm (before clipping) as a plain tensor.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    groups: dict[Any, list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return torch.tensor(0.0)
    stacked = torch.stack([n.to(norms[0].device) for n in norms])
    total = stacked.max() if math.isinf(norm_type) else stacked.norm(norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for grad in grads:
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.mul_(coef.to(local.device, local.dtype))
    return total
