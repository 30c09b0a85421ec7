"""FSDP settings the engine cannot honour raise with the reason and the fix (no process group)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy

from _support.fsdp_models import TinyTransformer
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.precision import Precision
from hasten.strategies.composable import ComposableStrategy
from hasten.strategies.fsdp1 import FSDP1Strategy
from hasten.strategies.fsdp_plugin import (
    ignored_modules,
    modules_to_shard,
    resolve_offload,
    wrap_settings,
)
from hasten.strategies.parallelize import apply_ac

CPU = torch.device("cpu")


def test_unknown_wrap_class_names_the_classes_the_model_has() -> None:
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["GPT2Block"],
    )
    with pytest.raises(ValueError, match=r"'GPT2Block'.*classes present: \['Block', 'LayerNorm'"):
        modules_to_shard(wrap_settings(plugin), TinyTransformer(), [])


def test_wrap_policies_pick_blocks() -> None:
    model = TinyTransformer()
    by_class = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap"
    )
    policy = by_class.auto_wrap_policy
    assert (
        modules_to_shard(wrap_settings(by_class), model, []) == list(model.layers)[::-1]
    )  # _no_split_modules
    assert by_class.auto_wrap_policy is policy  # the plugin is read, never bound or copied
    by_size = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="size_based_wrap", min_num_params=500
    )
    assert all(
        sum(p.numel() for p in m.parameters()) >= 500
        for m in modules_to_shard(wrap_settings(by_size), model, [])
    )
    assert (
        modules_to_shard(
            wrap_settings(
                FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="no_wrap")
            ),
            model,
            [],
        )
        == []
    )
    picked = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy=lambda module, recurse, nonwrapped_numel: module is model.head,
    )
    assert modules_to_shard(wrap_settings(picked), model, []) == [model.head]


def test_pinned_cpu_offload_without_an_accelerator() -> None:
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator: pinning works")
    explicit = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=CPUOffloadPolicy())
    with pytest.raises(
        ValueError, match=r"pin_memory=True\) needs an accelerator.*pin_memory=False"
    ):
        resolve_offload(explicit)
    with pytest.raises(ValueError, match="needs an accelerator"):
        ComposableStrategy(explicit, CPU).check_usable()
    requested = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=True)
    policy = resolve_offload(requested)
    assert isinstance(policy, CPUOffloadPolicy) and not policy.pin_memory
    unpinned = FullyShardedDataParallelPlugin(
        fsdp_version=2, cpu_offload=CPUOffloadPolicy(pin_memory=False)
    )
    assert resolve_offload(unpinned) is unpinned.cpu_offload


def test_version_specific_options() -> None:
    with pytest.raises(ValueError, match="forward_prefetch=True.*not implemented by FSDP2"):
        FullyShardedDataParallelPlugin(fsdp_version=2, forward_prefetch=True)
    with pytest.raises(
        ValueError, match="activation_checkpointing_offload=True.*needs fsdp_version=2"
    ):
        FullyShardedDataParallelPlugin(
            fsdp_version=1, activation_checkpointing=True, activation_checkpointing_offload=True
        )
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT.*not supported by FSDP2"):
        FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="LOCAL_STATE_DICT")


def test_fsdp1_refuses_what_cpu_cannot_do() -> None:
    offload = FullyShardedDataParallelPlugin(fsdp_version=1, cpu_offload=True)
    with pytest.raises(ValueError, match="cannot offload parameters when it computes on the CPU"):
        FSDP1Strategy(offload, CPU).check_usable()
    with pytest.warns(UserWarning, match="cpu_ram_efficient_loading needs sync_module_states"):
        efficient = FullyShardedDataParallelPlugin(fsdp_version=1, cpu_ram_efficient_loading=True)
    with pytest.raises(ValueError, match="sync_module_states=True.*fails on a CPU-only run"):
        FSDP1Strategy(efficient, CPU).check_usable()
    assert not FSDP1Strategy(FullyShardedDataParallelPlugin(fsdp_version=1), CPU).full_offload


def test_activation_checkpointing_needs_blocks() -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="no_wrap")
    with pytest.raises(ValueError, match="needs blocks to checkpoint"):
        apply_ac(TinyTransformer(), wrap_settings(plugin))


def test_ignored_modules_by_regex() -> None:
    model = TinyTransformer()
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, ignored_modules="head")
    assert ignored_modules(plugin.ignored_modules, model) == [model.head]
    given = FullyShardedDataParallelPlugin(fsdp_version=2, ignored_modules=[model.embed])
    assert ignored_modules(given.ignored_modules, model) == [model.embed]  # modules, as they are
    with pytest.raises(ValueError, match="matches no module name"):
        ignored_modules(
            FullyShardedDataParallelPlugin(fsdp_version=2, ignored_modules="nope").ignored_modules,
            model,
        )


def test_fp16_scalers() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    v1 = FSDP1Strategy(FullyShardedDataParallelPlugin(fsdp_version=1), CPU)
    assert isinstance(v1.select_precision("fp16", CPU, None, None).scaler, ShardedGradScaler)
    v2 = ComposableStrategy(FullyShardedDataParallelPlugin(fsdp_version=2), CPU)
    scaler = v2.select_precision("fp16", CPU, None, None).scaler
    assert type(scaler) is torch.amp.GradScaler  # DTensor gradients: torch's plain scaler


def test_a_meta_model_needs_cpu_ram_efficient_loading() -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=False)
    with torch.device("meta"):
        model = TinyTransformer()
    with pytest.raises(ValueError, match=r"on the meta device.*cpu_ram_efficient_loading=True"):
        ComposableStrategy(plugin, CPU).shard(model, CPU, precision=Precision("no"))


def test_fsdp1_flat_parameters_take_only_an_optimizer_over_the_whole_model() -> None:
    from hasten.strategies.fsdp1 import _onto_flat_parameters

    model, flat = TinyTransformer(), torch.nn.Linear(2, 2)  # ``flat`` stands for the wrapped one
    originals = [list(model.parameters())]
    whole = torch.optim.SGD(model.parameters(), lr=0.1)
    _onto_flat_parameters(whole, originals, [flat])
    assert whole.param_groups[0]["params"] == list(flat.parameters())
    for optimizer in (
        torch.optim.SGD(model.head.parameters(), lr=0.1),  # part of the model
        torch.optim.SGD(
            [{"params": model.head.parameters()}, {"params": model.embed.parameters()}], lr=0.1
        ),
    ):
        with pytest.raises(ValueError, match=r"parameter group\(s\).*use_orig_params=True"):
            _onto_flat_parameters(optimizer, originals, [flat])


def test_fsdp1_misuse_is_named() -> None:
    from hasten.strategies.fsdp1 import _checkpoint_blocks

    strategy = FSDP1Strategy(FullyShardedDataParallelPlugin(fsdp_version=1), CPU)
    with pytest.raises(ValueError, match=r"clips a prepared model's parameters"):
        strategy.clip_grad_norm_(TinyTransformer().parameters(), 1.0)
    no_wrap = FullyShardedDataParallelPlugin(fsdp_version=1, auto_wrap_policy="no_wrap")
    model = TinyTransformer()
    with pytest.raises(ValueError, match=r"needs the layer classes.*transformer_cls_names_to_wrap"):
        _checkpoint_blocks(no_wrap, model, model)


def test_fsdp2_activation_checkpointing_offload_off_the_cpu_is_refused() -> None:
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, activation_checkpointing=True, activation_checkpointing_offload=True
    )
    ComposableStrategy(plugin, CPU).check_usable()  # activations are in host memory already
    with pytest.raises(ValueError, match=r"activation_checkpointing_offload is not wired"):
        ComposableStrategy(plugin, torch.device("cuda", 0)).check_usable()
