"""Which optional packages are installed, checked cheaply, and `require()` for using one.

Checks use `importlib.util.find_spec` plus the installed distribution metadata; they never
import the package, and each answer is cached for the life of the process.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from hasten.core.environment import parse_flag_from_env
from hasten.core.versions import compare_versions, is_torch_version

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "deepspeed_required",
    "install_command",
    "is_4bit_bnb_available",
    "is_8bit_bnb_available",
    "is_aim_available",
    "is_amdsmi_available",
    "is_bitsandbytes_available",
    "is_bitsandbytes_multi_backend_available",
    "is_bnb_available",
    "is_boto3_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_dvclive_available",
    "is_fp8_available",
    "is_import_timer_available",
    "is_lomo_available",
    "is_matplotlib_available",
    "is_megatron_lm_available",
    "is_mlflow_available",
    "is_msamp_available",
    "is_numpy_available",
    "is_package_available",
    "is_pandas_available",
    "is_peft_available",
    "is_pippy_available",
    "is_pynvml_available",
    "is_pytest_available",
    "is_rich_available",
    "is_safetensors_available",
    "is_sagemaker_available",
    "is_schedulefree_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_timm_available",
    "is_torch_distributed_available",
    "is_torchao_available",
    "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available",
    "is_tqdm_available",
    "is_trackio_available",
    "is_transformer_engine_available",
    "is_transformer_engine_mxfp8_available",
    "is_transformers_available",
    "is_triton_available",
    "is_wandb_available",
    "is_weights_only_available",
    "require",
    "torchao_required",
]

# Import name -> distribution names to look up for its version, when they differ.
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "comet_ml": ("comet_ml", "comet-ml"),
    "msamp": ("ms-amp", "msamp"),
    "pynvml": ("pynvml", "nvidia-ml-py"),
    "transformer_engine": ("transformer-engine", "transformer_engine"),
    "megatron": ("megatron-core", "megatron-lm"),
    "lomo_optim": ("lomo-optim",),
}


def _installed_version(name: str) -> str | None:
    for dist in _DISTRIBUTIONS.get(name, (name, name.replace("_", "-"))):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def is_package_available(name: str, min_version: str | None = None) -> bool:
    """Return whether package `name` can be imported (and is at least `min_version`).

    Cached: the first answer holds for the whole process. The package is not imported.

    Args:
        name: the import name, e.g. "wandb" or "comet_ml".
        min_version: optional lowest acceptable version, e.g. "0.8.0".
    """
    try:
        if importlib.util.find_spec(name) is None:
            return False
    except (ImportError, ValueError):
        # A broken or half-installed package (or a module with __spec__ None) is not usable.
        return False
    if min_version is None:
        return True
    version = _installed_version(name)
    if version is None:
        # Importable but no metadata (e.g. a vendored copy on sys.path): trust the module.
        version = getattr(importlib.import_module(name), "__version__", None)
    if version is None:
        return False
    return compare_versions(version, ">=", min_version)


@functools.cache
def _editable_checkout() -> str | None:
    """The checkout folder of an editable install of hasten; "" when not from the index; None from it."""
    try:
        dist = importlib.metadata.distribution("hasten")
    except importlib.metadata.PackageNotFoundError:
        return ""  # imported from a source tree on the path: no distribution to add an extra to
    text = dist.read_text("direct_url.json")
    if not text:
        return None  # installed from a package index
    origin = json.loads(text)
    url = str(origin.get("url", ""))
    if url.startswith("file://") and origin.get("dir_info", {}).get("editable"):
        return url.removeprefix("file://")
    return ""


def install_command(spec: str, extra: str | None = None) -> str:
    """The pip command that installs `spec`, written for how hasten itself was installed.

    From the package index the extra names it (``pip install 'hasten[bnb]'``); from an editable
    checkout the extra is added to that checkout (``pip install -e '/path[bnb]'``); otherwise (a
    source tree on the path, a wheel built locally) the index has no such hasten, so the package
    itself is named.
    """
    if extra is None:
        return f"pip install '{spec}'"
    checkout = _editable_checkout()
    if checkout is None:
        return f"pip install 'hasten[{extra}]'"
    if checkout:
        return f"pip install -e '{checkout}[{extra}]'"
    return f"pip install '{spec}'"


def require(
    package: str,
    *,
    feature: str,
    extra: str | None = None,
    pip_name: str | None = None,
    min_version: str | None = None,
) -> ModuleType:
    """Import and return optional `package`, or raise an ImportError saying how to install it.

    Args:
        package: import name of the package.
        feature: what the caller wanted to use, named in the error ("the WandB tracker").
        extra: hasten extra that installs it (`pip install hasten[extra]`), if any.
        pip_name: distribution name on PyPI when it differs from `package`.
        min_version: lowest supported version.

    Raises:
        ImportError: the package is missing or too old; the message holds the pip command.
    """
    if is_package_available(package, min_version):
        return importlib.import_module(package)
    spec = pip_name or package.replace("_", "-")
    if min_version is not None:
        spec = f"{spec}>={min_version}"
    install = install_command(spec, extra)
    found = _installed_version(package)
    state = "is not installed" if found is None else f"is installed at version {found}"
    needed = f" (>= {min_version} needed)" if min_version else ""
    raise ImportError(f"{feature} requires {package!r}{needed}, which {state}. Fix: {install}")


def _available(name: str, min_version: str | None = None) -> bool:
    return is_package_available(name, min_version)


def is_aim_available() -> bool:
    """Return whether the `aim` tracker (>= 3.0) is installed."""
    return _available("aim", "3.0.0")


def is_bnb_available(min_version: str | None = None) -> bool:
    """Return whether `bitsandbytes` is installed (at least `min_version` when given)."""
    return _available("bitsandbytes", min_version)


def is_bitsandbytes_multi_backend_available() -> bool:
    """Return whether the installed bitsandbytes was built with its multi-backend (non-CUDA) support.

    Imports bitsandbytes to read its ``features``, so only call it when about to use it.
    """
    if not is_bnb_available():
        return False
    bnb = importlib.import_module("bitsandbytes")  # optional: bitsandbytes
    return "multi_backend" in getattr(bnb, "features", set())


def is_bitsandbytes_available() -> bool:
    """Return whether `bitsandbytes` is installed."""
    return _available("bitsandbytes")


def is_boto3_available() -> bool:
    """Return whether `boto3` is installed."""
    return _available("boto3")


def is_clearml_available() -> bool:
    """Return whether `clearml` is installed."""
    return _available("clearml")


def is_comet_ml_available() -> bool:
    """Return whether `comet_ml` is installed."""
    return _available("comet_ml")


def is_datasets_available() -> bool:
    """Return whether Hugging Face `datasets` is installed."""
    return _available("datasets")


def is_deepspeed_available() -> bool:
    """Return whether `deepspeed` is installed."""
    return _available("deepspeed")


def is_dvclive_available() -> bool:
    """Return whether `dvclive` is installed."""
    return _available("dvclive")


def is_matplotlib_available() -> bool:
    """Return whether `matplotlib` is installed."""
    return _available("matplotlib")


def is_megatron_lm_available() -> bool:
    """Return whether Megatron-LM (`megatron.core`) is installed."""
    return _available("megatron") and _installed_version("megatron") is not None


def is_mlflow_available() -> bool:
    """Return whether `mlflow` (or `mlflow-skinny`) is installed."""
    return _available("mlflow")


def is_msamp_available() -> bool:
    """Return whether MS-AMP (`msamp`) is installed."""
    return _available("msamp")


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """Return whether numpy is installed at `min_version` or later."""
    return _available("numpy", min_version)


def is_pandas_available() -> bool:
    """Return whether `pandas` is installed."""
    return _available("pandas")


def is_peft_available() -> bool:
    """Return whether `peft` is installed."""
    return _available("peft")


def is_pynvml_available() -> bool:
    """Return whether `pynvml` (or `nvidia-ml-py`) is installed."""
    return _available("pynvml")


def is_pytest_available() -> bool:
    """Return whether `pytest` is installed."""
    return _available("pytest")


def is_rich_available() -> bool:
    """Return whether `rich` is installed AND enabled with ACCELERATE_ENABLE_RICH=1."""
    # Rich changes how every log line looks, so like Accelerate it is opt-in even when present.
    return _available("rich") and parse_flag_from_env("ACCELERATE_ENABLE_RICH", False)


def is_safetensors_available() -> bool:
    """Return whether `safetensors` is installed."""
    return _available("safetensors")


def is_sagemaker_available() -> bool:
    """Return whether the `sagemaker` SDK is installed."""
    return _available("sagemaker")


def is_schedulefree_available() -> bool:
    """Return whether `schedulefree` is installed."""
    return _available("schedulefree")


def is_swanlab_available() -> bool:
    """Return whether `swanlab` is installed."""
    return _available("swanlab")


def is_tensorboard_available() -> bool:
    """Return whether `tensorboard` or `tensorboardX` is installed."""
    return _available("tensorboard") or _available("tensorboardX")


def is_timm_available() -> bool:
    """Return whether `timm` is installed."""
    return _available("timm")


def is_torchao_available() -> bool:
    """Return whether `torchao` (>= 0.6.1) is installed."""
    return _available("torchao", "0.6.1")


def is_torchdata_available() -> bool:
    """Return whether `torchdata` is installed."""
    return _available("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Return whether `torchdata` >= 0.8.0 (which provides StatefulDataLoader) is installed."""
    return _available("torchdata", "0.8.0")


