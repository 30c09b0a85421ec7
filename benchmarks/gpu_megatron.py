"""Megatron-LM through hasten on one GPU: a small GPT-2 with tp=1 for a few steps, loss falling.

``python benchmarks/gpu_megatron.py [--steps N] [--json PATH]``: one process (hasten sets up a
one-process NCCL group for megatron-core), a `MegatronLMPlugin(tp_degree=1, pp_degree=1)`, a
transformers GPT-2 config turned into a megatron-core `GPTModel`, bf16, the Accelerate loop
(``model(**batch).loss``, ``accelerator.backward``, ``optimizer.step``, ``scheduler.step``) and a
last evaluation step. Prints each step's loss and time; exits 1 unless the loss fell. Without
CUDA, megatron-core or transformers it prints SKIP and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.utils.data import DataLoader

VOCAB = 1024
SEQ = 128


def data(n: int, batch: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    start = torch.randint(0, VOCAB, (n, 1), generator=generator)
    ids = (start + torch.arange(SEQ)) % VOCAB  # counting sequences: easy to learn
    rows = [
        {"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids
    ]
    return DataLoader(rows, batch_size=batch, shuffle=False)


def missing() -> str | None:
    from hasten.core.imports import is_package_available

    if not torch.cuda.is_available():
        return "a CUDA GPU"
    for package in ("megatron", "transformers"):
        if not is_package_available(package):
            return f"the {package} package"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    need = missing()
    if need is not None:
        print(f"SKIP: the Megatron-LM check needs {need}")
        return 0
    from transformers import GPT2Config, GPT2LMHeadModel

    from hasten import Accelerator, DistributedType
    from hasten.utils import MegatronLMDummyScheduler, MegatronLMPlugin

    plugin = MegatronLMPlugin(tp_degree=1, pp_degree=1, num_micro_batches=1, gradient_clipping=1.0)
    accelerator = Accelerator(mixed_precision="bf16", megatron_lm_plugin=plugin)
    assert accelerator.distributed_type == DistributedType.MEGATRON_LM
    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=SEQ, vocab_size=VOCAB)
    config.eos_token_id = VOCAB - 1
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=args.steps, warmup_num_steps=2)
    train = data(args.batch * args.steps, args.batch)
    evaluation = data(args.batch * 2, args.batch)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )
    print(f"device: {torch.cuda.get_device_name()}  model: {type(model).__name__}")
    model.train()
    losses, times = [], []
    for step, batch in enumerate(train):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
        print(f"step {step:3d}  loss {losses[-1]:.4f}  {times[-1] * 1e3:.1f} ms")
    model.eval()
    with torch.no_grad():
        eval_losses = [float(model(**batch).loss) for batch in evaluation]
    result = {
        "first_loss": losses[0],
        "last_loss": sum(losses[-5:]) / 5,
        "eval_loss": sum(eval_losses) / len(eval_losses),
        "median_step_ms": sorted(times[3:])[len(times[3:]) // 2] * 1e3,
        "global_batch_size": accelerator.state.megatron_lm_plugin.global_batch_size,
    }
    print(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    fell = result["last_loss"] < 0.7 * result["first_loss"]
    print("loss fell:", fell)
    return 0 if fell else 1


if __name__ == "__main__":
    sys.exit(main())
