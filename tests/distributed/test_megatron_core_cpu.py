"""megatron-core's own classes on two CPU processes: the GPT/BERT/T5 builders and the dataset
pipeline of MegatronLMDummyDataLoader (forward needs CUDA; building does not). Skips without
megatron-core."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from _support.distributed import run_distributed
from hasten.core.imports import is_package_available

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(
        not is_package_available("megatron"), reason="megatron-core is not installed"
    ),
]

TESTS = Path(__file__).resolve().parents[1] / "unit" / "strategies"


def _build_everything(folder: str) -> dict:
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(TESTS))
    import torch
    from megatron.core import parallel_state
    from test_megatron import TinyGPT2  # type: ignore[import-not-found]
    from test_megatron_datasets import data_args, write_indexed_dataset  # type: ignore[import-not-found]
    from test_megatron_models_fp8 import (  # type: ignore[import-not-found]
        MegatronBertForPreTraining,
        T5ForConditionalGeneration,
        run_args,
    )

    from hasten.state import PartialState
    from hasten.strategies.megatron import datasets
    from hasten.strategies.megatron.data import dataset_loader
    from hasten.strategies.megatron.models import MODEL_BUILDERS

    state = PartialState()
    parallel_state.initialize_model_parallel(1, 1)
    sizes = {}
    for model, kind in [
        (TinyGPT2(), "gpt"),
        (MegatronBertForPreTraining(), "bert"),
        (T5ForConditionalGeneration(), "t5"),
    ]:
        args = run_args(model, other_megatron_args={"use_cpu_initialization": True})
        built = MODEL_BUILDERS[kind](args, pre_process=True, post_process=True)
        sizes[kind] = (type(built).__name__, sum(p.numel() for p in built.parameters()))
    prefix = Path(folder) / "corpus_text_document"
    if state.is_main_process:
        write_indexed_dataset(prefix)
    state.wait_for_everyone()
    args = run_args(TinyGPT2())
    args.global_batch_size, args.train_iters, args.eval_iters = 4, 3, 1
    data = data_args(data_path=str(prefix), split="90,10,0", data_cache_path=f"{folder}/cache")
    train, _, _ = datasets.build_datasets(args, data, datasets.num_samples_per_split(args))
    loader = dataset_loader(
        train,
        consumed=0,
        batch_size=2,
        rank=parallel_state.get_data_parallel_rank(),
        size=parallel_state.get_data_parallel_world_size(),
        device=torch.device("cpu"),
    )
    first = next(iter(loader))["text"]
    expected = torch.stack(
        [torch.cat([train[i]["tokens"][:1], train[i]["labels"]]) for i in range(4)]
    )
    mine = expected[2 * state.process_index : 2 * state.process_index + 2]
    parallel_state.destroy_model_parallel()
    return {"sizes": sizes, "batch_is_mine": bool(torch.equal(first, mine))}


def test_megatron_core_builds_models_and_datasets_on_cpu(tmp_path: Path) -> None:
    results = run_distributed(_build_everything, str(tmp_path), world_size=2, timeout=120)
    for result in results:
        assert result["batch_is_mine"]
        assert [name for name, _ in result["sizes"].values()] == [
            "GPTModel",
            "BertModel",
            "T5Model",
        ]
        assert all(count > 0 for _, count in result["sizes"].values())
    assert results[0]["sizes"] == results[1]["sizes"]
