"""Gradient accumulation for causal language models: weigh every token the same.

With padding, batches hold different numbers of real tokens. Averaging each batch's loss and
then the batches (what plain accumulation does) weighs a token of a short batch more than one of
a long batch. Instead, count the real tokens of the whole accumulation window on every process
first (`gather`), sum the per-token losses of each batch, and divide by that count: the update is
then exactly the one a single large batch would give. A small GPT-2 is built from its config.

    python examples/by_feature/gradient_accumulation_for_autoregressive_models.py
    hasten launch --num_processes 2 \\
        examples/by_feature/gradient_accumulation_for_autoregressive_models.py
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel

from hasten import Accelerator
from hasten.utils import gather, set_seed

VOCAB, LENGTH, PAD = 32, 24, -100


class CountingSequences(Dataset):
    """Sequences of consecutive tokens (t, t+1, ...) of random length, padded with -100 labels."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, VOCAB, (n,), generator=g)
        self.lengths = torch.randint(4, LENGTH + 1, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = (self.starts[i] + torch.arange(LENGTH)) % VOCAB
        labels = ids.clone()
        labels[self.lengths[i] :] = PAD
        return {"input_ids": ids, "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(
        CountingSequences(args.samples, 1), batch_size=args.batch_size, shuffle=True
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    steps_per_epoch = math.ceil(len(loader) / args.gradient_accumulation_steps)
    for epoch in range(args.epochs):
        batches = iter(loader)
        epoch_loss, epoch_tokens = 0.0, 0
        for _ in range(steps_per_epoch):
            window = [b for _, b in zip(range(args.gradient_accumulation_steps), batches)]
            # Real (non-padded) target tokens of the window, on all processes together.
            local = sum(int((b["labels"][:, 1:] != PAD).sum()) for b in window)
            total = gather(torch.tensor([local], device=accelerator.device)).sum().item()
            epoch_tokens += local
            for batch in window:
                with accelerator.accumulate(model):
                    logits = model(input_ids=batch["input_ids"]).logits
                    loss = F.cross_entropy(
                        logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten(),
                        ignore_index=PAD, reduction="sum",
                    )  # fmt: skip
                    # DDP averages gradients over processes and backward() divides by the
                    # accumulation steps: undo both, so the result is the sum over all tokens
                    # divided by their number.
                    scale = accelerator.num_processes * args.gradient_accumulation_steps
                    accelerator.backward(loss * scale / total)
                    optimizer.step()
                    optimizer.zero_grad()
                epoch_loss += loss.item()
        accelerator.print(f"epoch {epoch}: loss {epoch_loss / epoch_tokens:.4f} per token")
    accelerator.end_training()


if __name__ == "__main__":
    main()