def is_torchvision_available() -> bool:
    """Return whether `torchvision` is installed."""
    return _available("torchvision")


def is_tqdm_available() -> bool:
    """Return whether `tqdm` is installed."""
    return _available("tqdm")


def is_trackio_available() -> bool:
    """Return whether `trackio` is installed (it needs Python >= 3.10)."""
    return sys.version_info >= (3, 10) and _available("trackio")


def is_transformer_engine_available() -> bool:
    """Return whether NVIDIA TransformerEngine (`transformer_engine`) is installed."""
    return _available("transformer_engine")


def is_transformer_engine_mxfp8_available() -> bool:
    """Return whether TransformerEngine is installed and this GPU supports its MXFP8 recipe."""
    if not is_transformer_engine_available():
        return False
    # optional: transformer_engine (asks the GPU, so only when the package is there)
    fp8 = importlib.import_module("transformer_engine.pytorch.fp8")
    return bool(fp8.check_mxfp8_support()[0])


def is_transformers_available() -> bool:
    """Return whether Hugging Face `transformers` is installed."""
    return _available("transformers")


def is_triton_available() -> bool:
    """Return whether `triton` is installed."""
    return _available("triton")


def is_wandb_available() -> bool:
    """Return whether `wandb` is installed."""
    return _available("wandb")


