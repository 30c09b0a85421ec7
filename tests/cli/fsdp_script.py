"""Trained by ``hasten launch --use_fsdp ...``: FSDP settings arrive only through the launcher."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _support.fsdp_models import TinyTransformer, train  # noqa: E402
from hasten import Accelerator  # noqa: E402
from hasten.checkpointing.layouts.factory import checkpoint_layout  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1])
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    local = sum(getattr(p, "_local_tensor", p).numel() for p in model.parameters())
    total = sum(p.numel() for p in TinyTransformer().parameters())
    losses = train(accelerator, model, optimizer, 4, clip=1.0)
    accelerator.save_state(str(out / "ckpt"))
    accelerator.save_model(model, str(out / "model"))
    plugin = accelerator.state.fsdp_plugin
    result = {
        "strategy": accelerator.strategy.name,
        "fraction": local / total,
        "losses": losses,
        "reshard_after_forward": plugin.reshard_after_forward,
        "layout": type(checkpoint_layout(accelerator.strategy)).__name__,
    }
    (out / f"result_{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
