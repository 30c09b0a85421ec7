"""Fine-tune a small causal language model with FSDP2, save it, and merge a sharded checkpoint.

FSDP2 shards every parameter, gradient and optimizer state over the processes (each
`GPT2Block` its own group here). hasten runs it on CPU processes too (gloo), so this example
runs on a laptop:

    hasten launch --num_processes 2 examples/by_feature/fsdp2_causal_lm.py --output_dir fsdp_out

It writes two things. ``save_model`` gathers the full weights into ``model.safetensors``, ready
for `from_pretrained` or a plain ``load_state_dict``. ``save_state`` writes the training state
sharded (each process its own part, the fast way to checkpoint); ``hasten merge-weights`` turns
such a checkpoint into one file afterwards, in one process:

    hasten merge-weights fsdp_out/checkpoint/pytorch_model_fsdp_0 fsdp_out/merged

The plugin is built in the script here; ``hasten launch --use_fsdp --fsdp_version 2 ...`` or a
``hasten config`` file set the same fields without touching the code.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

from hasten import Accelerator
from hasten.utils import FullyShardedDataParallelPlugin, set_seed

VOCAB, LENGTH = 64, 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_dir", default="fsdp2_out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=8)
    args = parser.parse_args()

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["GPT2Block"],
        state_dict_type="SHARDED_STATE_DICT",  # what save_state writes
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    set_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    # A "language" in which token t is followed by t + 1: learnable in a few dozen steps.
    starts = torch.randint(0, VOCAB, (args.steps * args.batch_size, 1))
    tokens = (starts + torch.arange(LENGTH)) % VOCAB
    loader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    for step, (ids,) in enumerate(loader):
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % 5 == 0:
            accelerator.print(f"step {step}: loss {loss.item():.4f}")
    accelerator.print(f"final loss {loss.item():.4f}")

    # The full model, gathered from the shards: safetensors, loadable without hasten.
    accelerator.save_model(model, args.output_dir)
    # The sharded training state (model, optimizer, RNG, loader position), for resuming.
    accelerator.save_state(os.path.join(args.output_dir, "checkpoint"))
    accelerator.print(f"saved {args.output_dir}/model.safetensors and {args.output_dir}/checkpoint")
    accelerator.end_training()


if __name__ == "__main__":
    main()
