"""Megatron-LM through hasten on one GPU: a few training steps per case, loss falling.

``python benchmarks/gpu_megatron.py [--case gpt|dummy|bert|t5|fp8] [--steps N] [--json PATH]``:
one process (hasten sets up a one-process NCCL group for megatron-core), a
`MegatronLMPlugin(tp_degree=1, pp_degree=1)`, bf16, the Accelerate loop (``model(**batch).loss``,
``accelerator.backward``, ``optimizer.step``, ``scheduler.step``) and a last evaluation step.

- ``gpt``: a transformers GPT-2 config as megatron-core's `GPTModel`, torch DataLoaders.
- ``dummy``: the same GPT fed by `MegatronLMDummyDataLoader` over a tiny Megatron indexed
  dataset written on the fly (megatron-core's `GPTDataset`, train/valid/test loaders).
- ``bert``: a Megatron-BERT masked-LM config as megatron-core's `BertModel`.
- ``t5``: a T5 config as megatron-core's `T5Model` (encoder-decoder).
- ``fp8``: ``gpt`` with ``mixed_precision="fp8"`` (Transformer Engine layers; SKIP without TE).

One case per process (megatron-core's parallel state is per process). Prints each step's loss
and time; exits 1 unless the loss fell. Without CUDA, megatron-core or transformers it prints
SKIP and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import DataLoader

VOCAB = 1024
SEQ = 128
CASES = ("gpt", "dummy", "bert", "t5", "fp8")


def counting(n: int, length: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    start = torch.randint(2, VOCAB - 2, (n, 1), generator=generator)
    return (start + torch.arange(length)) % (VOCAB - 2) + 2  # counting sequences: easy to learn


def rows(case: str, n: int) -> list[dict[str, torch.Tensor]]:
    ids = counting(n, SEQ)
    if case == "bert":  # mask every 8th token; predict it
        masked = ids.clone()
        masked[:, ::8] = 1
        labels = torch.full_like(ids, -100)
        labels[:, ::8] = ids[:, ::8]
        return [
            {"input_ids": m, "attention_mask": torch.ones_like(m), "labels": lab}
            for m, lab in zip(masked, labels)
        ]
    if case == "t5":  # the decoder continues the encoder's count
        tail = counting(n, SEQ + 32)[:, SEQ:]
        return [
            {"input_ids": e, "attention_mask": torch.ones_like(e), "labels": d}
            for e, d in zip(counting(n, SEQ), tail)
        ]
    return [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r} for r in ids]


def model_for(case: str) -> Any:
    import transformers as tf

    if case == "bert":
        config = tf.MegatronBertConfig(
            num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
            max_position_embeddings=SEQ, vocab_size=VOCAB,
        )  # fmt: skip
        return tf.MegatronBertForMaskedLM(config)
    if case == "t5":
        config = tf.T5Config(
            num_layers=2, num_decoder_layers=2, d_model=256, d_ff=1024, d_kv=64, num_heads=4,
            vocab_size=VOCAB, decoder_start_token_id=0,
        )  # fmt: skip
        return tf.T5ForConditionalGeneration(config)
    config = tf.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=SEQ, vocab_size=VOCAB)
    config.eos_token_id = 0
    return tf.GPT2LMHeadModel(config)


def indexed_dataset(folder: str, documents: int = 512) -> str:
    """A Megatron indexed dataset (.bin/.idx) of counting documents ending in eod (0)."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = f"{folder}/counting_text_document"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.int32)
    for row in counting(documents, 2 * SEQ):
        builder.add_item(torch.cat([row, torch.zeros(1, dtype=row.dtype)]).to(torch.int32))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return prefix


def missing(case: str) -> str | None:
    from hasten.core.imports import is_package_available

    if not torch.cuda.is_available():
        return "a CUDA GPU"
    needed = ["megatron", "transformers"] + (["transformer_engine"] if case == "fp8" else [])
    for package in needed:
        if not is_package_available(package):
            return f"the {package} package"
    return None


def run(case: str, steps: int, batch: int, folder: str) -> dict[str, Any]:
    from hasten import Accelerator, DistributedType
    from hasten.utils import MegatronLMDummyDataLoader, MegatronLMDummyScheduler, MegatronLMPlugin

    plugin = MegatronLMPlugin(tp_degree=1, pp_degree=1, num_micro_batches=1, gradient_clipping=1.0)
    precision = "fp8" if case == "fp8" else "bf16"
    accelerator = Accelerator(mixed_precision=precision, megatron_lm_plugin=plugin)
    assert accelerator.distributed_type == DistributedType.MEGATRON_LM
    model = model_for(case)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=steps, warmup_num_steps=2)
    if case == "dummy":
        loader: Any = MegatronLMDummyDataLoader(
            data_path=indexed_dataset(folder), split="98,2,0", seq_length=SEQ,
            micro_batch_size=batch, data_cache_path=f"{folder}/cache", num_workers=0,
            eval_iters=2,
        )  # fmt: skip
        model, optimizer, scheduler, train, evaluation, _ = accelerator.prepare(
            model, optimizer, scheduler, loader, loader, loader
        )
    else:
        train = DataLoader(rows(case, batch * steps), batch_size=batch)
        evaluation = DataLoader(rows(case, batch * 2), batch_size=batch)
        model, optimizer, train, evaluation, scheduler = accelerator.prepare(
            model, optimizer, train, evaluation, scheduler
        )
    print(f"case {case}  device: {torch.cuda.get_device_name()}  model: {type(model).__name__}")
    model.train()
    losses, times = [], []
    for step, data in zip(range(steps), train):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(**data).loss
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
        eval_losses = [float(model(**data).loss) for _, data in zip(range(2), evaluation)]
    return {
        "case": case,
        "first_loss": losses[0],
        "last_loss": sum(losses[-5:]) / len(losses[-5:]),
        "eval_loss": sum(eval_losses) / max(len(eval_losses), 1),
        "median_step_ms": sorted(times[3:])[len(times[3:]) // 2] * 1e3,
        "global_batch_size": accelerator.state.megatron_lm_plugin.global_batch_size,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", choices=CASES, default="gpt")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    need = missing(args.case)
    if need is not None:
        print(f"SKIP: the Megatron-LM {args.case} check needs {need}")
        return 0
    with tempfile.TemporaryDirectory() as folder:
        result = run(args.case, args.steps, args.batch, folder)
    print(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    fell = result["last_loss"] < 0.7 * result["first_loss"]
    print("loss fell:", fell)
    return 0 if fell else 1


if __name__ == "__main__":
    sys.exit(main())
