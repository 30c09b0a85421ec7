"""fp8 precision: backend choice, package and hardware checks, the torchao path on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from hasten.config.enums import FP8BackendType
from hasten.config.kwargs import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from hasten.core.imports import is_torchao_available
from hasten.precision import Precision, select_precision
from hasten.precision import fp8 as fp8_module
from hasten.precision.fp8 import Fp8Precision, fp8_backend_from_env, select_fp8
from hasten.strategies.unwrap import extract_model_from_parallel

needs_torchao = pytest.mark.skipif(not is_torchao_available(), reason="torchao is not installed")


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Pretend CUDA devices have the given compute capability."""

    def set_capability(major: int, minor: int) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))

    return set_capability


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Pretend exactly the given fp8 backends are installed."""

    def set_installed(*backends: FP8BackendType) -> None:
        for backend in (FP8BackendType.AO, FP8BackendType.TE, FP8BackendType.MSAMP):
            present = backend in backends
            monkeypatch.setitem(fp8_module._AVAILABLE, backend, lambda present=present: present)

    return set_installed


def test_cpu_is_refused_naming_the_hardware_and_bf16(installed) -> None:  # type: ignore[no-untyped-def]
    installed(FP8BackendType.AO)
    with pytest.raises(ValueError, match=r"compute capability 8\.9\+.*H100/H200") as info:
        select_fp8("cpu")
    assert "device type 'cpu'" in str(info.value)
    assert "mixed_precision='bf16'" in str(info.value)


def test_older_gpu_is_refused(installed, fake_gpu) -> None:  # type: ignore[no-untyped-def]
    installed(FP8BackendType.AO)
    fake_gpu(8, 0)
    with pytest.raises(ValueError, match=r"a CUDA GPU of compute capability 8\.0"):
        select_fp8("cuda:0")


def test_hopper_gets_the_installed_backend_torchao_first(installed, fake_gpu) -> None:  # type: ignore[no-untyped-def]
    installed(FP8BackendType.AO, FP8BackendType.TE, FP8BackendType.MSAMP)
    fake_gpu(9, 0)
    precision = select_fp8("cuda:0")
    assert isinstance(precision, Fp8Precision)
    assert precision.backend is FP8BackendType.AO
    assert precision.mixed_precision == "fp8" and precision.native_amp
    assert precision.dtype is torch.bfloat16
    installed(FP8BackendType.TE, FP8BackendType.MSAMP)
    assert select_fp8("cuda:0").backend is FP8BackendType.TE
    installed(FP8BackendType.MSAMP)
    assert select_fp8("cuda:0").backend is FP8BackendType.MSAMP


def test_no_backend_installed_names_the_extra(installed) -> None:  # type: ignore[no-untyped-def]
    installed()
    with pytest.raises(ImportError, match=r"none is installed.*pip install 'hasten\[fp8\]'"):
        select_fp8("cpu")


@pytest.mark.parametrize(
    ("recipe", "extra"),
    [
        (lambda: AORecipeKwargs(), r"hasten\[fp8\]"),
        (lambda: TERecipeKwargs(), r"hasten\[transformer_engine\]"),
        (lambda: MSAMPRecipeKwargs(), "MS-AMP from source"),
    ],
)
def test_recipe_backend_not_installed(installed, recipe, extra: str) -> None:  # type: ignore[no-untyped-def]
    installed()
    with pytest.raises(ImportError, match=extra):
        select_fp8("cpu", recipe())


def test_selected_backend_not_installed(installed, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    installed(FP8BackendType.AO)
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    with pytest.raises(ImportError, match=r"TE backend needs its package.*transformer_engine"):
        select_fp8("cpu")


def test_recipe_for_another_backend_than_selected(
    installed, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    installed(FP8BackendType.AO, FP8BackendType.TE)
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "AO")
    with pytest.raises(ValueError, match=r"TERecipeKwargs \(a recipe for the TE fp8 backend\).*AO"):
        select_fp8("cpu", TERecipeKwargs())


def test_fp8_recipe_kwargs_backend_choice(installed, fake_gpu) -> None:  # type: ignore[no-untyped-def]
    installed(FP8BackendType.TE, FP8BackendType.MSAMP)
    fake_gpu(9, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        te = FP8RecipeKwargs(backend="te")
        msamp = FP8RecipeKwargs(backend="MSAMP", opt_level="O1")
    assert select_fp8("cuda", te).backend is FP8BackendType.TE
    assert select_fp8("cuda", msamp).backend is FP8BackendType.MSAMP


def test_backend_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fp8_backend_from_env() is FP8BackendType.NO
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "ao")
    assert fp8_backend_from_env() is FP8BackendType.AO
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "fast")
    with pytest.raises(ValueError, match=r"'FAST' is not an fp8 backend.*--fp8_backend"):
        fp8_backend_from_env()


def test_recipe_without_fp8_is_refused() -> None:
    with pytest.raises(ValueError, match=r"AORecipeKwargs.*mixed_precision is 'bf16'"):
        select_precision("bf16", "cpu", fp8_recipe=AORecipeKwargs())


def test_base_precision_prepares_nothing_together() -> None:
    objects = [nn.Linear(2, 2), 3]
    assert Precision().prepare_together(objects) is objects


def test_msamp_needs_one_model_with_one_optimizer() -> None:
    precision = Fp8Precision(FP8BackendType.MSAMP, MSAMPRecipeKwargs(), "cuda")
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"2 model\(s\) and 1 optimizer\(s\)"):
        precision.prepare_together([a, b, opt])
    loader = [1, 2]
    assert precision.prepare_together([loader]) == [loader]


@needs_torchao
def test_torchao_policy_converts_autocasts_and_unwraps() -> None:
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 4))
    precision = Fp8Precision(FP8BackendType.AO, AORecipeKwargs(), "cpu")
    precision.wrap_forward(model)
    assert isinstance(model[1], Float8Linear) and isinstance(model[2], Float8Linear)
    assert type(model[0]) is nn.Linear and type(model[3]) is nn.Linear
    out = model(torch.randn(8, 16))
    assert out.dtype is torch.float32  # autocast outputs are returned in fp32
    layer = model[1]
    precision.convert_module(model)  # already converted: left as it is
    assert model[1] is layer
    extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in model.__dict__
