"""Kwargs handlers: to_kwargs() semantics, validation errors, comm-hook wiring, profiler build."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
import torch

from hasten.config import handler
from hasten.config import kwargs as kw
from hasten.config.enums import DDPCommunicationHookType
from hasten.config.kwargs import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
)


def test_to_kwargs_returns_only_changed_fields() -> None:
    assert AutocastKwargs().to_kwargs() == {}
    assert AutocastKwargs(enabled=False).to_kwargs() == {"enabled": False}
    assert GradScalerKwargs(init_scale=1024.0, growth_interval=10).to_kwargs() == {
        "init_scale": 1024.0,
        "growth_interval": 10,
    }
    # A value equal to the default is not "changed".
    assert GradScalerKwargs(backoff_factor=0.5).to_kwargs() == {}


def test_to_kwargs_ignores_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert InitProcessGroupKwargs(backend="gloo").to_kwargs() == {"backend": "gloo"}


def test_class_defaults_are_computed_once_per_class() -> None:
    handler._DEFAULTS.pop(AutocastKwargs, None)
    AutocastKwargs(enabled=False).to_kwargs()
    cached = handler._DEFAULTS[AutocastKwargs]
    AutocastKwargs(cache_enabled=True).to_kwargs()
    assert handler._DEFAULTS[AutocastKwargs] is cached


def test_to_kwargs_handles_default_factory_and_required_fields() -> None:
    @dataclasses.dataclass
    class Custom(KwargsHandler):
        required: int
        items: list[int] = dataclasses.field(default_factory=list)

    assert Custom(required=3).to_kwargs() == {"required": 3}
    assert Custom(required=3, items=[1]).to_kwargs() == {"required": 3, "items": [1]}
    assert Custom(required=1).to_dict() == {"required": 1, "items": []}


def test_ddp_kwargs_forward_only_ddp_arguments() -> None:
    handler = DistributedDataParallelKwargs(
        find_unused_parameters=True, comm_hook="power_sgd", comm_state_option={"warm_start": False}
    )
    assert handler.to_kwargs() == {"find_unused_parameters": True}
    assert "comm_hook" not in handler.to_dict()
    assert handler.comm_hook is DDPCommunicationHookType.POWER_SGD


def test_ddp_kwargs_to_kwargs_builds_a_real_ddp_signature() -> None:
    import inspect

    params = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    assert set(DistributedDataParallelKwargs().to_dict()) <= set(params)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"comm_hook": "gzip"}, r"comm_hook='gzip'.*use one of \['no', 'fp16'"),
        ({"comm_hook": "power_sgd", "comm_wrapper": "power_sgd"}, r"is not a wrapper"),
        ({"comm_wrapper": "fp16"}, r"comm_hook is 'no'"),
        ({"comm_hook": "fp16", "comm_state_option": {"a": 1}}, r"only used by the power_sgd"),
        (
            {"comm_hook": "power_sgd", "comm_state_option": {"rank": 1}},
            r"unknown keys \['rank'\].*matrix_approximation_rank",
        ),
    ],
)
def test_ddp_kwargs_reject_bad_hook_settings(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DistributedDataParallelKwargs(**options)


def test_register_comm_hook_needs_a_ddp_model() -> None:
    with pytest.raises(TypeError, match="needs a torch.nn.parallel.DistributedDataParallel"):
        DistributedDataParallelKwargs(comm_hook="fp16").register_comm_hook(torch.nn.Linear(1, 1))  # type: ignore[arg-type]


def test_register_comm_hook_without_hook_is_a_no_op() -> None:
    # No hook: nothing is called, so any object is accepted.
    DistributedDataParallelKwargs().register_comm_hook(object())  # type: ignore[arg-type]


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[object, object]] = []

    def register_comm_hook(self, state: object, hook: object) -> None:
        self.calls.append((state, hook))


@pytest.mark.parametrize(
    ("options", "hook_name", "powersgd_state"),
    [
        ({"comm_hook": "fp16"}, "fp16_compress_hook", False),
        ({"comm_hook": "power_sgd"}, "powerSGD_hook", True),
        ({"comm_hook": "batched_power_sgd"}, "batched_powerSGD_hook", True),
        ({"comm_hook": "power_sgd", "comm_wrapper": "fp16"}, "fp16_compress_wrapper_hook", True),
    ],
)
def test_register_comm_hook_picks_hook_and_state(
    options: dict, hook_name: str, powersgd_state: bool
) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    model = _Recorder()
    DistributedDataParallelKwargs(**options).register_comm_hook(model)  # type: ignore[arg-type]
    ((state, hook),) = model.calls
    assert getattr(hook, "__name__", "") == hook_name
    assert isinstance(state, PowerSGDState) is powersgd_state


def test_comm_state_option_reaches_power_sgd_state() -> None:
    model = _Recorder()
    DistributedDataParallelKwargs(
        comm_hook="power_sgd", comm_state_option={"matrix_approximation_rank": 3}
    ).register_comm_hook(model)  # type: ignore[arg-type]
    state = model.calls[0][0]
    assert state.matrix_approximation_rank == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"init_scale": 0.0}, r"init_scale=0.0\) must be > 0"),
        ({"growth_factor": 1.0}, r"growth_factor=1.0\) must be > 1.0"),
        ({"backoff_factor": 1.5}, r"backoff_factor=1.5\) must be in \(0, 1\)"),
        ({"growth_interval": 0}, r"growth_interval=0\) must be >= 1"),
    ],
)
def test_grad_scaler_kwargs_validate(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GradScalerKwargs(**options)


def test_grad_scaler_kwargs_build_a_grad_scaler() -> None:
    scaler = torch.amp.GradScaler("cpu", **GradScalerKwargs(init_scale=8.0).to_kwargs())
    assert scaler.get_scale() == 8.0


def test_init_process_group_kwargs_documented_defaults() -> None:
    handler = InitProcessGroupKwargs()
    assert (handler.backend, handler.init_method, handler.timeout) == ("nccl", None, None)
    assert InitProcessGroupKwargs(timeout=timedelta(seconds=800)).to_kwargs() == {
        "timeout": timedelta(seconds=800)
    }


def test_init_process_group_kwargs_validate_timeout() -> None:
    with pytest.raises(TypeError, match=r"timeout=30\) must be a datetime.timedelta"):
        InitProcessGroupKwargs(timeout=30)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be positive"):
        InitProcessGroupKwargs(timeout=timedelta(0))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"activities": ["cpu", "tpu"]},
            r"'tpu'.*use any of \['cpu', 'xpu', 'mtia', 'cuda', 'hpu'\]",
        ),
        ({"schedule_option": {"wait": 1, "warmup": 1}}, r"missing \['active'\]"),
        ({"schedule_option": {"wait": 1, "warmup": 1, "active": 1, "x": 2}}, r"unknown \['x'\]"),
    ],
)
def test_profile_kwargs_validate(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ProfileKwargs(**options)


def _work() -> None:
    a = torch.randn(32, 32)
    for _ in range(3):
        a = a @ a.T / 32


def test_profile_kwargs_build_records_and_exports_chrome_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    handler = ProfileKwargs(
        activities=["cpu"], record_shapes=True, output_trace_dir=str(tmp_path / "t")
    )
    profiler = handler.build()
    assert isinstance(profiler, torch.profiler.profile)
    with profiler:
        _work()
    assert any("mm" in event.key for event in profiler.key_averages())
    path = handler.export_trace(profiler, process_index=1)
    assert path == tmp_path / "t" / "profile_1.json"
    assert "traceEvents" in json.loads(path.read_text())


def test_profile_kwargs_without_trace_dir_exports_nothing() -> None:
    handler = ProfileKwargs()
    assert handler.trace_path(0) is None
    assert handler.export_trace(handler.build()) is None


def test_profile_kwargs_schedule_and_on_trace_ready() -> None:
    ready: list[int] = []
    handler = ProfileKwargs(
        activities=["cpu"],
        schedule_option={"wait": 1, "warmup": 1, "active": 1, "repeat": 1},
        on_trace_ready=lambda prof: ready.append(prof.step_num),
    )
    with handler.build() as profiler:
        for _ in range(4):
            _work()
            profiler.step()
    assert ready == [3]


def test_profile_kwargs_maps_activity_names() -> None:
    handler = ProfileKwargs(activities=["cpu", "cuda"])
    assert handler._torch_activities() == [
        torch.profiler.ProfilerActivity.CPU,
        torch.profiler.ProfilerActivity.CUDA,
    ]
    assert ProfileKwargs()._torch_activities() is None


# --- fp8 recipe kwargs ---------------------------------------------------------------------


@pytest.fixture
def _no_fp8_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.config.envvars import read_prefixed

    for name in read_prefixed("ACCELERATE_FP8_"):
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("_no_fp8_env")
def test_te_recipe_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = kw.TERecipeKwargs()
    assert (recipe.margin, recipe.interval, recipe.fp8_format) == (0, 1, "HYBRID")
    assert (recipe.amax_history_len, recipe.amax_compute_algo) == (1024, "most_recent")
    assert recipe.override_linear_precision == (False, False, False)
    assert recipe.to_kwargs() == {}  # env-table defaults count as defaults
    monkeypatch.setenv("ACCELERATE_FP8_MARGIN", "3")
    monkeypatch.setenv("ACCELERATE_FP8_FORMAT", "e4m3")
    monkeypatch.setenv("ACCELERATE_FP8_OVERRIDE_DGRAD", "true")
    recipe = kw.TERecipeKwargs()
    assert recipe.to_kwargs() == {
        "margin": 3,
        "fp8_format": "E4M3",
        "override_linear_precision": (False, True, False),
    }


@pytest.mark.usefixtures("_no_fp8_env")
@pytest.mark.parametrize(
    ("cls", "options", "match"),
    [
        (
            "TERecipeKwargs",
            {"fp8_format": "E3M4"},
            r"fp8_format='E3M4'\) must be one of \['HYBRID'",
        ),
        ("TERecipeKwargs", {"amax_compute_algo": "mean"}, r"amax_compute_algo='mean'\)"),
        ("TERecipeKwargs", {"override_linear_precision": (True,)}, r"must be three booleans"),
        (
            "MSAMPRecipeKwargs",
            {"opt_level": "O3"},
            r"opt_level='O3'\) must be one of \['O1', 'O2'\]",
        ),
    ],
)
def test_fp8_recipe_validation(cls: str, options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        getattr(kw, cls)(**options)


@pytest.mark.usefixtures("_no_fp8_env")
def test_msamp_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kw.MSAMPRecipeKwargs().opt_level == "O2"
    assert kw.MSAMPRecipeKwargs(opt_level="o1").to_kwargs() == {"opt_level": "O1"}
    monkeypatch.setenv("ACCELERATE_FP8_OPT_LEVEL", "O1")
    assert kw.MSAMPRecipeKwargs().opt_level == "O1"


@pytest.mark.usefixtures("_no_fp8_env")
def test_ao_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = kw.AORecipeKwargs()
    assert (recipe.pad_inner_dim, recipe.enable_fsdp_float8_all_gather) == (True, True)
    monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", "false")
    assert kw.AORecipeKwargs().to_kwargs() == {"pad_inner_dim": False}
    sentinel = object()
    assert kw.AORecipeKwargs(config=sentinel).build_config() is sentinel


@pytest.mark.usefixtures("_no_fp8_env")
def test_ao_recipe_build_config_needs_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.core import imports

    if imports.is_torchao_available():
        pytest.skip("torchao is installed")
    with pytest.raises(
        ImportError, match=r"AORecipeKwargs requires 'torchao.float8'.*pip install 'torchao'"
    ):
        kw.AORecipeKwargs().build_config()


@pytest.mark.usefixtures("_no_fp8_env")
def test_fp8_recipe_kwargs_is_deprecated_and_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(FutureWarning, match="FP8RecipeKwargs is deprecated"):
        recipe = kw.FP8RecipeKwargs(backend="te", margin=1)
    assert (recipe.backend, recipe.margin, recipe.opt_level) == ("TE", 1, "O2")
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "msamp")
    with pytest.warns(FutureWarning):
        assert kw.FP8RecipeKwargs().backend == "MSAMP"
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ValueError, match=r"backend='AO'\) must be 'MSAMP' or 'TE'"),
    ):
        kw.FP8RecipeKwargs(backend="ao")


def test_bf16_hook_on_a_cpu_build_explains_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    model = _Recorder()
    for options in ({"comm_hook": "bf16"}, {"comm_hook": "power_sgd", "comm_wrapper": "bf16"}):
        with pytest.raises(RuntimeError, match=r"needs bf16 all-reduce.*Use comm_hook='fp16'"):
            DistributedDataParallelKwargs(**options).register_comm_hook(model)  # type: ignore[arg-type]
    assert model.calls == []
