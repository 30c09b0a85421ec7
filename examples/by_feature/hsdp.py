"""Hybrid sharding (HSDP) with `ParallelismConfig`: shard within groups, replicate across them.

On a cluster, sharding over every GPU makes each step talk across machines. HSDP shards the
model FSDP2-style inside groups of ``dp_shard_size`` processes (a machine, say) and keeps
``dp_replicate_size`` replicas of those groups, which only average gradients. Four processes
make a 2 x 2 mesh:

    hasten launch --num_processes 4 examples/by_feature/hsdp.py \\
        --dp_replicate_size 2 --dp_shard_size 2
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import FullyShardedDataParallelPlugin, ParallelismConfig, set_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dp_replicate_size", type=int, default=2)
    parser.add_argument("--dp_shard_size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    accelerator = Accelerator(
        parallelism_config=ParallelismConfig(
            dp_replicate_size=args.dp_replicate_size, dp_shard_size=args.dp_shard_size
        ),
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
    )
    mesh = accelerator.torch_device_mesh
    accelerator.print(f"mesh {dict(zip(mesh.mesh_dim_names, mesh.shape))}")
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = (x[:, :8].sum(dim=1) > x[:, 8:].sum(dim=1)).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    for epoch in range(args.epochs):
        for inputs, labels in loader:
            loss = F.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
