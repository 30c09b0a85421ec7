"""Megatron's datasets for MegatronLMDummyDataLoader: argument mapping, splits, sizes, order, resume.

The pure parts run everywhere; the last tests build real megatron-core datasets (GPT from a tiny
indexed dataset written here, and mock GPT data) on CPU and skip when megatron-core is missing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hasten.core.imports import is_package_available
from hasten.strategies.megatron import datasets as mds
from hasten.strategies.megatron.data import MegatronLMDummyDataLoader, dataset_loader


def run_args(**overrides: object) -> SimpleNamespace:
    values: dict = {
        "model_type_name": "gpt",
        "seq_length": 8,
        "seed": 1234,
        "global_batch_size": 4,
        "train_iters": 3,
        "eval_iters": 1,
        "eval_interval": 2,
        "eod_token_id": 0,
        "orig_vocab_size": 50,
        "eod_mask_loss": False,
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def data_args(**kwargs: object) -> dict:
    return MegatronLMDummyDataLoader(**kwargs).dataset_args


def test_blend_from_data_path() -> None:
    assert mds.blend_from_data_path(None) is None
    assert mds.blend_from_data_path("corpus_text_document") == (["corpus_text_document"], None)
    assert mds.blend_from_data_path(["a", "b", "c"]) == (["a", "b", "c"], None)
    assert mds.blend_from_data_path("0.3 a 0.7 b") == (["a", "b"], [0.3, 0.7])
    assert mds.blend_from_data_path(["0.3", "a", "0.7", "b"]) == (["a", "b"], [0.3, 0.7])
    assert mds.blend_from_data_path(["a", "b"]) == (["a", "b"], None)  # even, but no weights
    with pytest.raises(ValueError, match=r"names no dataset"):
        mds.blend_from_data_path([])
    with pytest.raises(ValueError, match=r"weights must be >= 0 and not all zero"):
        mds.blend_from_data_path("-1 a 2 b")


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        ("969, 30, 1", [0.969, 0.03, 0.001]),
        ("98/2/0", [0.98, 0.02, 0.0]),
        ("1", [1.0, 0.0, 0.0]),
        ([8, 1, 1], [0.8, 0.1, 0.1]),
    ],
)
def test_split_parsing(split: object, expected: list[float]) -> None:
    assert mds.parse_split(split) == pytest.approx(expected)


@pytest.mark.parametrize("split", ["", "a,b", "1,2,3,4", "1,-1,0", "0,0,0"])
def test_bad_splits_are_refused(split: str) -> None:
    with pytest.raises(ValueError, match=r"up to three non-negative weights"):
        mds.parse_split(split)


def test_samples_per_split_count_like_megatron() -> None:
    # train 3 iterations x 4; valid (3 // 2 + 1) x 1 iterations; test 1 iteration
    assert mds.num_samples_per_split(run_args()) == [12, 8, 4]
    assert mds.num_samples_per_split(run_args(train_iters=None, train_samples=10)) == [10, 8, 4]
    with pytest.raises(ValueError, match=r"sized by the length of training"):
        mds.num_samples_per_split(run_args(train_iters=None))


def test_consumed_samples_and_the_indices_left() -> None:
    assert mds.consumed_samples(run_args()) == [0, 0, 0]
    assert mds.consumed_samples(run_args(consumed_samples=[8])) == [8, 0, 0]
    with pytest.raises(ValueError, match=r"holds -1 for the valid split"):
        mds.consumed_samples(run_args(consumed_samples=[0, -1, 0]))
    # whole global batches after the consumed samples; the incomplete last one is dropped
    assert mds.sample_indices(23, consumed=4, global_batch_size=8) == range(4, 20)
    assert mds.sample_indices(4, consumed=4, global_batch_size=8) == range(4, 4)
    with pytest.raises(ValueError, match=r"consumed 30 samples but the dataset holds 23"):
        mds.sample_indices(23, consumed=30, global_batch_size=8)


def test_gpt_dataset_config_from_the_dummy_and_the_run() -> None:
    config = mds.dataset_config_kwargs(
        run_args(eod_mask_loss=True), data_args(data_path="0.5 a 0.5 b", split="98,2,0")
    )
    assert config["blend"] == (["a", "b"], [0.5, 0.5])
    assert [float(x) for x in config["split"].split(",")] == pytest.approx([0.98, 0.02, 0.0])
    assert (config["sequence_length"], config["random_seed"]) == (8, 1234)
    assert config["eod_mask_loss"] and not config["reset_position_ids"]
    assert config["create_attention_mask"] is False  # the train step makes the masks
    # Accelerate's docs spell the split "splits_string"
    config = mds.dataset_config_kwargs(run_args(), data_args(data_path="a", splits_string="1,1,0"))
    assert [float(x) for x in config["split"].split(",")] == pytest.approx([0.5, 0.5, 0.0])
    mock = mds.dataset_config_kwargs(run_args(), data_args(mock_data=True))
    assert mock["blend"] is None and "split" not in mock
    per_split = mds.dataset_config_kwargs(
        run_args(), data_args(train_data_path="t", valid_data_path="v")
    )
    assert per_split["blend_per_split"] == [(["t"], None), (["v"], None), None]


def test_bert_and_t5_dataset_configs() -> None:
    bert = mds.dataset_config_kwargs(
        run_args(model_type_name="bert", bert_binary_head=True), data_args(data_path="a")
    )
    assert bert["classification_head"] and bert["masking_probability"] == 0.15
    assert (bert["masking_max_ngram"], bert["masking_use_geometric_distribution"]) == (3, False)
    t5 = mds.dataset_config_kwargs(
        run_args(model_type_name="t5", encoder_seq_length=16, decoder_seq_length=4),
        data_args(data_path="a", mask_prob=0.2),
    )
    assert (t5["sequence_length"], t5["sequence_length_decoder"]) == (16, 4)
    assert t5["masking_probability"] == 0.2 and t5["masking_use_geometric_distribution"]


@pytest.mark.parametrize(
    ("kind", "data", "message"),
    [
        ("gpt", {}, r"needs data_path=.*or mock_data=True"),
        ("gpt", {"data_path": "a", "train_data_path": "t"}, r"not both"),
        ("gpt", {"data_path": "a", "dataloader_type": "cyclic"}, r"Use dataloader_type='single'"),
        ("bert", {"mock_data": True}, r"a BERT model needs data_path"),
        ("mamba", {"data_path": "a"}, r"not model_type_name='mamba'"),
    ],
)
def test_bad_dataset_arguments_are_refused(kind: str, data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mds.dataset_config_kwargs(run_args(model_type_name=kind), data_args(**data))


def test_the_datasets_tokenizer() -> None:
    given = object()
    assert mds.dataset_tokenizer(run_args(), data_args(tokenizer=given)) is given
    ids = mds.dataset_tokenizer(run_args(eod_token_id=7), data_args())
    assert (ids.eod, ids.vocab_size) == (7, 50)
    assert ids.unique_identifiers["eod"] == 7
    with pytest.raises(ValueError, match=r"T5 datasets mask words.*tokenizer=\.\.\."):
        mds.dataset_tokenizer(run_args(model_type_name="t5"), data_args())


def test_megatron_samples_become_the_train_steps_batches() -> None:
    gpt = [{"tokens": torch.tensor([1, 2]), "labels": torch.tensor([2, 3])}] * 2
    assert mds.collate_for(gpt[0])(gpt)["text"].tolist() == [[1, 2, 3], [1, 2, 3]]
    bert = {
        "text": torch.tensor([5, 6]).numpy(),
        "types": torch.tensor([0, 1]).numpy(),
        "labels": torch.tensor([-1, 9]).numpy(),
        "loss_mask": torch.tensor([0, 1]).numpy(),
        "padding_mask": torch.tensor([1, 1]).numpy(),
        "is_random": 1,
        "truncated": 0,
    }
    batch = mds.collate_for(bert)([bert])
    assert batch["labels"].tolist() == [[-100, 9]] and batch["next_sentence_label"].tolist() == [1]
    assert batch["token_type_ids"].tolist() == [[0, 1]] and batch["input_ids"].dtype == torch.long
    t5 = {
        "text_enc": torch.tensor([5, 6, 0]).numpy(),
        "text_dec": torch.tensor([1, 7]).numpy(),
        "labels": torch.tensor([7, 2]).numpy(),
        "loss_mask": torch.tensor([1, 1]).numpy(),
        "enc_mask": torch.tensor([1, 1, 0]).numpy(),
        "dec_mask": torch.tensor([1, 1]).numpy(),
        "truncated": 0,
    }
    batch = mds.collate_for(t5)([t5])
    assert batch["decoder_input_ids"].tolist() == [[1, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0]] and batch["labels"].tolist() == [[7, 2]]
    plain = {"input_ids": torch.tensor([1])}
    assert set(mds.collate_for(plain)([plain])) == {"input_ids"}


def numbered(n: int) -> list[dict]:
    return [{"tokens": torch.tensor([i]), "labels": torch.tensor([i])} for i in range(n)]


def test_loader_order_matches_megatrons_sampler_over_two_ranks() -> None:
    """Global step g gives rank r samples g*G + r*b ... (b = 2 per rank, G = 4), after 4 consumed."""
    seen = {}
    for rank in (0, 1):
        loader = dataset_loader(
            numbered(22),
            consumed=4,
            batch_size=2,
            rank=rank,
            size=2,
            device=torch.device("cpu"),
        )
        seen[rank] = [batch["text"][:, 0].tolist() for batch in loader]
    assert seen[0] == [[4, 5], [8, 9], [12, 13], [16, 17]]
    assert seen[1] == [[6, 7], [10, 11], [14, 15], [18, 19]]


# ---------------------------------------------------------------- real megatron-core, on CPU

needs_mcore = pytest.mark.skipif(
    not is_package_available("megatron"), reason="megatron-core is not installed"
)


def write_indexed_dataset(prefix: Path, documents: int = 64, length: int = 20) -> None:
    """A tiny Megatron indexed dataset (.bin + .idx) of counting documents ending in eod (0)."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.int32)
    for doc in range(documents):
        tokens = [(doc + i) % 40 + 1 for i in range(length - 1)] + [0]
        builder.add_item(torch.tensor(tokens, dtype=torch.int32))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


@needs_mcore
def test_megatron_core_builds_gpt_datasets_from_an_indexed_dataset(tmp_path: Path) -> None:
    prefix = tmp_path / "corpus_text_document"
    write_indexed_dataset(prefix)
    data = data_args(data_path=str(prefix), split="90,10,0", data_cache_path=str(tmp_path / "c"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = mds.build_datasets(run_args(), data, mds.num_samples_per_split(run_args()))
    train, valid, test = built
    assert test is None and len(train) >= 12 and len(valid) >= 8
    sample = train[0]
    assert sample["tokens"].shape == (8,) and torch.equal(
        sample["tokens"][1:], sample["labels"][:-1]
    )
    loader = dataset_loader(
        train, consumed=0, batch_size=4, rank=0, size=1, device=torch.device("cpu")
    )
    batch = next(iter(loader))
    assert batch["text"].shape == (4, 9)  # the sequence plus the next token
    assert batch["text"].max().item() <= 40


@needs_mcore
def test_megatron_core_builds_mock_gpt_data() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train, valid, test = mds.build_datasets(
            run_args(), data_args(mock_data=True), mds.num_samples_per_split(run_args())
        )
    assert len(train) >= 12 and train[0]["tokens"].shape == (8,)
