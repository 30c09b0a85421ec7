"""Pipeline inference with `prepare_pippy`: one model split into stages, one stage per process.

`prepare_pippy` traces the model with an example input, cuts it into as many stages as there are
processes (``split_points="auto"`` balances them), and returns a model whose forward pipelines
micro-batches through the stages. The last stage holds the output; ``gather_output=True`` sends
it to every process.

    hasten launch --num_processes 2 examples/inference/pippy_inference.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from hasten import PartialState, prepare_pippy
from hasten.utils import set_seed


class Tower(nn.Module):
    """A stack of residual blocks: the kind of model pipelines split between blocks."""

    def __init__(self, width: int = 64, depth: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.head(h)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch_size", type=int, default=8)
    args = parser.parse_args()

    state = PartialState()
    set_seed(0)
    model = Tower().eval()
    inputs = torch.randn(args.batch_size, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(inputs)  # the unsplit model's answer, to compare with

    model = prepare_pippy(model, split_points="auto", example_args=(inputs,), gather_output=True)
    with torch.no_grad():
        output = model(inputs)
    difference = (output - expected).abs().max().item()
    if state.is_main_process:
        print(
            f"{state.num_processes} stages split at {model.hf_split_points}; output "
            f"{tuple(output.shape)}, largest difference from the unsplit model {difference:.2e}"
        )
    state.destroy_process_group()


if __name__ == "__main__":
    main()
