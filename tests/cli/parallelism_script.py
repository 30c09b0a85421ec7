"""Run by ``hasten launch --parallelism_config_*``: the layout arrives only through the launcher."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from hasten import Accelerator


class Mlp(nn.Module):
    tp_plan = {"up": "colwise", "down": "rowwise"}

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)
        self.down = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def main() -> int:
    out = Path(sys.argv[1])
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = Mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.arange(16.0).reshape(8, 2).repeat(1, 2), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    firsts = []
    for batch in loader:
        firsts.append(batch[0, 0].item())
        accelerator.backward(model(batch).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    result = {
        "dims": list(accelerator.torch_device_mesh.mesh_dim_names),
        "tp_rank": accelerator.tensor_parallel_rank,
        "dp_rank": accelerator.data_parallel_rank,
        "strategy": accelerator.strategy.name,
        "local_rows": model.up.weight.to_local().shape[0],
        "firsts": firsts,
    }
    (out / f"result_{accelerator.process_index}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
