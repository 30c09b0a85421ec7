"""Data-parallel inference with `split_between_processes`: each process answers its share of the prompts.

Every process holds the whole (small) model; the list of inputs is cut into one contiguous
slice per process (the first processes take one more when it does not divide evenly), each
process runs its slice, and `gather_object` brings the answers back in the original order.

    hasten launch --cpu --num_processes 2 examples/inference/distributed_inference.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from hasten import PartialState
from hasten.utils import gather_object, set_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=11)
    args = parser.parse_args()

    state = PartialState()
    set_seed(0)  # the same weights on every process
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).eval()
    prompts = [torch.full((8,), float(i)) / args.prompts for i in range(args.prompts)]

    with state.split_between_processes(list(range(args.prompts))) as mine:
        with torch.no_grad():
            answers = [(i, int(model(prompts[i]).argmax())) for i in mine]
        print(f"process {state.process_index} answered {len(mine)} prompts", flush=True)

    everything = gather_object(answers)  # every process's answers, in rank order
    if state.is_main_process:
        order = [i for i, _ in everything]
        with torch.no_grad():
            alone = [int(model(p).argmax()) for p in prompts]
        same = [answer for _, answer in everything] == alone
        print(f"{len(everything)} answers in prompt order: {order == list(range(args.prompts))}")
        print(f"same as one process answering all: {same}")


if __name__ == "__main__":
    main()
