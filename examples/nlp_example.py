"""Fine-tune a small BERT for sentence classification with hasten.

The model is built from a `BertConfig` (no download) and the "sentences" are synthetic token
sequences on two topics (each mostly drawn from its own half of the vocabulary): a task a
transformer learns in a few epochs on CPU. The loop is the plain Accelerate one: `prepare`, `backward`,
`gather_for_metrics` for evaluation.

    python examples/nlp_example.py
    hasten launch --num_processes 2 examples/nlp_example.py --mixed_precision bf16
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification

from hasten import Accelerator
from hasten.utils import set_seed

VOCAB, LENGTH = 64, 16


class TopicSentences(Dataset):
    """Random "sentences" on two topics: mostly words of the topic's half of the vocabulary."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        half = (VOCAB - 8) // 2
        own = 8 + self.labels[:, None] * half + torch.randint(0, half, (n, LENGTH), generator=g)
        noise = torch.randint(8, VOCAB, (n, LENGTH), generator=g)
        self.ids = torch.where(torch.rand(n, LENGTH, generator=g) < 0.7, own, noise)
        self.ids[:, 0] = 2  # a [CLS]-like first token

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--train_samples", type=int, default=1024)
    parser.add_argument("--mixed_precision", default="no", choices=["no", "bf16", "fp16"])
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    train_dl = DataLoader(
        TopicSentences(args.train_samples, 1), batch_size=args.batch_size, shuffle=True
    )
    eval_dl = DataLoader(TopicSentences(250, 2), batch_size=args.batch_size)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        for batch in train_dl:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.item()
        model.eval()
        correct = seen = 0
        for batch in eval_dl:
            with torch.no_grad():
                predictions = model(input_ids=batch["input_ids"]).logits.argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, batch["labels"]))
            correct += int((predictions == labels).sum())
            seen += len(labels)
        accelerator.print(
            f"epoch {epoch}: loss {total / len(train_dl):.4f} accuracy {correct / seen:.3f} "
            f"({seen} samples)"
        )
    accelerator.end_training()


if __name__ == "__main__":
    main()
