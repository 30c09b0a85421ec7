"""DeepSpeed ZeRO-3 from a DeepSpeed config file.

ZeRO-3 partitions the parameters, gradients and optimizer state over the processes.
``deepspeed_zero3.json`` (beside this script) is a plain DeepSpeed config; its ``"auto"`` values
are filled in by `prepare` from the data loader and the Accelerator (micro-batch size,
accumulation steps). DeepSpeed runs on CPU processes too, so this runs anywhere:

    hasten launch --num_processes 2 examples/by_feature/deepspeed_zero3.py

The script passes the file to `DeepSpeedPlugin`; without the plugin in the code, the launcher
does the same: ``hasten launch --use_deepspeed --deepspeed_config_file deepspeed_zero3.json``.
`save_model` gathers the partitioned weights into one ``model.safetensors``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import DeepSpeedPlugin, set_seed

CONFIG = Path(__file__).with_name("deepspeed_zero3.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deepspeed_config", default=str(CONFIG))
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--output_dir", default="deepspeed_out")
    args = parser.parse_args()

    accelerator = Accelerator(
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=args.deepspeed_config),
        gradient_accumulation_steps=args.gradient_accumulation_steps,
    )
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True))
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.print(f"ZeRO stage {accelerator.state.deepspeed_plugin.zero_stage}")

    for epoch in range(args.epochs):
        total = 0.0
        for inputs, targets in loader:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(inputs), targets)
                accelerator.backward(loss)  # DeepSpeed's engine runs backward and the step
                optimizer.step()
                optimizer.zero_grad()
            total += loss.item()
        accelerator.print(f"epoch {epoch}: loss {total / len(loader):.4f}")

    accelerator.save_model(model, args.output_dir)
    accelerator.print(f"saved {args.output_dir}/model.safetensors")
    accelerator.end_training()


if __name__ == "__main__":
    main()
