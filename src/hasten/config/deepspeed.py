"""DeepSpeedPlugin: the user's DeepSpeed request and the DeepSpeed JSON config it resolves to.

Pure data: nothing here imports deepspeed. The config is built from the plugin's fields (or
read from the user's file/dict, with the fields filling its "auto" values) so the DeepSpeed
engine receives one consistent dict.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hasten.config import envvars
from hasten.core.imports import is_deepspeed_available, is_transformers_available, require

__all__ = ["DeepSpeedPlugin", "HfDeepSpeedConfig"]

_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
_ZERO_STAGES = (0, 1, 2, 3)

# Plugin field -> dotted key in the DeepSpeed config.
_FIELD_TO_CONFIG_KEY = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}

# Launch settings that a DeepSpeed config file overrides; setting both is refused.
_FILE_OWNED_SETTINGS = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
    "mixed_precision",
)


def _looks_like_path(text: str) -> bool:
    stripped = text.strip()
    return not stripped.startswith("{") and (
        stripped.endswith((".json", ".hjson")) or "/" in stripped or "\\" in stripped
    )


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(
            f"DeepSpeed config file {str(path)!r} is not valid JSON ({exc}); fix the file or "
            "pass the config as a dict"
        ) from None
    if not isinstance(loaded, dict):
        raise ValueError(
            f"DeepSpeed config file {str(path)!r} holds a {type(loaded).__name__}, not a JSON "
            'object; it must look like {"zero_optimization": {"stage": 2}, ...}'
        )
    return loaded


def _load_config(source: str | Path) -> dict[str, Any]:
    path = Path(source)
    try:
        if path.is_file():
            return _read_config_file(path)
    except OSError:
        pass  # a long JSON/base64 string is not a path; fall through
    text = str(source)
    for decode in (lambda t: t, lambda t: base64.urlsafe_b64decode(t).decode("utf-8")):
        try:
            loaded = json.loads(decode(text))
        except (ValueError, UnicodeDecodeError, binascii.Error):
            continue
        if isinstance(loaded, dict):
            return loaded
    if isinstance(source, Path) or _looks_like_path(text):
        raise ValueError(
            f"DeepSpeed config file {text!r} does not exist; check the path (relative paths "
            "start from the working directory), or pass the config as a dict"
        )
    raise ValueError(
        f"DeepSpeed config {text[:80]!r} is neither an existing JSON file, a JSON object string "
        "nor base64-encoded JSON; pass a path, a dict or an HfDeepSpeedConfig"
    )


class HfDeepSpeedConfig:
    """A DeepSpeed config dict with quick queries (ZeRO stage, offload, dotted-key lookups).

    Args:
        config_file_or_dict: a dict (copied), a path to a JSON file, a JSON string or
            base64-encoded JSON.
    """

    def __init__(self, config_file_or_dict: dict[str, Any] | str | Path) -> None:
        if isinstance(config_file_or_dict, dict):
            self.config: dict[str, Any] = copy.deepcopy(config_file_or_dict)
        else:
            self.config = _load_config(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Re-read the ZeRO stage and whether anything is offloaded (after edits)."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        devices = {
            self.get_value("zero_optimization.offload_optimizer.device"),
            self.get_value("zero_optimization.offload_param.device"),
        }
        self._offload = self._stage in (2, 3) and bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """Return (the dict holding the last part of `ds_key_long`, that last key)."""
        *parents, key = ds_key_long.split(".")
        node: Any = self.config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, key
        return (node if isinstance(node, dict) else None), key

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """Return the value at dotted key `ds_key_long`, or `default`."""
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Delete the entry at `ds_key_long`.

        Raises:
            ValueError: it does not exist and `must_exist` is True.
        """
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(f"DeepSpeed config has no entry {ds_key_long!r} to delete")
            return
        del node[key]

    def is_true(self, ds_key_long: str) -> bool:
        """Return True only if the value is set and truthy."""
        value = self.get_value(ds_key_long)
        return value is not None and bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """Return True only if the value is set and falsy."""
        value = self.get_value(ds_key_long)
        return value is not None and not bool(value)

    def is_zero2(self) -> bool:
        """Whether ZeRO stage 2 is configured."""
        return bool(self._stage == 2)

    def is_zero3(self) -> bool:
        """Whether ZeRO stage 3 is configured."""
        return bool(self._stage == 3)

    def is_offload(self) -> bool:
        """Whether ZeRO 2/3 offloads optimizer states or parameters to cpu/nvme."""
        return self._offload


