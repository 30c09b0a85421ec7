"""torchao fp8 under DDP and FSDP2 on 2 CPU processes (gloo).

torchao's fp8 layers also run (emulated) on a CPU, so only the hardware gate of
`precision.fp8` is lifted here: the conversion, the wrappers' order and gradient exchange are
the real ones. DDP replicas must end identical; under FSDP2 the fp8 layers are sharded (their
weights differ from DDP's by fp8 rounding of the sharded all-gather, so only training is
compared).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from _support.distributed import run_distributed
from _support.fsdp_models import TinyTransformer, batches
from hasten.core.imports import is_torchao_available

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not is_torchao_available(), reason="torchao is not installed"),
]

if is_torchao_available():
    import torchao.float8  # noqa: F401 - imported once here, shared by the forked workers


def _run(engine: str) -> dict[str, Any]:
    from torchao.float8.float8_linear import Float8Linear

    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.kwargs import AORecipeKwargs
    from hasten.precision import fp8

    fp8._check_hardware = lambda device, backend: None  # forked worker: its own module copy
    plugin = None
    if engine == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap"
        )
    # Every Linear is converted (the default filter would keep first/last and odd sizes).
    recipe = AORecipeKwargs(module_filter_func=lambda module, fqn: True)
    accelerator = Accelerator(mixed_precision="fp8", fsdp_plugin=plugin, kwargs_handlers=[recipe])
    torch.manual_seed(0)
    model = TinyTransformer(width=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    local = sum(getattr(p, "_local_tensor", p).numel() for p in model.parameters())
    total = sum(p.numel() for p in TinyTransformer(width=16).parameters())
    x, y = batches(accelerator.process_index, accelerator.num_processes, 1, size=16)[0]
    losses = []
    for _ in range(8):  # one fixed batch: the loss must fall
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    state = accelerator.get_state_dict(model)
    return {
        "converted": converted,
        "losses": losses,
        "strategy": accelerator.strategy.name,
        "fraction": local / total,
        "head": state["head.weight"].float().sum().item() if state else None,
    }


def test_fp8_with_ddp_and_fsdp2_trains_one_model() -> None:
    ddp0, ddp1 = run_distributed(_run, "ddp", world_size=2, timeout=120)
    fsdp0, _ = run_distributed(_run, "fsdp2", world_size=2, timeout=120)
    for result in (ddp0, fsdp0):
        assert result["converted"] == 6  # embed, 2 x (up, down), head
        assert result["losses"][-1] < 0.8 * result["losses"][0]
    assert ddp0["head"] == ddp1["head"]  # replicas stay identical
    assert ddp0["fraction"] == 1.0
    assert fsdp0["fraction"] < 0.75  # the fp8 layers are sharded between the two processes
