"""hasten's DeepSpeed checkpoint engine, the engine-file sink it writes through and the verified
source it reads from (no deepspeed)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.checkpointing.layouts.engine import load_engine_checkpoint
from hasten.checkpointing.storage import checksum
from hasten.checkpointing.storage.engine_files import EngineFiles, EngineReads, files_to_verify
from hasten.checkpointing.storage.manifest import (
    CorruptCheckpointError,
    read_manifest,
    write_bytes,
    write_manifest,
)
from hasten.strategies.deepspeed.checkpoint import (
    HastenCheckpointEngine,
    check_checkpoint_engine,
    file_readers,
)
from hasten.strategies.deepspeed.strategy import DeepSpeedStrategy


class _TorchEngine:
    """Stands for DeepSpeed's TorchCheckpointEngine: records what it was asked to do."""

    zipfile_serialization = True

    def __init__(self, decoupled: bool = False) -> None:
        self.saved: list[str] = []
        self.loaded: list[Any] = []
        self.decoupled = decoupled

    def save(self, state_dict: Any, path: str) -> None:
        self.saved.append(path)

    def load(self, path: Any, map_location: Any = None) -> Any:
        self.loaded.append(path)
        # as DeepSpeed's TorchCheckpointEngine: its files hold objects beyond tensors
        return torch.load(path, map_location=map_location, weights_only=False)

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


