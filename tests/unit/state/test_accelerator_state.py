"""AcceleratorState: precision validation, re-initialisation rules, plugins, delegation."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from hasten.config.enums import DistributedType, DynamoBackend
from hasten.state import AcceleratorState, PartialState, is_initialized


def make(**kwargs: Any) -> AcceleratorState:
    return AcceleratorState(_from_accelerator=True, **kwargs)


class FakeDeepSpeedPlugin:
    def __init__(self, config: dict[str, Any]) -> None:
        self.deepspeed_config = config
        self.selected = False
        self.mixed_precision: str | None = None

    def set_mixed_precision(self, value: str) -> None:
        self.mixed_precision = value

    def select(self, _from_accelerator_state: bool = False) -> None:
        self.selected = True

    def _unselect(self) -> None:
        self.selected = False


def test_needs_an_accelerator_first() -> None:
    with pytest.raises(RuntimeError, match=r"create `accelerator = Accelerator\(\)`"):
        AcceleratorState()
    assert not is_initialized()


def test_wraps_partial_state() -> None:
    state = make(mixed_precision="BF16")
    partial = PartialState()
    assert is_initialized() and state.initialized
    assert state.mixed_precision == "bf16"
    assert state.device == partial.device and state.num_processes == 1
    assert state.distributed_type == DistributedType.NO
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed and state.process_index == 0 and state.backend is None
    assert AcceleratorState().mixed_precision == "bf16"  # later instances share it
    assert "Mixed precision type: bf16" in repr(state)


def test_mixed_precision_defaults_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert make().mixed_precision == "fp16"


def test_unknown_mixed_precision_lists_the_choices() -> None:
    with pytest.raises(
        ValueError,
        match=r"'fp32' \(from AcceleratorState\(mixed_precision=...\)\).*\['no', 'fp8', 'fp16', 'bf16'\]",
    ):
        make(mixed_precision="fp32")
    assert not AcceleratorState._shared_state


def test_changing_mixed_precision_later_is_an_error() -> None:
    make(mixed_precision="fp16")
    make(mixed_precision="fp16")
    AcceleratorState()
    with pytest.raises(ValueError, match=r"cannot change mixed_precision from 'fp16' to 'bf16'"):
        AcceleratorState(mixed_precision="bf16")


def test_asking_for_cpu_after_an_accelerator_is_an_error() -> None:
    state = make()
    state.device = torch.device("cuda", 0)
    with pytest.raises(ValueError, match="cannot change to the CPU"):
        AcceleratorState(cpu=True)


def test_fp8_is_kept_as_asked() -> None:
    # The backend, its package and the hardware are checked by precision.select (one place).
    assert make(mixed_precision="fp8").mixed_precision == "fp8"


def test_deepspeed_plugin_owns_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    plugin = FakeDeepSpeedPlugin({"bf16": {"enabled": True}})
    state = make(mixed_precision="bf16", deepspeed_plugin=plugin)
    assert state.distributed_type == DistributedType.DEEPSPEED
    assert PartialState().distributed_type == DistributedType.DEEPSPEED
    assert plugin.mixed_precision == "bf16" and plugin.selected
    assert state.deepspeed_plugin is plugin and state.mixed_precision == "bf16"
    plugin.deepspeed_config = {"fp16": {"enabled": True}}
    assert state.mixed_precision == "fp16"
    plugin.deepspeed_config = {}
    assert state.mixed_precision == "no"
    AcceleratorState(mixed_precision="fp16")  # DeepSpeed decides: no error
    assert "ds_config" in repr(state)
    with pytest.raises(RuntimeError, match="several named plugins"):
        state.get_deepspeed_plugin("a")


def test_named_deepspeed_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    first, second = FakeDeepSpeedPlugin({}), FakeDeepSpeedPlugin({})
    state = make(deepspeed_plugin={"first": first, "second": second})
    assert state.deepspeed_plugin is first and state.get_deepspeed_plugin("second") is second
    state.select_deepspeed_plugin("second")
    assert state.deepspeed_plugin is second and not first.selected
    with pytest.raises(KeyError, match=r"No DeepSpeed plugin named 'third'"):
        state.select_deepspeed_plugin("third")


def test_deepspeed_variable_builds_the_plugin_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import hasten.config.deepspeed as deepspeed_config

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setattr(deepspeed_config, "DeepSpeedPlugin", lambda: FakeDeepSpeedPlugin({}))
    state = make()
    assert state.engine.name == "deepspeed" and state.distributed_type == DistributedType.DEEPSPEED
    assert (
        isinstance(state.deepspeed_plugin, FakeDeepSpeedPlugin) and state.deepspeed_plugin.selected
    )


def test_plain_runs_keep_no_engine_plugins() -> None:
    with pytest.warns(UserWarning, match="the plugin is not used"):
        state = make(
            fsdp_plugin=object(),
            dynamo_plugin=types.SimpleNamespace(backend=DynamoBackend.INDUCTOR),
        )
    assert state.deepspeed_plugin is None and state.fsdp_plugin is None and not state.is_fsdp2
    assert state.dynamo_plugin.backend == DynamoBackend.INDUCTOR


def test_engine_label_change_goes_to_partial_state() -> None:
    state = make()
    fsdp = types.SimpleNamespace(fsdp_version=2)
    state.fsdp_plugin = fsdp
    state.distributed_type = DistributedType.FSDP
    assert PartialState().distributed_type == DistributedType.FSDP and state.is_fsdp2


@pytest.mark.parametrize(
    ("fsdp_plugin", "match"),
    [(None, "no fsdp_plugin was given"), (types.SimpleNamespace(fsdp_version=1), "needs FSDP2")],
)
def test_context_parallel_needs_fsdp2(fsdp_plugin: Any, match: str) -> None:
    config = types.SimpleNamespace(cp_enabled=True)
    with pytest.raises(ValueError, match=match):
        make(parallelism_config=config, fsdp_plugin=fsdp_plugin)


def test_context_parallel_standalone_is_allowed_by_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.config.parallelism import ParallelismConfig

    monkeypatch.setenv("ACCELERATE_ALLOW_CP_STANDALONE", "true")
    # past the FSDP check, the mesh check refuses context parallelism on the CPU
    with pytest.raises(ValueError, match=r"context parallelism needs a GPU"):
        make(parallelism_config=ParallelismConfig(cp_size=2))


def test_process_helpers_delegate(capsys: pytest.CaptureFixture[str]) -> None:
    state = make()
    with state.split_between_processes([1, 2]) as share:
        assert share == [1, 2]
    with state.main_process_first(), state.local_main_process_first():
        state.print("inside")
    state.wait_for_everyone()
    state.destroy_process_group()
    assert capsys.readouterr().out == "inside\n"


def test_reset_state_variants() -> None:
    state = make()
    AcceleratorState._reset_state()
    assert not is_initialized() and PartialState().initialized
    # Accelerate's sentence first (its tests match it), then hasten's fix.
    with pytest.raises(
        AttributeError,
        match=r"^`AcceleratorState` object has no attribute `device`\. This happens if "
        r"`AcceleratorState\._reset_state\(\)` was called .* Create Accelerator\(\) again",
    ):
        _ = state.device
    with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
        _ = state.nonsense
    make()
    AcceleratorState._reset_state(reset_partial_state=True)
    assert not PartialState._shared_state


def test_partial_reset_alone_is_set_up_again_by_the_next_accelerator_state() -> None:
    state = make()
    PartialState._reset_state()
    again = AcceleratorState()
    assert again.is_main_process and PartialState._shared_state
    assert again.num_processes == 1 and again.distributed_type == state.distributed_type


def test_process_helpers_work_after_accelerator_state_reset() -> None:
    # Accelerate's test_script resets AcceleratorState, then calls state.destroy_process_group()
    state = make()
    AcceleratorState._reset_state()
    assert state.is_main_process and state.is_local_main_process and not state.use_distributed
    state.wait_for_everyone()
    state.destroy_process_group()
    with pytest.raises(AttributeError, match="`AcceleratorState` object has no attribute `device`"):
        _ = state.device