def is_4bit_bnb_available() -> bool:
    """Return whether bitsandbytes supports 4-bit layers (>= 0.39.0)."""
    return _available("bitsandbytes", "0.39.0")


def is_8bit_bnb_available() -> bool:
    """Return whether bitsandbytes supports 8-bit layers (>= 0.37.2)."""
    return _available("bitsandbytes", "0.37.2")


def is_amdsmi_available() -> bool:
    """Return whether AMD's `amdsmi` is installed."""
    return _available("amdsmi")


def is_fp8_available() -> bool:
    """Return whether any fp8 backend (MS-AMP, TransformerEngine, torchao) is installed."""
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()


def is_import_timer_available() -> bool:
    """Return whether `import_timer` is installed."""
    return _available("import_timer")


def is_lomo_available() -> bool:
    """Return whether `lomo_optim` is installed."""
    return _available("lomo_optim")


def is_pippy_available() -> bool:
    """Return whether pipeline parallelism (torch.distributed.pipelining, torch >= 2.4) exists."""
    return is_torch_version(">=", "2.4.0")


def is_torch_distributed_available() -> bool:
    """Return whether this torch build includes torch.distributed."""
    import torch.distributed

    return bool(torch.distributed.is_available())


def is_weights_only_available() -> bool:
    """Return whether `torch.load(weights_only=True)` is usable (torch >= 2.4)."""
    return is_torch_version(">=", "2.4.0")


def _requiring(package: str, extra: str | None) -> Callable[[F], F]:
    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            require(package, feature=f"{func.__qualname__}()", extra=extra)
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def deepspeed_required(func: F) -> F:
    """Decorate `func` so calling it without deepspeed raises an ImportError with the fix."""
    return _requiring("deepspeed", "deepspeed")(func)


def torchao_required(func: F) -> F:
    """Decorate `func` so calling it without torchao raises an ImportError with the fix."""
    return _requiring("torchao", "fp8")(func)
