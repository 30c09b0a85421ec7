"""Tiny models and a tokenizer built in code for the ecosystem tests (nothing downloaded).

Imported by the scripts next to it (their folder is on ``sys.path`` when they run) and by the
tests, which use `WORDS` to write small text datasets.
"""

from __future__ import annotations

from typing import Any

import torch

#: The tokenizer's vocabulary after its special tokens: enough words for short sentences.
WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "under",
    "mat",
    "log",
    "big",
    "small",
    "red",
    "blue",
    "fast",
    "slow",
    "and",
    "is",
    "was",
    "yes",
    "no",
    "good",
    "bad",
    "answer",
    "question",
    "hello",
    "world",
]
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def tokenizer() -> Any:
    """A word-level fast tokenizer over `WORDS`, with pad/unk/bos/eos tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        unk_token="[UNK]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        model_max_length=32,
    )


def llama_config(vocab_size: int = len(SPECIAL) + len(WORDS), **changes: Any) -> Any:
    """A 2-layer Llama config: 32 wide, 4 heads (2 key/value heads), 3 labels."""
    from transformers import LlamaConfig

    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32,
        "num_labels": 3,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 3,
    }
    settings.update(changes)
    return LlamaConfig(**settings)


def causal_lm(seed: int = 0, **changes: Any) -> torch.nn.Module:
    """A tiny Llama causal LM, its weights drawn from ``seed``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(**changes))


def classifier(seed: int = 0, **changes: Any) -> torch.nn.Module:
    """A tiny Llama sequence classifier (3 classes), its weights drawn from ``seed``."""
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    return LlamaForSequenceClassification(llama_config(**changes))


def sentences(count: int, seed: int = 0, length: int = 6) -> list[str]:
    """``count`` sentences of ``length`` words drawn from `WORDS`."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (count, length), generator=g)
    return [" ".join(WORDS[i] for i in row) for row in picks.tolist()]
