"""Run by `hasten launch` from test_training_e2e.py: the Accelerator's multi-process guarantees.

Each section records what it observed (nothing is asserted here, so one broken section does not
hide the others); rank 0 saves everything to ``<out>/results.pt`` for the test to check.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.config.kwargs import GradScalerKwargs
from hasten.config.project import DataLoaderConfiguration, GradientAccumulationPlugin
from hasten.state._shared import reset_state

GLOBAL_BATCH = 8
EPOCHS = 2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def make_data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(123)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))


def train(acc: Accelerator, n: int, batch_size: int) -> list[torch.Tensor]:
    """SGD for EPOCHS epochs; the loss is scaled so every layout computes sum/GLOBAL_BATCH."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(make_data(n), batch_size=batch_size, shuffle=False)
    model, opt, loader = acc.prepare(model, opt, loader)
    scale = acc.num_processes * acc.gradient_accumulation_steps / GLOBAL_BATCH
    for _ in range(EPOCHS):
        for x, y in loader:
            with acc.accumulate(model):
                loss = F.mse_loss(model(x), y, reduction="sum") * scale
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
    return [p.detach().clone() for p in acc.unwrap_model(model).parameters()]


def equivalence() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (32, 30):  # 30: the last global batch is short
        config = DataLoaderConfiguration(split_batches=True, even_batches=False)
        out[f"split_{n}"] = train(Accelerator(cpu=True, dataloader_config=config), n, GLOBAL_BATCH)
        config = DataLoaderConfiguration(even_batches=False)
        acc = Accelerator(cpu=True, dataloader_config=config)
        out[f"per_process_{n}"] = train(acc, n, GLOBAL_BATCH // acc.num_processes)
    return out


def accumulation_syncs() -> dict[str, Any]:
    acc = Accelerator(
        cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4)
    )
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(make_data(12 * acc.num_processes), batch_size=2)  # 6 batches each
    model, opt, loader = acc.prepare(model, opt, loader)
    calls = {"n": 0}

    # No annotations: DDP rejects a `bucket` annotated as anything but dist.GradBucket, and
    # `from __future__ import annotations` turns annotations into strings.
    def counting_allreduce(state, bucket):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]

    model.register_comm_hook(None, counting_allreduce)
    per_step, flags = [], []
    for x, y in loader:
        before = calls["n"]
        with acc.accumulate(model):
            acc.backward(F.mse_loss(model(x), y))
            flags.append(acc.sync_gradients)
            opt.step()
            opt.zero_grad()
        per_step.append(calls["n"] - before)
    return {"allreduces_per_step": per_step, "sync_flags": flags}


def gather_for_metrics() -> dict[str, Any]:
    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(13.0)), batch_size=2))
    tensors, objects = [], []
    for (batch,) in loader:
        tensors.append(acc.gather_for_metrics(batch))
        objects.extend(acc.gather_for_metrics([f"s{int(v)}" for v in batch]))
    return {"tensors": torch.cat(tensors).tolist(), "objects": objects}


def fp16_overflow() -> dict[str, Any]:
    reset_state()  # a new mixed precision needs a fresh state (the process group is kept)
    acc = Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=2.0**10)]
    )
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    model, opt, sched = acc.prepare(model, opt, sched)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.ones(2, 4)
    # Only rank 1 overflows: the all-reduce spreads the inf, so every rank must skip.
    blow = float("inf") if acc.process_index == 1 else 1.0
    acc.backward(model(x).sum() * blow)
    opt.step()
    sched.step()
    opt.zero_grad()
    skipped = acc.optimizer_step_was_skipped
    lr_after_skip = sched.get_last_lr()[0]
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    acc.backward(model(x).sum())
    opt.step()
    sched.step()
    return {
        "skipped": skipped,
        "lr_after_skip": lr_after_skip,
        "weights_unchanged": unchanged,
        "skipped_after_good_step": acc.optimizer_step_was_skipped,
        "lr_after_good_step": sched.get_last_lr()[0],
        "num_processes": acc.num_processes,
    }


SECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "equivalence": equivalence,
    "accumulation": accumulation_syncs,
    "gather_for_metrics": gather_for_metrics,
    "fp16_overflow": fp16_overflow,
}


def main() -> None:
    out_dir = Path(sys.argv[1])
    results: dict[str, Any] = {}
    for name, section in SECTIONS.items():
        try:
            results[name] = section()
        except Exception:  # noqa: BLE001 - recorded for the test to report
            results[name] = {"error": traceback.format_exc()}
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(results, out_dir / "results.pt")
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
