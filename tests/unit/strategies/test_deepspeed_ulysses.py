"""DeepSpeed's Ulysses sequence parallelism: what it needs, said clearly when missing.

The 2-process run (Trainer, ZeRO-3, sp_size=2) is tests/ecosystem/test_trainer.py's.
"""

from __future__ import annotations

import pytest
import torch

from hasten.config.parallelism import ParallelismConfig
from hasten.strategies.deepspeed import ulysses

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")


def test_sequence_parallel_is_only_deepspeeds_sp() -> None:
    assert ulysses.sequence_parallel(None) is None
    assert ulysses.sequence_parallel(ParallelismConfig()) is None
    config = ParallelismConfig(sp_size=2)
    assert ulysses.sequence_parallel(config) is config


def test_an_old_deepspeed_is_named_with_the_version_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ulysses, "compare_versions", lambda *args: False)
    with pytest.raises(ImportError, match=r"needs deepspeed>=0.18.2, but deepspeed .* installed"):
        ulysses.register_attention(torch.nn.Linear(1, 1), ParallelismConfig(sp_size=2), 1)


def test_a_model_without_a_config_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import deepspeed

    monkeypatch.setattr(deepspeed.comm, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match=r"replaces the attention of a transformers model"):
        ulysses.register_attention(torch.nn.Linear(1, 1), ParallelismConfig(sp_size=2), 1)


def test_the_loader_adapter_needs_a_prepared_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from deepspeed.utils import groups

    monkeypatch.setattr(groups, "mpu", None)
    with pytest.raises(RuntimeError, match=r"call accelerator.prepare\(model, ...\) first"):
        ulysses.adapt_data_loader([], torch.device("cpu"))
