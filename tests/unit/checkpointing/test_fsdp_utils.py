"""Accelerate's FSDP helpers (`hasten.utils.fsdp_utils`) that need no process group."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from _support.fsdp_models import TinyTransformer
from hasten.config import envvars
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.utils.fsdp_utils import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_canonicalize_names,
    fsdp2_prepare_auto_wrap_policy,
    fsdp2_switch_optimizer_parameters,
    get_parameters_from_modules,
)


def test_ram_efficient_loading_switches() -> None:
    envvars.remove("ACCELERATE_USE_FSDP")
    enable_fsdp_ram_efficient_loading()
    assert envvars.setting("FSDP_CPU_RAM_EFFICIENT_LOADING") is True
    # transformers' from_pretrained loads on meta off rank 0 only when FSDP is on too
    assert envvars.setting("ACCELERATE_USE_FSDP") is True
    disable_fsdp_ram_efficient_loading()
    assert envvars.setting("FSDP_CPU_RAM_EFFICIENT_LOADING") is False
    assert envvars.setting("ACCELERATE_USE_FSDP") is True


def test_enabling_ram_efficient_loading_keeps_an_explicit_fsdp_switch() -> None:
    envvars.write("ACCELERATE_USE_FSDP", "false")
    enable_fsdp_ram_efficient_loading()
    assert envvars.setting("ACCELERATE_USE_FSDP") is False


def test_canonicalize_and_switch_parameters() -> None:
    names = {"layers.0._checkpoint_wrapped_module.up.weight": 1, "_orig_mod.head.bias": 2}
    assert fsdp2_canonicalize_names(names) == {"layers.0.up.weight": 1, "head.bias": 2}
    old, new = nn.Linear(2, 2), nn.Linear(2, 2)
    optimizer = torch.optim.SGD(old.parameters(), lr=0.1)
    mapping = {p.data_ptr(): q for p, q in zip(old.parameters(), new.parameters())}
    fsdp2_switch_optimizer_parameters(optimizer, mapping)
    assert optimizer.param_groups[0]["params"] == list(new.parameters())
    with pytest.raises(KeyError, match="No new parameter"):
        fsdp2_switch_optimizer_parameters(torch.optim.SGD(old.parameters(), lr=0.1), {})


def test_auto_wrap_policy_and_parameters_from_modules() -> None:
    model = TinyTransformer()
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap"
    )
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert policy is not None and policy(model.layers[0]) and not policy(model.head)
    none = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="no_wrap")
    assert fsdp2_prepare_auto_wrap_policy(none, model) is None
    found = get_parameters_from_modules("head", model, "cpu")
    assert found == set(model.head.parameters())


def test_ensure_weights_retied() -> None:
    model = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    model[1].weight = model[0].weight

    def reinit(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            module.weight = nn.Parameter(torch.zeros(3, 3))

    init = ensure_weights_retied(reinit, model, torch.device("cpu"))
    init(model[1])
    assert model[1].weight is model[0].weight


def test_helpers_refuse_what_they_cannot_do(tmp_path: Any) -> None:
    from types import SimpleNamespace

    from hasten.utils.fsdp_utils import fsdp2_prepare_model, save_fsdp_model

    cpu = torch.device("cpu")
    plain = SimpleNamespace(strategy=None, device=cpu, state=SimpleNamespace(fsdp_plugin=None))
    model = TinyTransformer()
    with pytest.raises(ValueError, match=r"needs an FSDP run: pass the FullyShardedDataParallel"):
        save_fsdp_model(None, plain, model, tmp_path)
    # adapter_only is about PEFT models (Trainer passes True for every model, as Accelerate
    # allows): for another model it changes nothing, so the error is the missing plugin's.
    with pytest.raises(ValueError, match=r"needs an FSDP run"):
        save_fsdp_model(None, plain, model, tmp_path, adapter_only=True)
    peft = pytest.importorskip("peft", reason="peft is not installed")
    lora = peft.get_peft_model(TinyTransformer(), peft.LoraConfig(target_modules=["head"]))
    with pytest.raises(ValueError, match=r"adapter_only=True for a PEFT model.*adapter_only=False"):
        save_fsdp_model(None, plain, lora, tmp_path, adapter_only=True)
    sharded = FullyShardedDataParallelPlugin(fsdp_version=2)
    with pytest.raises(ValueError, match=r"SHARDED_STATE_DICT is written with .*use_dcp=True"):
        save_fsdp_model(sharded, plain, model, tmp_path, use_dcp=False)
    local = FullyShardedDataParallelPlugin(fsdp_version=1, state_dict_type="LOCAL_STATE_DICT")
    with pytest.raises(ValueError, match=r"not wrapped by FSDP1 \(TinyTransformer\)"):
        save_fsdp_model(local, plain, model, tmp_path)
    v1 = SimpleNamespace(strategy=None, device=cpu, state=SimpleNamespace(fsdp_plugin=local))
    with pytest.raises(ValueError, match=r"fsdp2_prepare_model needs fsdp_version=2"):
        fsdp2_prepare_model(v1, model)
