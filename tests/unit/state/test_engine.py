"""resolve_engine: the one engine decision (plugins, ACCELERATE_USE_* variables, run label)."""

from __future__ import annotations

import types

import pytest

from hasten.config.enums import DistributedType
from hasten.state.engine import EngineChoice, resolve_engine

FSDP2 = types.SimpleNamespace(fsdp_version=2)
FSDP1 = types.SimpleNamespace(fsdp_version=1)


def test_fsdp_upgrades_data_parallel_runs_including_cpu() -> None:
    for base in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU):
        choice = resolve_engine(base, cpu=False, fsdp_plugin=FSDP2)
        assert choice.name == "fsdp" and choice.distributed_type == DistributedType.FSDP
        assert choice.is_fsdp2 and choice.fsdp_version == 2
    assert resolve_engine(DistributedType.MULTI_CPU, cpu=True, fsdp_plugin=FSDP1).fsdp_version == 1


def test_single_process_and_plain_runs_have_no_engine() -> None:
    with pytest.warns(UserWarning, match=r"single process without a process group.*hasten launch"):
        choice = resolve_engine(DistributedType.NO, cpu=False, fsdp_plugin=FSDP2)
    assert choice.name == "none" and choice.requested == ("fsdp",) and not choice.is_fsdp2
    plain = resolve_engine(DistributedType.MULTI_GPU, cpu=False)
    assert plain == EngineChoice("none", DistributedType.MULTI_GPU)


def test_deepspeed_and_megatron_labels() -> None:
    gpu = DistributedType.MULTI_GPU
    assert resolve_engine(gpu, cpu=False, deepspeed_plugin=object()).name == "deepspeed"
    # on CPU too: hasten runs DeepSpeed over gloo rather than silently training plain DDP
    assert resolve_engine(gpu, cpu=True, deepspeed_plugin=object()).name == "deepspeed"
    cpu_run = resolve_engine(DistributedType.MULTI_CPU, cpu=True, deepspeed_plugin=object())
    assert cpu_run.distributed_type == DistributedType.DEEPSPEED
    megatron = resolve_engine(gpu, cpu=False, megatron_lm_plugin=object())
    assert megatron.distributed_type == DistributedType.MEGATRON_LM
    # Asked for explicitly, Megatron-LM is the engine anywhere (it refuses at prepare without
    # CUDA), never silently dropped.
    for base in (DistributedType.MULTI_XPU, DistributedType.MULTI_CPU, DistributedType.NO):
        assert resolve_engine(base, cpu=True, megatron_lm_plugin=object()).name == "megatron_lm"


@pytest.mark.parametrize("other", ["deepspeed_plugin", "fsdp_plugin"])
def test_megatron_with_fsdp_or_deepspeed_is_an_error(other: str) -> None:
    engine = "DeepSpeed" if other == "deepspeed_plugin" else "FSDP"
    with pytest.raises(ValueError, match=rf"Megatron-LM plugin and an? {engine} plugin"):
        resolve_engine(
            DistributedType.MULTI_GPU, cpu=False, megatron_lm_plugin=object(), **{other: FSDP2}
        )
    assert resolve_engine(DistributedType.XLA, cpu=False, fsdp_plugin=FSDP2).name == "xla"


def test_fsdp_and_deepspeed_together_is_an_error() -> None:
    with pytest.raises(ValueError, match="Both an FSDP plugin and a DeepSpeed plugin"):
        resolve_engine(
            DistributedType.MULTI_GPU, cpu=False, deepspeed_plugin=object(), fsdp_plugin=FSDP2
        )


def test_use_fsdp_variable_builds_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    choice = resolve_engine(DistributedType.MULTI_CPU, cpu=True)
    assert choice.name == "fsdp" and choice.is_fsdp2


def test_relabel_keeps_plugins() -> None:
    choice = EngineChoice("none", DistributedType.MULTI_GPU, fsdp_plugin=FSDP2)
    assert choice.relabel(DistributedType.FSDP).is_fsdp2
    assert choice.relabel(DistributedType.XLA).name == "xla"
