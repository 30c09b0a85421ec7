"""core.imports: cached availability checks and require()."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest

from hasten.core import imports
from hasten.core.imports import is_package_available, require


def test_installed_and_missing_packages() -> None:
    assert is_package_available("numpy") is True
    assert is_package_available("hasten_surely_missing_pkg") is False


def test_min_version_is_checked() -> None:
    assert is_package_available("numpy", "1.0") is True
    assert is_package_available("numpy", "999.0") is False


def test_answers_are_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    is_package_available.cache_clear()
    calls: list[str] = []
    real = importlib.util.find_spec

    def counting(name: str, *args: object) -> object:
        calls.append(name)
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(imports.importlib.util, "find_spec", counting)
    is_package_available("packaging")
    is_package_available("packaging")
    assert calls == ["packaging"]
    is_package_available.cache_clear()


def test_broken_spec_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    is_package_available.cache_clear()

    def broken(name: str, *args: object) -> object:
        raise ValueError("__spec__ is None")

    monkeypatch.setattr(imports.importlib.util, "find_spec", broken)
    assert is_package_available("anything_at_all") is False
    is_package_available.cache_clear()


def test_module_without_metadata_uses_dunder_version(monkeypatch: pytest.MonkeyPatch) -> None:
    is_package_available.cache_clear()
    module = types.ModuleType("hasten_fake_vendored")
    module.__version__ = "2.5.0"  # type: ignore[attr-defined]
    module.__spec__ = importlib.util.spec_from_loader("hasten_fake_vendored", loader=None)
    monkeypatch.setitem(sys.modules, "hasten_fake_vendored", module)
    assert is_package_available("hasten_fake_vendored", "2.0") is True
    assert is_package_available("hasten_fake_vendored", "3.0") is False
    is_package_available.cache_clear()


def test_require_returns_the_module() -> None:
    import numpy

    assert require("numpy", feature="arrays") is numpy


def test_require_missing_names_the_pip_command() -> None:
    with pytest.raises(
        ImportError,
        match=r"the X tracker requires 'hasten_nope_pkg'.*not installed.*pip install 'hasten-nope-pkg'",
    ):
        require("hasten_nope_pkg", feature="the X tracker")


def test_require_prefers_the_extra_and_pip_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "_editable_checkout", lambda: None)  # installed from the index
    with pytest.raises(ImportError, match=r"pip install 'hasten\[bnb\]'"):
        require("hasten_nope_pkg", feature="bnb", extra="bnb")
    with pytest.raises(ImportError, match=r"pip install 'real-name>=1.2'"):
        require("hasten_nope_pkg", feature="f", pip_name="real-name", min_version="1.2")


@pytest.mark.parametrize(
    ("origin", "command"),
    [
        (None, "pip install 'hasten[bnb]'"),  # from the package index
        ("/src/hasten", "pip install -e '/src/hasten[bnb]'"),  # an editable checkout
        (
            "",
            "pip install 'bitsandbytes'",
        ),  # a source tree on the path: the index has no such hasten
    ],
)
def test_install_command_follows_how_hasten_was_installed(
    monkeypatch: pytest.MonkeyPatch, origin: str | None, command: str
) -> None:
    monkeypatch.setattr(imports, "_editable_checkout", lambda: origin)
    assert imports.install_command("bitsandbytes", "bnb") == command
    assert imports.install_command("bitsandbytes") == "pip install 'bitsandbytes'"


def test_editable_checkout_reads_this_install() -> None:
    import importlib.metadata

    imports._editable_checkout.cache_clear()
    try:
        dist = importlib.metadata.distribution("hasten")
    except importlib.metadata.PackageNotFoundError:
        assert imports._editable_checkout() == ""
        return
    text = dist.read_text("direct_url.json")
    if text is None:
        assert imports._editable_checkout() is None
    else:
        assert imports._editable_checkout() in ("", json.loads(text)["url"].removeprefix("file://"))


def test_require_too_old_says_installed_version() -> None:
    import numpy

    with pytest.raises(
        ImportError, match=rf"\(>= 999 needed\).*installed at version {numpy.__version__}"
    ):
        require("numpy", feature="future numpy", min_version="999")


@pytest.mark.parametrize(
    ("checker", "package"),
    [
        ("is_aim_available", "aim"),
        ("is_bitsandbytes_available", "bitsandbytes"),
        ("is_boto3_available", "boto3"),
        ("is_clearml_available", "clearml"),
        ("is_comet_ml_available", "comet_ml"),
        ("is_datasets_available", "datasets"),
        ("is_deepspeed_available", "deepspeed"),
        ("is_dvclive_available", "dvclive"),
        ("is_matplotlib_available", "matplotlib"),
        ("is_mlflow_available", "mlflow"),
        ("is_msamp_available", "msamp"),
        ("is_pandas_available", "pandas"),
        ("is_peft_available", "peft"),
        ("is_pynvml_available", "pynvml"),
        ("is_pytest_available", "pytest"),
        ("is_safetensors_available", "safetensors"),
        ("is_sagemaker_available", "sagemaker"),
        ("is_schedulefree_available", "schedulefree"),
        ("is_swanlab_available", "swanlab"),
        ("is_timm_available", "timm"),
        ("is_torchdata_available", "torchdata"),
        ("is_torchvision_available", "torchvision"),
        ("is_tqdm_available", "tqdm"),
        ("is_trackio_available", "trackio"),
        ("is_transformer_engine_available", "transformer_engine"),
        ("is_transformers_available", "transformers"),
        ("is_triton_available", "triton"),
        ("is_wandb_available", "wandb"),
    ],
)
def test_each_checker_follows_find_spec(
    monkeypatch: pytest.MonkeyPatch, checker: str, package: str
) -> None:
    present = {package}
    monkeypatch.setattr(imports, "_available", lambda name, min_version=None: name in present)
    assert getattr(imports, checker)() is True
    present.clear()
    assert getattr(imports, checker)() is False


def test_checkers_agree_with_reality_for_installed_packages() -> None:
    assert imports.is_safetensors_available() is True
    assert imports.is_pytest_available() is True
    assert imports.is_numpy_available() is True
    assert imports.is_numpy_available("999") is False


def test_min_version_checkers(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(
        imports,
        "_available",
        lambda name, min_version=None: asked.append((name, min_version)) or True,
    )
    imports.is_aim_available()
    imports.is_torchao_available()
    imports.is_torchdata_stateful_dataloader_available()
    imports.is_bnb_available("0.40")
    assert asked == [
        ("aim", "3.0.0"),
        ("torchao", "0.6.1"),
        ("torchdata", "0.8.0"),
        ("bitsandbytes", "0.40"),
    ]


def test_tensorboard_accepts_tensorboardx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        imports, "_available", lambda name, min_version=None: name == "tensorboardX"
    )
    assert imports.is_tensorboard_available() is True


def test_megatron_needs_distribution_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "_available", lambda name, min_version=None: True)
    monkeypatch.setattr(imports, "_installed_version", lambda name: None)
    assert imports.is_megatron_lm_available() is False
    monkeypatch.setattr(imports, "_installed_version", lambda name: "0.9.0")
    assert imports.is_megatron_lm_available() is True


def test_rich_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "_available", lambda name, min_version=None: True)
    monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    assert imports.is_rich_available() is False
    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", "1")
    assert imports.is_rich_available() is True
    monkeypatch.setattr(imports, "_available", lambda name, min_version=None: False)
    assert imports.is_rich_available() is False


def test_importing_the_module_imports_no_optional_package() -> None:
    code = (
        "import sys, hasten.core.imports as m; m.is_wandb_available(); m.is_matplotlib_available();"
        "print(sorted(n for n in ('wandb','matplotlib','numpy','yaml') if n in sys.modules))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_module_without_metadata_or_version_fails_a_min_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    is_package_available.cache_clear()
    module = types.ModuleType("hasten_fake_unversioned")
    module.__spec__ = importlib.util.spec_from_loader("hasten_fake_unversioned", loader=None)
    monkeypatch.setitem(sys.modules, "hasten_fake_unversioned", module)
    assert is_package_available("hasten_fake_unversioned") is True
    assert is_package_available("hasten_fake_unversioned", "1.0") is False
    is_package_available.cache_clear()


def test_bnb_feature_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(
        imports,
        "_available",
        lambda name, min_version=None: asked.append((name, min_version)) or True,
    )
    assert imports.is_4bit_bnb_available() and imports.is_8bit_bnb_available()
    assert imports.is_amdsmi_available() and imports.is_lomo_available()
    assert imports.is_import_timer_available()
    assert asked == [
        ("bitsandbytes", "0.39.0"),
        ("bitsandbytes", "0.37.2"),
        ("amdsmi", None),
        ("lomo_optim", None),
        ("import_timer", None),
    ]


def test_fp8_available_means_any_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    present: set[str] = set()
    monkeypatch.setattr(imports, "_available", lambda name, min_version=None: name in present)
    assert imports.is_fp8_available() is False
    present.add("torchao")
    assert imports.is_fp8_available() is True


def test_torch_feature_checks() -> None:
    import torch.distributed

    assert imports.is_torch_distributed_available() is torch.distributed.is_available()
    assert imports.is_pippy_available() is True  # torch >= 2.4 is a hard requirement
    assert imports.is_weights_only_available() is True


def test_required_decorators(monkeypatch: pytest.MonkeyPatch) -> None:
    @imports.deepspeed_required
    def engine(x: int) -> int:
        """Doc kept."""
        return x + 1

    @imports.torchao_required
    def quantize() -> str:
        return "ok"

    assert engine.__doc__ == "Doc kept."
    monkeypatch.setattr(imports, "_editable_checkout", lambda: None)
    monkeypatch.setattr(imports, "is_package_available", lambda name, min_version=None: False)
    with pytest.raises(
        ImportError,
        match=r"test_required_decorators.<locals>.engine\(\) requires 'deepspeed'.*hasten\[deepspeed\]",
    ):
        engine(1)
    with pytest.raises(ImportError, match=r"requires 'torchao'.*pip install 'hasten\[fp8\]'"):
        quantize()
    monkeypatch.setattr(imports, "is_package_available", lambda name, min_version=None: True)
    monkeypatch.setattr(imports.importlib, "import_module", lambda name: types.ModuleType(name))
    assert engine(1) == 2
    assert quantize() == "ok"
