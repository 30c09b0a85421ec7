"""hasten's DeepSpeed checkpoint engine and the engine-file sink it writes through (no deepspeed)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.checkpointing import checksum
from hasten.checkpointing.engine import EngineFiles
from hasten.strategies.deepspeed.checkpoint import HastenCheckpointEngine, check_checkpoint_engine


class _TorchEngine:
    """Stands for DeepSpeed's TorchCheckpointEngine: records what it was asked to do."""

    zipfile_serialization = True

    def __init__(self, decoupled: bool = False) -> None:
        self.saved: list[str] = []
        self.decoupled = decoupled

    def save(self, state_dict: Any, path: str) -> None:
        self.saved.append(path)

    def is_decoupled(self) -> bool:
        return self.decoupled

    def commit(self, info: Any) -> bool:
        return True


def _state() -> dict[str, Any]:
    return {"module": {"w": torch.arange(6.0)}, "ds_version": "0.19.8", "step": 3}


def test_files_go_through_the_sink_only_while_hasten_saves(tmp_path: Path) -> None:
    inner = _TorchEngine()
    engine = HastenCheckpointEngine(inner)
    (tmp_path / "tag").mkdir()
    files = EngineFiles(tmp_path)
    with engine.writing_to(files):
        engine.save(_state(), str(tmp_path / "tag" / "model_states.pt"))
    engine.save(_state(), str(tmp_path / "direct.pt"))  # a direct engine.save_checkpoint
    assert inner.saved == [str(tmp_path / "direct.pt")]
    assert engine.commit(None) is True  # everything else is the wrapped engine's
    (record,) = files.finish()
    data = (tmp_path / "tag" / "model_states.pt").read_bytes()
    assert record.name == "tag/model_states.pt"
    assert record.size == len(data)
    assert list(record.blocks) == checksum.block_digests(data, checksum.BLOCK_BYTES)
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    assert torch.equal(loaded["module"]["w"], torch.arange(6.0)) and loaded["step"] == 3


def test_an_asynchronous_sink_copies_now_and_writes_later(tmp_path: Path) -> None:
    engine = HastenCheckpointEngine(_TorchEngine())
    state = _state()
    files = EngineFiles(
        tmp_path, copy=lambda obj: {**obj, "module": {"w": obj["module"]["w"].clone()}}
    )
    with engine.writing_to(files):
        engine.save(state, str(tmp_path / "zero.pt"))
    state["module"]["w"].add_(100)  # training goes on before the file is written
    assert not (tmp_path / "zero.pt").exists()
    ((name, write),) = files.jobs()
    buffer = io.BytesIO()
    write(buffer)
    assert name == "zero.pt"
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    assert torch.equal(loaded["module"]["w"], torch.arange(6.0))


def test_a_failed_engine_file_is_reported_by_finish_not_raised_into_the_engine(
    tmp_path: Path,
) -> None:
    files = EngineFiles(tmp_path)

    def fail(obj: Any, handle: Any) -> None:
        raise OSError(28, "No space left on device")

    files.write(str(tmp_path / "a.pt"), {}, fail)  # returns: the engine goes on to its barrier
    files.write(str(tmp_path.parent / "outside.pt"), {}, fail)  # ignored after a failure
    assert files.failure is not None and files.failure[0] == "a.pt"
    with pytest.raises(OSError, match="No space left"):
        files.finish()


def test_a_file_outside_the_checkpoint_folder_is_refused(tmp_path: Path) -> None:
    files = EngineFiles(tmp_path / "ckpt")
    files.write(str(tmp_path / "elsewhere.pt"), {}, lambda obj, handle: None)
    with pytest.raises(ValueError, match="outside the checkpoint folder"):
        files.finish()


def test_a_decoupled_deepspeed_writer_is_refused_naming_the_setting() -> None:
    class _Engine:
        checkpoint_engine = _TorchEngine(decoupled=True)

    with pytest.raises(ValueError, match=r"checkpoint.writer.decoupled.*async_save=True"):
        check_checkpoint_engine(_Engine())
    _Engine.checkpoint_engine = _TorchEngine()
    check_checkpoint_engine(_Engine())  # a synchronous one is fine


def test_on_first_write_runs_once_before_the_first_engine_file(tmp_path: Path) -> None:
    seen: list[bool] = []
    files = EngineFiles(tmp_path, on_first_write=lambda: seen.append((tmp_path / "a.pt").exists()))
    for name in ("a.pt", "b.pt"):
        files.write(str(tmp_path / name), {"x": 1}, lambda obj, handle: torch.save(obj, handle))
    assert seen == [False]  # once, before a.pt was written
    assert [r.name for r in files.finish()] == ["a.pt", "b.pt"]
