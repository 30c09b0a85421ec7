"""Speed of `infer_auto_device_map`: hasten vs HF Accelerate, on big models built on meta.

Workloads (as in issue 5):
  * a mixture-of-experts model: 48 layers x 512 experts x 3 linears (~99,000 modules, ~117 B
    parameters in bf16), four 40 GiB accelerator budgets plus cpu, with and without the layer
    class as no-split;
  * the same with 64 / 128 / 256 / 512 experts (cost must grow linearly with modules);
  * a llama-70B shape (80 decoder layers, hidden 8192, MLP 28672, GQA 8 kv heads).
Integer accelerator keys are used on purpose: planning is arithmetic and needs no device.
The "floor" is one plain pass over ``model.parameters()`` summing numel (raw torch).

Usage: python benchmarks/bench_device_map.py [--repeat 3] [--skip-accelerate]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from _reference import require_real_accelerate
from torch import nn

from hasten.big_modeling import init_empty_weights
from hasten.big_modeling.device_map import infer_auto_device_map

BUDGET: dict[Any, Any] = {0: "40GiB", 1: "40GiB", 2: "40GiB", 3: "40GiB", "cpu": "400GiB"}


class Expert(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)


class MoELayer(nn.Module):
    def __init__(self, hidden: int, ffn: int, experts: int) -> None:
        super().__init__()
        self.input_norm = nn.LayerNorm(hidden)
        self.qkvo = nn.Linear(hidden, 4 * hidden, bias=False)
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(experts))


class MoEModel(nn.Module):
    def __init__(self, layers: list[MoELayer], hidden: int = 2048, vocab: int = 151_936) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)


class LlamaAttention(nn.Module):
    def __init__(self, hidden: int, kv: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, kv, bias=False)
        self.v_proj = nn.Linear(hidden, kv, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, hidden: int, ffn: int, kv: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(hidden, kv)
        self.mlp = LlamaMLP(hidden, ffn)
        self.input_layernorm = nn.LayerNorm(hidden, bias=False)
        self.post_attention_layernorm = nn.LayerNorm(hidden, bias=False)


class Llama(nn.Module):
    def __init__(
        self, layers: int = 80, hidden: int = 8192, ffn: int = 28672, kv: int = 1024
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(128_256, hidden)
        self.layers = nn.ModuleList(LlamaDecoderLayer(hidden, ffn, kv) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden, bias=False)
        self.lm_head = nn.Linear(hidden, 128_256, bias=False)


def build_moe(experts: int = 512) -> MoEModel:
    # include_buffers=True runs the constructors under torch's meta device: nothing is allocated
    with init_empty_weights(include_buffers=True):
        layers = [MoELayer(2048, 768, experts) for _ in range(48)]
        model = MoEModel(layers)
    return model.to(torch.bfloat16)


def shrink(model: MoEModel, experts: int) -> MoEModel:
    """A model sharing the big one's modules but keeping only the first ``experts`` experts."""
    with init_empty_weights(include_buffers=True):
        layers = []
        for layer in model.layers:
            small = MoELayer.__new__(MoELayer)
            nn.Module.__init__(small)
            small.input_norm, small.qkvo, small.router = layer.input_norm, layer.qkvo, layer.router
            small.experts = nn.ModuleList(list(layer.experts)[:experts])
            layers.append(small)
        shell = MoEModel.__new__(MoEModel)
        nn.Module.__init__(shell)
        shell.embed_tokens, shell.norm, shell.lm_head = (
            model.embed_tokens,
            model.norm,
            model.lm_head,
        )
        shell.layers = nn.ModuleList(layers)
    return shell


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def floor(model: nn.Module) -> Callable[[], int]:
    return lambda: sum(p.numel() for p in model.parameters())


def compare(
    label: str, model: nn.Module, no_split: list[str] | None, repeat: int, accelerate: Any
) -> None:
    ours, our_map = best_of(lambda: infer_auto_device_map(model, dict(BUDGET), no_split), repeat)
    raw, _ = best_of(floor(model), repeat)
    line = (
        f"{label:<44} hasten {ours * 1e3:9.2f} ms   floor {raw * 1e3:8.2f} ms ({ours / raw:4.1f}x)"
    )
    if accelerate is not None:
        theirs, their_map = best_of(
            lambda: accelerate(model, dict(BUDGET), no_split), max(1, repeat // 2)
        )
        same = "same map" if dict(their_map) == our_map else "MAPS DIFFER"
        line += f"   accelerate {theirs * 1e3:9.2f} ms   speed-up {theirs / ours:5.1f}x  ({same})"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-accelerate", action="store_true")
    args = parser.parse_args()
    accelerate = None
    if not args.skip_accelerate:
        try:
            import logging

            require_real_accelerate()
            from accelerate.utils import infer_auto_device_map as accelerate  # type: ignore[no-redef]

            logging.getLogger("accelerate").setLevel(logging.ERROR)  # "device 0 not available"
        except ImportError:
            print("HF accelerate not importable: hasten only")

    start = time.perf_counter()
    with init_empty_weights(include_buffers=True):
        llama = Llama().to(torch.bfloat16)
    print(
        f"llama-70B shape: {sum(1 for _ in llama.modules())} modules, "
        f"{sum(p.numel() for p in llama.parameters()) / 1e9:.1f} B params (built in {time.perf_counter() - start:.1f} s)"
    )
    compare("llama-70B, no_split=None", llama, None, args.repeat * 5, accelerate)
    compare(
        "llama-70B, no_split=[LlamaDecoderLayer]",
        llama,
        ["LlamaDecoderLayer"],
        args.repeat * 5,
        accelerate,
    )

    start = time.perf_counter()
    moe = build_moe(512)
    print(
        f"MoE: {sum(1 for _ in moe.modules())} modules, {sum(p.numel() for p in moe.parameters()) / 1e9:.1f} B "
        f"params bf16 (built in {time.perf_counter() - start:.1f} s)"
    )
    compare("MoE 48x512, no_split=None", moe, None, args.repeat, accelerate)
    compare("MoE 48x512, no_split=[MoELayer]", moe, ["MoELayer"], args.repeat, accelerate)
    print("scaling with the number of modules (no_split=None):")
    for experts in (64, 128, 256, 512):
        model = shrink(moe, experts)
        modules = sum(1 for _ in model.modules())
        seconds, _ = best_of(lambda m=model: infer_auto_device_map(m, dict(BUDGET)), args.repeat)
        line = f"  {experts:>3} experts: {modules:>6} modules  hasten {seconds * 1e3:8.1f} ms  ({seconds / modules * 1e6:.2f} us/module)"
        if accelerate is not None:
            theirs, _ = best_of(lambda m=model: accelerate(m, dict(BUDGET)), 1)
            line += f"   accelerate {theirs * 1e3:8.1f} ms ({theirs / modules * 1e6:.2f} us/module)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