@dataclasses.dataclass
class DeepSpeedPlugin:
    """What the user wants from DeepSpeed; unset fields come from ACCELERATE_DEEPSPEED_*.

    Args:
        hf_ds_config: DeepSpeed config: path, dict, JSON/base64 string or HfDeepSpeedConfig.
        gradient_accumulation_steps: steps to accumulate ("auto" = the Accelerator's value).
        gradient_clipping: gradient clipping value ("auto" = from the Accelerator).
        zero_stage: ZeRO stage 0, 1, 2 or 3.
        is_train_batch_min: with train and eval loaders, take train_batch_size from the smaller.
        offload_optimizer_device: none, cpu or nvme (ZeRO 2 and 3).
        offload_param_device: none, cpu or nvme (ZeRO 3).
        offload_optimizer_nvme_path: NVMe path for optimizer offload.
        offload_param_nvme_path: NVMe path for parameter offload.
        zero3_init_flag: build models already sharded (ZeRO 3 only).
        zero3_save_16bit_model: gather a 16-bit model when saving (ZeRO 3).
        transformer_moe_cls_names: comma list of MoE layer class names (leaf modules).
        enable_msamp: use MS-AMP for fp8 (default: ACCELERATE_FP8_BACKEND is MSAMP).
        msamp_opt_level: MS-AMP optimization level, "O1" or "O2".
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int = None  # type: ignore[assignment]
    gradient_clipping: float = None  # type: ignore[assignment]
    zero_stage: int = None  # type: ignore[assignment]
    is_train_batch_min: bool = True
    offload_optimizer_device: str = None  # type: ignore[assignment]
    offload_param_device: str = None  # type: ignore[assignment]
    offload_optimizer_nvme_path: str = None  # type: ignore[assignment]
    offload_param_nvme_path: str = None  # type: ignore[assignment]
    zero3_init_flag: bool = None  # type: ignore[assignment]
    zero3_save_16bit_model: bool = None  # type: ignore[assignment]
    transformer_moe_cls_names: str = None  # type: ignore[assignment]
    enable_msamp: bool = None  # type: ignore[assignment]
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        self._fill_from_environment()
        self._validate_fields()
        source = self.hf_ds_config
        if isinstance(source, (dict, HfDeepSpeedConfig, Path)) or (
            isinstance(source, str) and source != "none"
        ):
            self._adopt_user_config(source)
        else:
            self.hf_ds_config = HfDeepSpeedConfig(self._config_from_fields())
        self.deepspeed_config: dict[str, Any] = self.hf_ds_config.config
        # DeepSpeed prints a line every `steps_per_print` steps; keep stdout for the user.
        self.deepspeed_config["steps_per_print"] = float("inf")
        if self.zero3_init_flag is None:
            self.zero3_init_flag = envvars.read_flag(
                "ACCELERATE_DEEPSPEED_ZERO3_INIT", self.hf_ds_config.is_zero3()
            )
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            warnings.warn(
                "DeepSpeedPlugin(zero3_init_flag=True) only applies to ZeRO stage 3; it was set "
                "to False",
                UserWarning,
                stacklevel=3,
            )
            self.zero3_init_flag = False
        if self.enable_msamp is None:
            self.enable_msamp = envvars.setting("ACCELERATE_FP8_BACKEND") == "MSAMP"
        if self.msamp_opt_level is None:
            self.msamp_opt_level = envvars.read("ACCELERATE_FP8_OPT_LEVEL", "O1")
        if self.msamp_opt_level not in ("O1", "O2"):
            raise ValueError(
                f"DeepSpeedPlugin(msamp_opt_level={self.msamp_opt_level!r}) must be 'O1' or 'O2'"
            )
        self.dschf: Any = None
        self._selected = False

    def _fill_from_environment(self) -> None:
        if self.gradient_accumulation_steps is None:
            steps = envvars.read("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "auto") or "auto"
            self.gradient_accumulation_steps = int(steps) if steps.isdigit() else steps
        if self.gradient_clipping is None:
            clip = envvars.read("ACCELERATE_GRADIENT_CLIPPING", "auto") or "auto"
            self.gradient_clipping = clip if clip == "auto" else float(clip)
        defaults = {
            "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
            "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
            "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
            "offload_optimizer_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
            "offload_param_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
            "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
            "transformer_moe_cls_names": "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
        }
        for name, variable in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, envvars.setting(variable))
        if self.hf_ds_config is None:
            self.hf_ds_config = envvars.read("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")

    def _validate_fields(self) -> None:
        if self.zero_stage not in _ZERO_STAGES or isinstance(self.zero_stage, bool):
            raise ValueError(
                f"DeepSpeedPlugin(zero_stage={self.zero_stage!r}) must be one of {_ZERO_STAGES}"
            )
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if str(value).lower() not in _OFFLOAD_DEVICES:
                raise ValueError(
                    f"DeepSpeedPlugin({name}={value!r}) must be one of {list(_OFFLOAD_DEVICES)}"
                )
            setattr(self, name, str(value).lower())
        steps = self.gradient_accumulation_steps
        if steps != "auto" and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(
                f"DeepSpeedPlugin(gradient_accumulation_steps={steps!r}) must be an int >= 1 or "
                "'auto'"
            )

    def _adopt_user_config(self, source: Any) -> None:
        if not isinstance(source, HfDeepSpeedConfig):
            source = HfDeepSpeedConfig(source)
        self.hf_ds_config = source
        config = source.config
        config.setdefault("gradient_accumulation_steps", 1)
        if "zero_optimization" not in config:
            raise ValueError(
                "The DeepSpeed config has no 'zero_optimization' section; add one, e.g. "
                '{"zero_optimization": {"stage": 2}}'
            )
        self._deepspeed_config_checks()
        values = {
            key: getattr(self, name)
            for name, key in _FIELD_TO_CONFIG_KEY.items()
            if getattr(self, name) is not None
        }
        for key in values:
            self.fill_match(key, must_match=False, **values)
        source.set_stage_and_offload()
        for name, key in _FIELD_TO_CONFIG_KEY.items():
            value = source.get_value(key)
            if value is not None and value != "auto":
                setattr(self, name, value)

    def _config_from_fields(self) -> dict[str, Any]:
        def offload(device: str, path: str) -> dict[str, Any]:
            return {"device": device, "nvme_path": path if device == "nvme" else None}

        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": {
                "stage": self.zero_stage,
                "offload_optimizer": offload(
                    self.offload_optimizer_device, self.offload_optimizer_nvme_path
                ),
                "offload_param": offload(self.offload_param_device, self.offload_param_nvme_path),
                "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
            },
        }
        if self.gradient_clipping:
            config["gradient_clipping"] = self.gradient_clipping
        return config

    def _deepspeed_config_checks(self) -> None:
        from_launcher = envvars.parse_csv(envvars.read("ACCELERATE_CONFIG_DS_FIELDS", "") or "")
        clashing = [name for name in from_launcher if name in _FILE_OWNED_SETTINGS]
        if clashing:
            raise ValueError(
                f"Both a DeepSpeed config file and the launch settings {clashing} were given; "
                f"with a config file, set {list(_FILE_OWNED_SETTINGS)} in that file (or to "
                "'auto') and remove them from the hasten config/launch flags"
            )

    def fill_match(
        self,
        ds_key_long: str,
        mismatches: list[str] | None = None,
        must_match: bool = True,
        **kwargs: Any,
    ) -> None:
        """Fill an "auto" value at `ds_key_long` from kwargs, or record a mismatch with them.

        Raises:
            ValueError: the value is "auto" but kwargs do not provide it.
        """
        mismatches = [] if mismatches is None else mismatches
        node, key = self.hf_ds_config.find_config_node(ds_key_long)
        if node is None:
            return
        if node.get(key) == "auto":
            if ds_key_long not in kwargs:
                raise ValueError(
                    f"DeepSpeed config value {ds_key_long!r} is 'auto' but hasten has no value "
                    "for it; set it explicitly in the DeepSpeed config or pass it"
                )
            node[key] = kwargs[ds_key_long]
            return
        known = must_match and node.get(key) is not None and ds_key_long in kwargs
        if known and node[key] != kwargs[ds_key_long]:
            mismatches.append(
                f"- ds {ds_key_long}={node[key]!r} vs hasten {ds_key_long}={kwargs[ds_key_long]!r}"
            )

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the config value at `ds_key_long` is "auto"."""
        return bool(self.hf_ds_config.get_value(ds_key_long) == "auto")

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """Return the config value at dotted key `ds_key_long`, or `default`."""
        return self.hf_ds_config.get_value(ds_key_long, default)

    def deepspeed_config_process(
        self,
        prefix: str = "",
        mismatches: list[str] | None = None,
        config: dict[str, Any] | None = None,
        must_match: bool = True,
        **kwargs: Any,
    ) -> None:
        """Fill every "auto" value of the config from kwargs (dotted keys) and check the rest.

        Raises:
            ValueError: a non-"auto" value disagrees with kwargs (all mismatches are listed),
                or an "auto" value has no counterpart in kwargs.
        """
        mismatches = [] if mismatches is None else mismatches
        config = self.deepspeed_config if config is None else config
        for key, value in config.items():
            if isinstance(value, dict):
                self.deepspeed_config_process(
                    prefix=f"{prefix}{key}.",
                    mismatches=mismatches,
                    config=value,
                    must_match=must_match,
                    **kwargs,
                )
            else:
                self.fill_match(prefix + key, mismatches, must_match=must_match, **kwargs)
        if mismatches and prefix == "":
            listed = "\n".join(mismatches)
            raise ValueError(
                f"These DeepSpeed config values disagree with hasten's:\n{listed}\nSet them to "
                "'auto' in the DeepSpeed config so hasten fills them in"
            )

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Enable fp16 or bf16 (fp8 uses bf16) in the DeepSpeed config.

        Raises:
            ValueError: the config file already enables the other half-precision type.
        """
        config = self.deepspeed_config
        if mixed_precision == "fp16":
            config.setdefault("fp16", {"enabled": True, "auto_cast": True})
        elif mixed_precision in ("bf16", "fp8"):
            config.setdefault("bf16", {"enabled": True})
        if mixed_precision == "fp8" and self.enable_msamp:
            config.setdefault("msamp", {"enabled": True, "opt_level": self.msamp_opt_level})
        if mixed_precision != "no":
            other = "bf16" if mixed_precision == "fp16" else "fp16"
            if str(config.get(other, {}).get("enabled", "false")).lower() == "true":
                raise ValueError(
                    f"mixed_precision={mixed_precision!r} conflicts with the DeepSpeed config, "
                    f"which enables {other}; change one of them"
                )
        for dtype in ("fp16", "bf16"):
            config.setdefault(dtype, {"enabled": False})
        flags: dict[str, Any] = {
            "fp16.enabled": mixed_precision == "fp16",
            "bf16.enabled": mixed_precision in ("bf16", "fp8"),
        }
        self.fill_match("fp16.enabled", must_match=False, **flags)
        self.fill_match("bf16.enabled", must_match=False, **flags)

    def set_deepspeed_weakref(self) -> None:
        """Register this config with transformers so `from_pretrained` sees ZeRO-3 settings."""
        # transformers' HfDeepSpeedConfig itself needs deepspeed; without both there is nothing
        # to register, which only matters when ZeRO-3 init was asked for.
        if not (is_transformers_available() and is_deepspeed_available()):
            if self.zero3_init_flag:
                require("transformers", feature="DeepSpeedPlugin(zero3_init_flag=True)")
                require(
                    "deepspeed", feature="DeepSpeedPlugin(zero3_init_flag=True)", extra="deepspeed"
                )
            return
        # optional: transformers
        integrations = require(
            "transformers.integrations.deepspeed",
            feature="DeepSpeed ZeRO-3 init",
            pip_name="transformers",
        )
        if not self.zero3_init_flag:
            # as Accelerate: transformers builds models whole (no zero.Init) unless asked
            integrations.unset_hf_deepspeed_config()
            return
        config = copy.deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if config.get(key, "auto") == "auto":
                config[key] = 1
        if config.get("train_batch_size") == "auto":
            del config["train_batch_size"]
        integrations.unset_hf_deepspeed_config()
        # transformers' own HfDeepSpeedConfig needs the `accelerate` package; its ZeRO-3 checks
        # only read `is_zero3()` and `.config` through this weak reference, which ours provides.
        self.dschf = HfDeepSpeedConfig(config)  # kept alive here: transformers holds a weakref
        integrations.set_hf_deepspeed_config(self.dschf)

    def is_zero3_init_enabled(self) -> bool:
        """Whether models are built already sharded (ZeRO-3 init)."""
        return bool(self.zero3_init_flag)

    @contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Temporarily turn ZeRO-3 init on or off."""
        old = self.zero3_init_flag
        if old == enable:
            yield
            return
        self.zero3_init_flag = enable
        self.dschf = None
        self.set_deepspeed_weakref()
        try:
            yield
        finally:
            self.zero3_init_flag = old
            self.dschf = None
            self.set_deepspeed_weakref()

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this plugin the active one (called by `AcceleratorState.select_deepspeed_plugin`).

        Raises:
            ValueError: called directly instead of through the accelerator state.
        """
        if not _from_accelerator_state:
            raise ValueError(
                "A DeepSpeedPlugin is activated through the accelerator state; call "
                "AcceleratorState().select_deepspeed_plugin(name) instead of plugin.select()"
            )
        self.set_deepspeed_weakref()
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False

    @property
    def selected(self) -> bool:
        """Whether this plugin is the active one."""
        return self._selected
