"""fp8 (torchao) vs bf16 training of a small GPT on one Hopper/Ada GPU: loss and step time.

``python benchmarks/gpu_fp8.py [--steps N] [--width W] [--layers L] [--seq S] [--batch B]
[--no-compile] [--json PATH]``. Three runs on the same data and initial weights: hasten
``mixed_precision="bf16"``, hasten ``mixed_precision="fp8"`` (torchao backend), and the raw
torchao equivalent (``convert_to_float8_training`` + bf16 autocast, no hasten). Prints the final
losses (fp8 must stay close to bf16), the median step times and the ratios fp8/bf16 and
hasten-fp8/raw-fp8. Without a CUDA GPU of compute capability 8.9+ it prints SKIP and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 4096


class Block(nn.Module):
    """Pre-norm attention + MLP block with plain `nn.Linear` layers (what torchao converts)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyGPT(nn.Module):
    """Token embedding, ``layers`` blocks, LM head (first/last Linear stay high precision)."""

    def __init__(self, width: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList(Block(width, max(1, width // 128)) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batches(steps: int, batch: int, seq: int, device: torch.device) -> list[torch.Tensor]:
    """A learnable synthetic language: each sequence counts up from a random start."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (batch, 1), generator=generator)
        out.append(((start + torch.arange(seq + 1)) % VOCAB).to(device))
    return out


def loss_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), tokens[:, 1:-1].reshape(-1))


def timed_loop(step: Callable[[torch.Tensor], float], data: list[torch.Tensor]) -> dict[str, Any]:
    losses, times = [], []
    for tokens in data:
        torch.cuda.synchronize()
        start = time.perf_counter()
        losses.append(step(tokens))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    warm = times[len(times) // 3 :]  # compilation and autotuning happen in the first steps
    tail = losses[-10:]
    return {"median_step_s": statistics.median(warm), "final_loss": sum(tail) / len(tail)}


def hasten_run(precision: str, args: argparse.Namespace, data: list[torch.Tensor]) -> dict:
    from hasten import Accelerator
    from hasten.config.kwargs import AORecipeKwargs
    from hasten.state._shared import reset_state

    reset_state()
    handlers = [AORecipeKwargs()] if precision == "fp8" else []
    accelerator = Accelerator(
        mixed_precision=precision,
        kwargs_handlers=handlers,
        dynamo_backend=None if args.no_compile else "inductor",
    )
    torch.manual_seed(0)
    model = TinyGPT(args.width, args.layers, args.seq)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step(tokens: torch.Tensor) -> float:
        loss = loss_of(model(tokens[:, :-1]), tokens)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    result = timed_loop(step, data)
    result["backend"] = str(accelerator.fp8_backend)
    return result


def raw_fp8_run(args: argparse.Namespace, data: list[torch.Tensor]) -> dict:
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    model = TinyGPT(args.width, args.layers, args.seq).cuda()
    first, last = "blocks.0.qkv", "head"
    convert_to_float8_training(
        model, module_filter_fn=lambda m, fqn: fqn not in (first, last) and fqn != "embed"
    )
    forward = model if args.no_compile else torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    def step(tokens: torch.Tensor) -> float:
        with torch.autocast("cuda", torch.bfloat16):
            loss = loss_of(forward(tokens[:, :-1]), tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return timed_loop(step, data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("SKIP: fp8 training needs a CUDA GPU of compute capability 8.9+ (H100/H200, L4)")
        return 0
    data = batches(args.steps, args.batch, args.seq, torch.device("cuda"))
    results = {
        "bf16": hasten_run("bf16", args, data),
        "fp8": hasten_run("fp8", args, data),
        "raw_fp8": raw_fp8_run(args, data),
    }
    bf16, fp8, raw = results["bf16"], results["fp8"], results["raw_fp8"]
    results["ratios"] = {
        "fp8_over_bf16_step_time": fp8["median_step_s"] / bf16["median_step_s"],
        "hasten_fp8_over_raw_fp8_step_time": fp8["median_step_s"] / raw["median_step_s"],
        "fp8_loss_relative_to_bf16": abs(fp8["final_loss"] - bf16["final_loss"])
        / bf16["final_loss"],
    }
    print(f"device: {torch.cuda.get_device_name()}  args: {vars(args)}")
    for name, row in results.items():
        print(f"{name:>8}: {row}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"args": vars(args), **results}, handle, indent=2)
    close = results["ratios"]["fp8_loss_relative_to_bf16"] < 0.05
    print("fp8 loss within 5% of bf16:", close)
    return 0 if close else 1


if __name__ == "__main__":
    sys.exit(main())
