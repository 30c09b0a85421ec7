"""Training loop for the elastic tests: DDP, split_batches, a checkpoint every 2 steps.

Prints ``START world=W resumed=N`` (N: the step count of the checkpoint it resumed from) and
``DONE world=W step=S`` on the main process.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from hasten import Accelerator
from hasten.utils import DataLoaderConfiguration, ProjectConfiguration

out, total, pause = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
accelerator = Accelerator(
    dataloader_config=DataLoaderConfiguration(split_batches=True),
    project_config=ProjectConfiguration(
        project_dir=str(out), automatic_checkpoint_naming=True, total_limit=2
    ),
)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(1024, 4), torch.randn(1024, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)


class Counter:
    """The number of optimizer steps taken, saved inside each checkpoint."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


counter = Counter()
accelerator.register_for_checkpointing(counter)
if (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
    accelerator.load_state()
step = first = counter.step
accelerator.print(
    f"START world={accelerator.num_processes} resumed={step} t={time.time():.3f}", flush=True
)
for x, y in loader:
    if step >= total:
        break
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    step += 1
    if step == first + 1:  # the first step of this attempt
        accelerator.print(f"STEP world={accelerator.num_processes} t={time.time():.3f}", flush=True)
    if step % 2 == 0:
        counter.step = step
        accelerator.save_state()
    time.sleep(pause)
accelerator.print(f"DONE world={accelerator.num_processes} step={step}", flush=True)
accelerator.end_training()
