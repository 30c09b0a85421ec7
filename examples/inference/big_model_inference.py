"""Big-model inference: `device_map="auto"` places a model across devices, CPU memory and disk.

A model larger than memory is built without allocating its weights (`init_empty_weights`), then
`load_checkpoint_and_dispatch` reads the checkpoint and places each block where ``max_memory``
allows: accelerators first, then CPU, then disk (``offload_folder``), where weights stay in a
memory-mapped file and are loaded only for their layer's forward. Here the CPU budget is set
small on purpose, so part of the model lives on disk.

    python examples/inference/big_model_inference.py --cpu_memory 400KB
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from hasten import init_empty_weights, load_checkpoint_and_dispatch
from hasten.utils import set_seed


class Decoder(nn.Module):
    """Embedding, a stack of MLP blocks, and a head: the layout of a decoder-only LM."""

    def __init__(self, vocab: int = 256, width: int = 64, depth: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                          nn.Linear(4 * width, width))
            for _ in range(depth)
        )  # fmt: skip
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cpu_memory", default="400KB", help="CPU budget for the weights")
    parser.add_argument("--workdir", default="big_model_out")
    args = parser.parse_args()

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    set_seed(0)
    original = Decoder().eval()  # stands for a trained model's checkpoint
    save_file(original.state_dict(), str(workdir / "model.safetensors"))
    ids = torch.randint(0, 256, (2, 12))

    with init_empty_weights():  # no memory for weights: every tensor is on "meta"
        model = Decoder()
    model = load_checkpoint_and_dispatch(
        model,
        str(workdir / "model.safetensors"),
        device_map="auto",
        max_memory={"cpu": args.cpu_memory},
        no_split_module_classes=["Sequential"],  # keep each block whole on one device
        offload_folder=str(workdir / "offload"),
    )
    placement = Counter(str(device) for device in model.hf_device_map.values())
    print(f"placement of {len(model.hf_device_map)} modules: {dict(placement)}")
    with torch.no_grad():
        difference = (model(ids) - original(ids)).abs().max().item()
    print(f"largest difference from the model in memory: {difference:.2e}")


if __name__ == "__main__":
    main()
