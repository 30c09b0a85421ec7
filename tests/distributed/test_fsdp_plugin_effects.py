"""Each FSDP plugin field does what it says, checked on the sharded module (2 CPU processes).

One process group runs every check: FSDP2 and FSDP1 strategies prepare tiny models with one
setting each, then one Accelerator checks accumulation, clipping, unwrapping, bf16 and
Accelerate's ``fsdp2_*`` helpers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from _support.distributed import run_distributed
from _support.fsdp_models import Block, TinyTransformer, batches

pytestmark = pytest.mark.distributed

CPU = torch.device("cpu")


def _prepare(version: int, model: nn.Module | None = None, compile_fn: Any = None, **fields: Any):
    """``model`` (a seeded TinyTransformer) prepared by the strategy of a plugin of ``fields``."""
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.precision import Precision
    from hasten.strategies.call import PrepareCall
    from hasten.strategies.composable import ComposableStrategy
    from hasten.strategies.fsdp1 import FSDP1Strategy

    fields.setdefault("auto_wrap_policy", "transformer_based_wrap")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, **fields)
    strategy = (ComposableStrategy if version == 2 else FSDP1Strategy)(plugin, CPU)
    if model is None:
        torch.manual_seed(0)
        model = TinyTransformer()
    from hasten.strategies import parallelize

    compile_step = parallelize.apply_compile
    if compile_fn is not None:  # stands in for compilation, at its place in the written order
        parallelize.apply_compile = lambda module, dynamo: compile_fn(module)
    try:
        call = PrepareCall(
            objects=(model,),
            kinds=("model",),
            placements=(True,),
            device=CPU,
            precision=Precision("no"),
            whole=False,
        )
        prepared = strategy.setup(call).objects[0]
    finally:
        parallelize.apply_compile = compile_step
    return prepared, strategy


def _counting(module: nn.Module, log: list[Any], what: Any = None) -> None:
    """Log ``what(module, output)`` (or 1) at each forward of ``module``."""
    module.register_forward_hook(
        lambda mod, args, out: log.append(1 if what is None else what(mod, out))
    )


def _dtype_seen(mod: nn.Module, out: torch.Tensor) -> str:
    return f"{mod.weight.dtype}->{out.dtype}"


def _fsdp2_fields() -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule

    x = torch.randn(4, 8)
    out: dict[str, Any] = {}
    for reshard in (True, False):  # unsharded parameters kept after forward only with False
        model, _ = _prepare(2, reshard_after_forward=reshard)
        model(x)
        out[f"reshard_{reshard}"] = type(model.layers[0].up.weight).__name__
    seen: list[Any] = []
    model, _ = _prepare(
        2,
        mixed_precision_policy={
            "param_dtype": torch.bfloat16,
            "reduce_dtype": torch.float32,
            "output_dtype": torch.bfloat16,
        },
    )
    _counting(model.layers[0].up, seen, _dtype_seen)
    y = model(x)
    y.sum().backward()
    out["mixed"] = [seen, str(y.dtype), str(model.layers[0].up.weight.dtype)]
    out["mixed_grad"] = str(model.layers[0].up.weight.grad.dtype)  # reduced in fp32
    model, _ = _prepare(2, cpu_offload=True)
    offload = model._get_fsdp_state()._fsdp_param_group.offload_policy
    model(x).sum().backward()  # trains with unpinned offload on a machine without accelerator
    out["offload"] = [type(offload).__name__, offload.pin_memory]
    # activation checkpointing before compile before sharding; recomputed in backward
    order: list[Any] = []

    def compile_fn(module: nn.Module) -> nn.Module:
        from torch.distributed._composable.contract import _get_registry

        block = module.layers[0]
        order.append(["checkpoint" in (_get_registry(block) or {}), isinstance(block, FSDPModule)])
        return module

    calls: list[Any] = []
    model, _ = _prepare(2, activation_checkpointing=True, compile_fn=compile_fn)
    _counting(model.layers[0].up, calls)
    model(x).sum().backward()
    out["checkpointing"] = [order, len(calls)]
    model, _ = _prepare(2, ignored_modules="head")
    out["ignored"] = (
        sorted({type(p).__name__ for p in model.head.parameters()}),
        type(model.embed.weight).__name__,
    )
    for policy, extra in (
        ("transformer_based_wrap", {}),
        ("size_based_wrap", {"min_num_params": 1000}),
        ("no_wrap", {}),
    ):
        model, _ = _prepare(2, auto_wrap_policy=policy, **extra)
        out[policy] = sorted(n for n, m in model.named_modules() if isinstance(m, FSDPModule))
    picked, _ = _prepare(2, auto_wrap_policy=lambda module, recurse, nonwrapped_numel: False)
    out["callable"] = [n for n, m in picked.named_modules() if isinstance(m, FSDPModule)]
    return out


def _fsdp1_fields() -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    x = torch.randn(4, 8)
    out: dict[str, Any] = {}
    model, _ = _prepare(
        1,
        sharding_strategy="SHARD_GRAD_OP",
        backward_prefetch="BACKWARD_PRE",
        forward_prefetch=True,
        limit_all_gathers=False,
        use_orig_params=True,
    )
    out["settings"] = [
        model.sharding_strategy.name,
        model.backward_prefetch.name,
        model.forward_prefetch,
        model.limit_all_gathers,
        [n for n, _ in model.named_parameters()][:1],  # original names, not flat ones
    ]
    out["wrapped"] = sum(isinstance(m, FSDP) for m in model.modules())  # root + each Block
    # reshard_after_forward is FSDP1's newer name of the sharding strategy
    model, _ = _prepare(1, reshard_after_forward="NO_SHARD", auto_wrap_policy="no_wrap")
    out["no_shard"] = [
        sum(p.numel() for p in model.parameters()),
        sum(isinstance(m, FSDP) for m in model.modules()),
    ]
    seen: list[Any] = []
    model, _ = _prepare(1, mixed_precision_policy="bf16", activation_checkpointing=True)
    block = next(m for m in model.modules() if isinstance(m, Block))
    _counting(block.up, seen, _dtype_seen)
    model(x).sum().backward()
    out["mixed_and_checkpointing"] = seen  # bf16 compute, run again in backward
    model, _ = _prepare(1, ignored_modules="head", auto_wrap_policy="no_wrap")
    out["ignored"] = [n for n, _ in model.named_parameters() if "head" in n]
    inits: list[str] = []

    def init(module: nn.Module) -> None:  # FSDP1 calls it for each module still on meta
        inits.append(type(module).__name__)
        module.to_empty(device=CPU, recurse=False)
        with torch.no_grad():
            for param in module.parameters(recurse=False):
                param.fill_(0.5)

    with torch.device("meta"):
        empty = TinyTransformer()
    model, _ = _prepare(1, model=empty, param_init_fn=init)
    out["param_init_fn"] = [sorted(set(inits)), {float(p.unique()) for p in model.parameters()}]
    # no_sync keeps unsharded flat gradients; clip_grad_norm_ gives the global norm
    model, strategy = _prepare(1)
    data = batches(torch.distributed.get_rank(), 2, 2)
    with strategy.no_sync(model):
        model(data[0][0]).sum().backward()
    unsharded = [p.grad.numel() for p in model.parameters()]
    model(data[1][0]).sum().backward()
    sharded = [p.grad.numel() for p in model.parameters()]
    squares = sum(p.grad.pow(2).sum() for p in model.parameters())
    torch.distributed.all_reduce(squares)  # each process holds a disjoint part of the grads
    full = squares.sqrt()
    norm = strategy.clip_grad_norm_(model.parameters(), 1e9)
    out["accumulate"] = [unsharded, sharded, float(norm), float(full)]
    # the plugin's own FULL configs work in Accelerate's idiom (offload_to_cpu would break)
    plugin = strategy.plugin
    with FSDP.state_dict_type(model, plugin.state_dict_type, plugin.state_dict_config):
        state = model.state_dict()
    out["full_state_dict"] = [len(state), plugin.state_dict_config.offload_to_cpu]
    return out


def _local_state_mismatches(folder: str) -> list[str]:
    """FSDP1 LOCAL_STATE_DICT files refused by a model wrapped otherwise or of other sizes."""
    from types import SimpleNamespace

    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.utils.fsdp_utils import load_fsdp_model, save_fsdp_model

    plugin = FullyShardedDataParallelPlugin(fsdp_version=1, state_dict_type="LOCAL_STATE_DICT")
    accelerator = SimpleNamespace(strategy=None, device=CPU)
    model, _ = _prepare(1, state_dict_type="LOCAL_STATE_DICT")
    save_fsdp_model(plugin, accelerator, model, folder)
    errors = []
    for other in (
        _prepare(1, auto_wrap_policy="no_wrap")[0],
        _prepare(1, model=TinyTransformer(width=8))[0],
    ):
        try:
            load_fsdp_model(plugin, accelerator, other, folder)
            errors.append("loaded")
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def _accelerator_checks() -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.utils.fsdp_utils import (
        fsdp2_apply_ac,
        fsdp2_load_full_state_dict,
        fsdp2_prepare_model,
        get_fsdp2_grad_scaler,
    )

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap"
    )
    accelerator = Accelerator(
        fsdp_plugin=plugin, gradient_accumulation_steps=2, mixed_precision="bf16"
    )
    torch.manual_seed(0)
    model = TinyTransformer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    out: dict[str, Any] = {"unwrapped": accelerator.unwrap_model(model) is model}
    seen: list[Any] = []
    _counting(model.layers[0].up, seen, lambda mod, o: str(o.dtype))
    grads, norms = [], []
    for x, y in batches(accelerator.process_index, 2, 2):
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x).float(), y))
            grads.append([p.grad is not None for p in model.parameters()])
            if accelerator.sync_gradients:
                norm = accelerator.clip_grad_norm_(model.parameters(), 1e9)
                full = torch.stack([p.grad.full_tensor().norm() for p in model.parameters()])
                norms = [type(norm).__name__, float(norm), float(full.norm())]
            optimizer.step()
            optimizer.zero_grad()
    out.update(grads=grads, norms=norms, bf16=seen, scaler=type(get_fsdp2_grad_scaler()).__name__)
    # Accelerate's fsdp2_* helpers: shard a second model, checkpoint it, load rank 0's weights
    torch.manual_seed(accelerator.process_index + 1)
    other = fsdp2_apply_ac(accelerator, TinyTransformer())
    other = fsdp2_prepare_model(accelerator, other)
    torch.manual_seed(0)
    full_sd = TinyTransformer().state_dict() if accelerator.is_main_process else {}
    fsdp2_load_full_state_dict(accelerator, other, full_sd)
    loaded = accelerator.get_state_dict(other)
    torch.manual_seed(0)
    out["helpers"] = [
        type(other.layers[0].up.weight).__name__,
        all(torch.equal(loaded[k], v) for k, v in TinyTransformer().state_dict().items())
        if accelerator.is_main_process
        else loaded == {},
    ]
    return out


def _all_checks(folder: str) -> dict[str, Any]:
    import faulthandler
    import sys

    from hasten.state import PartialState

    faulthandler.dump_traceback_later(75, file=sys.stderr)  # where a hang waits, before the kill
    # hasten's process group first: it also sets this process's CPU threads, which a forked
    # child needs before its first parallel op (the parent's OpenMP pool does not survive fork)
    PartialState()
    try:
        return {
            "fsdp2": _fsdp2_fields(),
            "fsdp1": _fsdp1_fields(),
            "local": _local_state_mismatches(folder),
            "accelerator": _accelerator_checks(),
        }
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.mark.timeout(120)
def test_plugin_fields_take_effect_on_the_sharded_model(tmp_path: Path) -> None:
    results = run_distributed(_all_checks, str(tmp_path), world_size=2, timeout=90)
    v2, v1, acc = (results[0][k] for k in ("fsdp2", "fsdp1", "accelerator"))
    assert v2["reshard_True"] == "DTensor" and v2["reshard_False"] == "Parameter"
    bf16 = "torch.bfloat16->torch.bfloat16"
    assert v2["mixed"] == [[bf16], "torch.bfloat16", "torch.float32"]  # sharded stay fp32
    assert v2["mixed_grad"] == "torch.float32"
    assert v2["offload"] == ["CPUOffloadPolicy", False]
    assert v2["checkpointing"] == [[[True, False]], 2]
    assert v2["ignored"] == (["Parameter"], "DTensor")
    assert v2["transformer_based_wrap"] == ["", "layers.0", "layers.1"]
    assert v2["size_based_wrap"] == ["", "layers.0", "layers.1"]
    assert v2["no_wrap"] == [""] and v2["callable"] == [""]
    assert v1["settings"] == [
        "SHARD_GRAD_OP",
        "BACKWARD_PRE",
        True,
        False,
        ["_fsdp_wrapped_module.embed.weight"],
    ]
    assert v1["wrapped"] == 3
    assert v1["no_shard"] == [sum(p.numel() for p in TinyTransformer().parameters()), 1]
    assert v1["mixed_and_checkpointing"] == [bf16, bf16]
    assert v1["ignored"] == ["_fsdp_wrapped_module.head.weight", "_fsdp_wrapped_module.head.bias"]
    assert v1["param_init_fn"] == [
        ["Block", "LayerNorm", "Linear", "ModuleList", "TinyTransformer"],
        {0.5},
    ]
    unsharded, sharded, norm, full = v1["accumulate"]
    assert all(u == 2 * s for u, s in zip(unsharded, sharded)), (unsharded, sharded)
    assert norm == pytest.approx(full, rel=1e-5)
    assert v1["full_state_dict"] == [len(TinyTransformer().state_dict()), False]
    for local in (results[0]["local"], results[1]["local"]):
        assert "but the model's local state has" in local[0] and "wrapped the same way" in local[0]
        assert "but this process holds" in local[1] and "same number of processes" in local[1]
    assert acc["unwrapped"]
    assert acc["grads"][0] == [False] * len(acc["grads"][0])  # no reduce-scatter when accumulating
    assert all(acc["grads"][1])
    assert acc["norms"][0] == "Tensor" and acc["norms"][1] == pytest.approx(acc["norms"][2])
    assert acc["bf16"] == ["torch.bfloat16", "torch.bfloat16"]
    assert acc["scaler"] == "GradScaler"
    assert acc["helpers"] == ["DTensor", True]
    assert results[1]["accelerator"]["helpers"] == ["DTensor", True]