def _engine_checkpoint(folder: Path) -> dict[str, Any]:
    """A checkpoint folder with two engine files in a tag folder, and its manifest."""
    (folder / "tag").mkdir(parents=True)
    records = []
    for name in ("tag/mp_rank_00_model_states.pt", "tag/zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        stream = io.BytesIO()
        torch.save(_state(), stream)
        records.append(write_bytes(folder, name, stream.getvalue()))
    write_manifest(folder, records, {})
    return read_manifest(folder)


def test_while_hasten_loads_each_file_is_verified_once_and_parsed_by_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    manifest = _engine_checkpoint(tmp_path)
    inner = _TorchEngine()
    engine = HastenCheckpointEngine(inner)
    model_file = str(tmp_path / "tag" / "mp_rank_00_model_states.pt")
    opened: list[str] = []
    real_open = builtins.open
    monkeypatch.setattr(
        builtins, "open", lambda f, *a, **k: opened.append(str(f)) or real_open(f, *a, **k)
    )
    with EngineReads(tmp_path, manifest) as files:
        files.verify(["tag/mp_rank_00_model_states.pt"])
        with engine.reading_from(files):
            for _ in range(2):  # DeepSpeed parses its model file twice
                loaded = engine.load(model_file, map_location="cpu")
                assert torch.equal(loaded["module"]["w"], torch.arange(6.0))
            # a file this process was not expected to read is verified when it is read
            engine.load(str(tmp_path / "tag" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    assert opened == [
        model_file,
        str(tmp_path / "tag" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    ]
    # the engine's own load parsed the verified bytes (a file object, printed as the path)
    assert [str(p) for p in inner.loaded] == [model_file, model_file, opened[1]]
    assert not any(isinstance(p, str) for p in inner.loaded)
    monkeypatch.undo()
    assert engine.load(model_file)["step"] == 3  # outside load_state: the engine's own load
    assert inner.loaded[-1] == model_file


def test_a_damaged_or_foreign_file_is_refused_before_the_engine_parses_it(tmp_path: Path) -> None:
    manifest = _engine_checkpoint(tmp_path)
    target = tmp_path / "tag" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    (tmp_path / "tag" / "extra.pt").write_bytes(b"x")
    inner = _TorchEngine()
    engine = HastenCheckpointEngine(inner)
    with EngineReads(tmp_path, manifest) as files:
        with pytest.raises(CorruptCheckpointError, match=r"zero_pp_rank_0_mp_rank_00.*corrupted"):
            files.verify(["tag/zero_pp_rank_0_mp_rank_00_optim_states.pt"])
        with engine.reading_from(files):
            with pytest.raises(CorruptCheckpointError, match=r"zero_pp_rank_0.*corrupted"):
                engine.load(str(target))
            with pytest.raises(CorruptCheckpointError, match=r"extra\.pt is not listed"):
                engine.load(str(tmp_path / "tag" / "extra.pt"))
            with pytest.raises(CorruptCheckpointError, match="not part of the checkpoint"):
                engine.load(str(tmp_path.parent / "elsewhere.pt"))
    assert inner.loaded == []


def test_each_engine_file_is_verified_by_a_process_whose_engine_reads_it() -> None:
    names = [
        "pytorch_model/mp_rank_00_model_states.pt",
        "pytorch_model/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "pytorch_model/zero_pp_rank_1_mp_rank_00_model_states.pt",
        "pytorch_model/zero_pp_rank_2_mp_rank_00_optim_states.pt",  # saved on 3 processes
        "pytorch_model/layer_0_expert_0_mp_rank_00_model_states.pt",
        "pytorch_model/zero_to_fp32.py",
    ]

    def readers(name: str, count: int) -> Any:
        return file_readers(name.rpartition("/")[2], count)

    shares = [files_to_verify(names, i, 2, readers) for i in range(2)]
    assert shares[0] == [names[0], names[1], names[4], names[6]]
    assert shares[1] == [names[0], names[2], names[3], names[5]]
    assert set(shares[0]) | set(shares[1]) == set(names)  # nothing left unchecked


class _ZeroEngine:
    """Stands for a DeepSpeedEngine's checkpoint settings."""

    def __init__(
        self, stage: int, elastic: bool = False, universal: bool = False, nvme: bool = False
    ) -> None:
        self.stage, self.elastic, self.universal, self.nvme = stage, elastic, universal, nvme

    def zero_optimization(self) -> bool:
        return self.stage > 0

    def zero_optimization_stage(self) -> int:
        return self.stage

    def zero_nvme_offload_optimizer(self) -> bool:
        return self.nvme

    def zero_elastic_checkpoint(self) -> bool:
        return self.elastic

    def load_universal_checkpoint(self) -> bool:
        return self.universal


class _Engines:
    """An engine-writing strategy whose engine cannot load on another number of processes."""

    def __init__(self, *engines: _ZeroEngine) -> None:
        self.engines = list(engines)
        self.loaded = False

    refuses_process_count = DeepSpeedStrategy.refuses_process_count

    def load_checkpoint(self, folder: Path, strict: bool = True, files: Any = None) -> None:
        self.loaded = True

    def file_readers(self, name: str, num_processes: int) -> Any:
        return ()


def test_only_nvme_offloaded_zero_partitions_are_refused_on_another_number_of_processes() -> None:
    # stages 1-3 are repartitioned through DeepSpeed's universal checkpoint on load
    for stage in range(4):
        assert _Engines(_ZeroEngine(stage)).refuses_process_count(2, 1) is None
    reason = _Engines(_ZeroEngine(0), _ZeroEngine(3, nvme=True)).refuses_process_count(1, 2)
    assert reason is not None
    assert reason.startswith("This DeepSpeed checkpoint was saved by 1 process(es) and is loaded")
    assert "offloaded to NVMe" in reason


def test_load_engine_checkpoint_refuses_before_the_engine_reads(tmp_path: Path) -> None:
    engines = _Engines(_ZeroEngine(2, nvme=True))
    manifest = {"num_processes": 2, "files": {}}
    with pytest.raises(ValueError, match=r"saved by 2 process\(es\) and is loaded by 1: its"):
        load_engine_checkpoint(engines, tmp_path, manifest, True, lambda error: None)
    assert not engines.loaded
    load_engine_checkpoint(engines, tmp_path, {"num_processes": 1, "files": {}}, True, print)
    assert engines.loaded
