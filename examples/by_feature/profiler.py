"""Profile training steps with `accelerator.profile()`: an operator table and a Chrome trace.

`ProfileKwargs` configures torch's profiler (activities, a wait/warmup/active schedule, shapes,
memory); ``output_trace_dir`` makes every process write its own trace, which
chrome://tracing or Perfetto opens. Call ``prof.step()`` once per training step so the schedule
advances.

    python examples/by_feature/profiler.py --output_trace_dir traces
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from hasten import Accelerator
from hasten.utils import ProfileKwargs, set_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_trace_dir", default="profiler_traces")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    profile_kwargs = ProfileKwargs(
        activities=["cpu"],
        schedule_option={"wait": 1, "warmup": 1, "active": 3, "repeat": 1},
        record_shapes=True,
        profile_memory=True,
        output_trace_dir=args.output_trace_dir,
    )
    accelerator = Accelerator(kwargs_handlers=[profile_kwargs])
    set_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs, labels = torch.randn(32, 64), torch.randint(0, 10, (32,))

    with accelerator.profile() as prof:
        for _ in range(args.steps):
            loss = F.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    accelerator.print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    accelerator.print(f"trace written to {args.output_trace_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
