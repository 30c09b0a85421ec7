"""Hello, distributed: each process takes a share of the work and the results are combined.

Run it on two CPU processes:

    hasten launch --cpu --num_processes 2 examples/hello_distributed.py
"""

from __future__ import annotations

import torch

from hasten.ops.collectives import gather, reduce
from hasten.state import PartialState


def main() -> None:
    state = PartialState()
    numbers = list(range(1, 11))
    # Each process squares its own slice of the list (uneven slices are fine).
    with state.split_between_processes(numbers) as mine:
        squares = torch.tensor([float(n * n) for n in mine], device=state.device)
    local_sum = squares.sum().reshape(1)
    per_process = gather(local_sum)
    total = reduce(local_sum, reduction="sum")
    state.wait_for_everyone()
    if state.is_main_process:
        print(
            f"{state.num_processes} process(es), {state.distributed_type.value}, "
            f"backend={state.backend}: per-process sums {per_process.tolist()}, "
            f"total sum of squares 1..10 = {total.item():.0f}"
        )
    state.destroy_process_group()


if __name__ == "__main__":
    main()
