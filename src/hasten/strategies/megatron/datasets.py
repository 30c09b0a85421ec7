"""Megatron's indexed datasets through megatron-core, for `MegatronLMDummyDataLoader`.

The dummy loader's arguments (Megatron's ``data_path``, ``split``, ``seq_length``, masking
options...) plus the run's arguments become a megatron-core dataset config (`GPTDatasetConfig`,
`BERTMaskedWordPieceDatasetConfig`, `T5MaskedWordPieceDatasetConfig`); megatron-core's
`BlendedMegatronDatasetBuilder` builds the train/valid/test datasets from the ``.bin``/``.idx``
files, and torch DataLoaders read them in Megatron's order: global step g gives data-parallel
rank r the samples ``g*G + r*b ... g*G + (r+1)*b`` (b = micro-batch x micro-batches,
G = b x data-parallel size), starting after the consumed samples of a resumed run. Everything but
`build_datasets` is pure and tested on CPU.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils.data import default_collate

__all__ = [
    "IdsTokenizer",
    "blend_from_data_path",
    "build_datasets",
    "collate_for",
    "consumed_samples",
    "dataset_config_kwargs",
    "dataset_tokenizer",
    "num_samples_per_split",
    "parse_split",
    "sample_indices",
]

_SPLITS = ("train", "valid", "test")


def blend_from_data_path(data_path: Any) -> tuple[list[str], list[float] | None] | None:
    """Megatron's ``data_path`` as megatron-core's blend: ``(prefixes, weights or None)``.

    Accepts a prefix, a list of prefixes, or weights and prefixes alternating
    (``["0.3", "a", "0.7", "b"]`` or ``"0.3 a 0.7 b"``); None stays None.

    Raises:
        ValueError: an empty path list, or negative / all-zero weights.
    """
    if data_path is None:
        return None
    parts = [data_path] if isinstance(data_path, str) else list(data_path)
    items = [token for part in parts for token in str(part).split()]
    if not items:
        raise ValueError(
            f"MegatronLMDummyDataLoader(data_path={data_path!r}) names no dataset: give the "
            "prefix of the .bin/.idx files, or weights and prefixes alternating."
        )
    if len(items) % 2 == 0:
        try:
            weights = [float(weight) for weight in items[0::2]]
        except ValueError:
            return items, None
        if any(weight < 0 for weight in weights) or not any(weights):
            raise ValueError(
                f"MegatronLMDummyDataLoader(data_path={data_path!r}): blend weights must be >= 0 "
                "and not all zero."
            )
        return items[1::2], weights
    return items, None


def parse_split(split: Any) -> list[float]:
    """Megatron's train/valid/test split ("969, 30, 1", "98/2/0", [8, 1, 1]) as fractions.

    Raises:
        ValueError: not numbers, more than three parts, a negative part, or all zero.
    """
    parts = list(split) if isinstance(split, (list, tuple)) else re.split(r"[,/\s]+", str(split))
    parts = [part for part in parts if str(part).strip() != ""]
    try:
        values = [float(part) for part in parts]
    except ValueError:
        values = []
    if not values or len(values) > 3 or any(v < 0 for v in values) or not any(values):
        raise ValueError(
            f"MegatronLMDummyDataLoader(split={split!r}) must be up to three non-negative "
            "weights for train, valid and test, not all zero, e.g. '969, 30, 1' or '98,2,0'."
        )
    values += [0.0] * (3 - len(values))
    total = sum(values)
    return [value / total for value in values]


def _get(args: SimpleNamespace, name: str, default: Any = None) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def num_samples_per_split(args: SimpleNamespace) -> list[int]:
    """Samples megatron-core draws per split, as Megatron counts them.

    Train: ``train_samples`` or ``train_iters x global_batch_size``; valid:
    ``(train_iters // eval_interval + 1) x eval_iters`` global batches; test: ``eval_iters``.

    Raises:
        ValueError: the length of training is unknown.
    """
    batch = int(args.global_batch_size)
    train_iters = _get(args, "train_iters")
    train_samples = _get(args, "train_samples")
    if train_samples is None:
        if train_iters is None:
            raise ValueError(
                "Megatron's datasets are sized by the length of training: pass a "
                "MegatronLMDummyScheduler(optimizer, total_num_steps=...) to the same prepare() "
                "call, or set MegatronLMPlugin(train_iters=...)."
            )
        train_samples = int(train_iters) * batch
    if train_iters is None:
        train_iters = math.ceil(int(train_samples) / batch)
    eval_iters = int(_get(args, "eval_iters", 100))
    valid_iters = (int(train_iters) // int(_get(args, "eval_interval", 1000)) + 1) * eval_iters
    return [int(train_samples), valid_iters * batch, eval_iters * batch]


def consumed_samples(args: SimpleNamespace) -> list[int]:
    """Samples already read per split (train, valid, test) by a resumed run; zeros otherwise.

    Raises:
        ValueError: a negative or non-integer count.
    """
    counts = list(_get(args, "consumed_samples", [0, 0, 0]))
    counts += [0] * (3 - len(counts))
    for name, count in zip(_SPLITS, counts):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(
                f"MegatronLMPlugin(consumed_samples=...) holds {count!r} for the {name} split; "
                "each entry must be an int >= 0 (samples read over all data-parallel ranks)."
            )
    return counts[:3]


def sample_indices(total: int, consumed: int, global_batch_size: int) -> range:
    """Indices still to read: after ``consumed``, whole global batches only (Megatron drops the
    incomplete last one).

    Raises:
        ValueError: more samples consumed than the dataset holds.
    """
    if consumed > total:
        raise ValueError(
            f"The resumed run consumed {consumed} samples but the dataset holds {total}: the "
            "checkpoint belongs to a different dataset or split. Check data_path/split, or reset "
            "MegatronLMPlugin(consumed_samples=...)."
        )
    stop = consumed + (total - consumed) // global_batch_size * global_batch_size
    return range(consumed, stop)


def _common_config(args: SimpleNamespace, data: dict[str, Any]) -> dict[str, Any]:
    per_split = [data.get(f"{name}_data_path") for name in _SPLITS]
    blend = blend_from_data_path(data.get("data_path"))
    config: dict[str, Any] = {
        "random_seed": int(_get(args, "seed", 1234)),
        "path_to_cache": data.get("data_cache_path"),
        "mmap_bin_files": bool(data.get("mmap_bin_files", True)),
        "num_dataset_builder_threads": int(data.get("num_dataset_builder_threads") or 1),
    }
    if any(path is not None for path in per_split):
        if blend is not None:
            raise ValueError(
                "MegatronLMDummyDataLoader: give data_path (with split) or "
                "train/valid/test_data_path, not both."
            )
        config["blend_per_split"] = [blend_from_data_path(path) for path in per_split]
        return config
    if blend is None and not data.get("mock_data"):
        raise ValueError(
            "MegatronLMDummyDataLoader needs data_path=... (the prefix of Megatron's indexed "
            ".bin/.idx files, or weights and prefixes), train/valid/test_data_path, or "
            "mock_data=True for synthetic GPT samples."
        )
    config["blend"] = blend
    if blend is not None:
        split = data.get("splits_string") or data.get("split") or "969, 30, 1"
        config["split"] = ",".join(f"{value:.12f}" for value in parse_split(split))
    return config


def _masking(data: dict[str, Any], max_ngram: int, geometric: bool) -> dict[str, Any]:
    return {
        "masking_probability": float(data.get("mask_prob") or 0.15),
        "short_sequence_probability": float(data.get("short_seq_prob") or 0.1),
        "masking_max_ngram": max_ngram,
        "masking_do_full_word": True,
        "masking_do_permutation": False,
        "masking_use_longer_ngrams": False,
        "masking_use_geometric_distribution": geometric,
    }


def dataset_config_kwargs(args: SimpleNamespace, data: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of the dataset config for ``args.model_type_name`` (tokenizer aside).

    GPT: ``GPTDatasetConfig`` (masks come from the train step, so none are stored); BERT:
    ``BERTMaskedWordPieceDatasetConfig`` (Megatron's masking defaults, ``bert_binary_head`` as the
    classification head); T5: ``T5MaskedWordPieceDatasetConfig`` (encoder/decoder lengths).

    Raises:
        ValueError: no data path, both kinds of paths, a bad split or dataloader type, mock data
            for BERT/T5, or a model type without a dataset.
    """
    kind = str(_get(args, "model_type_name", ""))
    if str(data.get("dataloader_type") or "single") != "single":
        raise ValueError(
            f"MegatronLMDummyDataLoader(dataloader_type={data.get('dataloader_type')!r}): hasten "
            "reads Megatron's datasets in order ('single'; megatron-core's datasets shuffle "
            "their samples themselves). Use dataloader_type='single'."
        )
    config = _common_config(args, data)
    if kind == "gpt":
        config.update(
            sequence_length=int(args.seq_length),
            reset_position_ids=bool(data.get("reset_position_ids", False)),
            reset_attention_mask=bool(data.get("reset_attention_mask", False)),
            eod_mask_loss=bool(_get(args, "eod_mask_loss", False)),
            create_attention_mask=False,
        )
        return config
    if kind not in ("bert", "t5"):
        raise ValueError(
            f"Megatron's datasets exist for GPT, BERT and T5 models, not "
            f"model_type_name={kind!r}; give MegatronLMPlugin("
            "custom_megatron_datasets_provider_function=...) or a torch DataLoader."
        )
    if config.get("blend") is None and "blend_per_split" not in config:
        raise ValueError(
            f"mock_data=True makes GPT samples only; a {kind.upper()} model needs data_path=... "
            "(a Megatron indexed dataset of sentences)."
        )
    if kind == "bert":
        config.update(
            sequence_length=int(args.seq_length),
            classification_head=bool(_get(args, "bert_binary_head", False)),
            **_masking(data, max_ngram=3, geometric=False),
        )
        return config
    encoder = int(_get(args, "encoder_seq_length", args.seq_length))
    config.update(
        sequence_length=encoder,
        sequence_length_decoder=int(_get(args, "decoder_seq_length", encoder)),
        **_masking(data, max_ngram=10, geometric=True),
    )
    return config


class IdsTokenizer:
    """The tokenizer facts a GPT dataset of token ids needs: end-of-document id, vocabulary size.

    Args:
        eod: the end-of-document token id (the model's ``eos_token_id``).
        vocab_size: the vocabulary size.
    """

    def __init__(self, eod: int | None, vocab_size: int | None) -> None:
        self.eod = eod
        self.vocab_size = vocab_size

    @property
    def unique_identifiers(self) -> OrderedDict:
        """What megatron-core hashes into a dataset's cache name."""
        return OrderedDict(
            [("class", type(self).__qualname__), ("eod", self.eod), ("vocab", self.vocab_size)]
        )


def dataset_tokenizer(args: SimpleNamespace, data: dict[str, Any]) -> Any:
    """The dataset's tokenizer: ``tokenizer=`` of the dummy loader, else (GPT) the ids it needs.

    Raises:
        ValueError: BERT/T5 without a tokenizer (masking needs its special tokens and vocabulary).
    """
    if data.get("tokenizer") is not None:
        return data["tokenizer"]
    if args.model_type_name != "gpt":
        raise ValueError(
            f"Megatron's {args.model_type_name.upper()} datasets mask words with the tokenizer's "
            "special tokens and vocabulary: pass MegatronLMDummyDataLoader(tokenizer=...), a "
            "megatron-core tokenizer (megatron.core.tokenizers.MegatronTokenizer.from_pretrained)."
        )
    return IdsTokenizer(
        _get(args, "eod_token_id"), _get(args, "orig_vocab_size") or _get(args, "padded_vocab_size")
    )


def _gpt_batch(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    batch = default_collate(samples)
    # The GPT train step reads Megatron's "text": one token more than the sequence.
    return {"text": torch.cat([batch["tokens"][:, :1], batch["labels"]], dim=1).long()}


def _masked_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return batch["labels"].long().masked_fill(batch["loss_mask"] == 0, -100)


def _bert_batch(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    batch = default_collate(samples)
    return {
        "input_ids": batch["text"].long(),
        "token_type_ids": batch["types"].long(),
        "attention_mask": batch["padding_mask"].long(),
        "labels": _masked_labels(batch),
        "next_sentence_label": batch["is_random"].long(),
    }


def _t5_batch(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    batch = default_collate(samples)
    return {
        "input_ids": batch["text_enc"].long(),
        "decoder_input_ids": batch["text_dec"].long(),
        "attention_mask": batch["enc_mask"].long(),
        "labels": _masked_labels(batch),
    }


def collate_for(sample: Any) -> Callable[[list[Any]], Any]:
    """The collate function for ``sample``'s kind: megatron-core GPT/BERT/T5 samples become the
    batches the train steps read (``text`` for GPT, HF keys for BERT/T5); others collate as-is."""
    keys = set(sample) if isinstance(sample, dict) else set()
    if {"tokens", "labels"} <= keys:
        return _gpt_batch
    if {"text_enc", "text_dec", "labels", "loss_mask"} <= keys:
        return _t5_batch
    if {"text", "types", "labels", "loss_mask", "padding_mask"} <= keys:
        return _bert_batch
    return default_collate


def build_datasets(args: SimpleNamespace, data: dict[str, Any], sizes: list[int]) -> list[Any]:
    """Build the train/valid/test datasets with megatron-core (None for an empty split)."""
    # optional: megatron-core
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )

    kwargs = dataset_config_kwargs(args, data)
    tokenizer = dataset_tokenizer(args, data)
    if args.model_type_name == "gpt":
        from megatron.core.datasets import gpt_dataset  # optional: megatron-core

        config: Any = gpt_dataset.GPTDatasetConfig(tokenizer=tokenizer, **kwargs)
        cls: Any = gpt_dataset.MockGPTDataset if config.mock else gpt_dataset.GPTDataset
    elif args.model_type_name == "bert":
        from megatron.core.datasets import bert_dataset  # optional: megatron-core

        config = bert_dataset.BERTMaskedWordPieceDatasetConfig(tokenizer=tokenizer, **kwargs)
        cls = bert_dataset.BERTMaskedWordPieceDataset
    else:
        from megatron.core.datasets import t5_dataset  # optional: megatron-core

        config = t5_dataset.T5MaskedWordPieceDatasetConfig(tokenizer=tokenizer, **kwargs)
        cls = t5_dataset.T5MaskedWordPieceDataset
    # Every rank builds (rank 0 first, the others then read its cached indices): the BERT/T5
    # train steps read their batch on every tensor-parallel rank.
    return list(BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build())
