"""Checkpoint loading: files, shards, folders, dtypes, disk offload, bad checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hasten.big_modeling.init import init_empty_weights
from hasten.big_modeling.loading import checkpoint_files, load_checkpoint_in_model, load_state_dict
from unit.big_modeling.bm_models import TinyLM


def _state(model: TinyLM) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def save_sharded(model: TinyLM, folder: Path, shards: int = 3, safe: bool = True) -> Path:
    """Save ``model`` as ``shards`` files plus an index, like transformers does."""
    folder.mkdir(parents=True, exist_ok=True)
    state = _state(model)
    keys = list(state)
    weight_map = {}
    for s in range(shards):
        part = {k: state[k] for k in keys[s::shards]}
        name = f"model-{s + 1:05d}-of-{shards:05d}.{'safetensors' if safe else 'bin'}"
        save_file(part, folder / name) if safe else torch.save(part, folder / name)
        weight_map |= dict.fromkeys(part, name)
    index = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
    (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _empty() -> TinyLM:
    with init_empty_weights():
        return TinyLM()


def _assert_same(model: torch.nn.Module, source: torch.nn.Module) -> None:
    got = model.state_dict()
    for name, tensor in source.state_dict().items():
        assert torch.equal(got[name], tensor), name


def test_load_state_dict_safetensors_and_bin(tmp_path: Path) -> None:
    source = TinyLM()
    save_file(_state(source), tmp_path / "m.safetensors")
    torch.save(_state(source), tmp_path / "m.bin")
    for path in (tmp_path / "m.safetensors", tmp_path / "m.bin"):
        loaded = load_state_dict(path)
        assert set(loaded) == set(_state(source))
        assert torch.equal(loaded["h.0.attn.weight"], source.h[0].attn.weight)
    mapped = load_state_dict(tmp_path / "m.safetensors", device_map={"h": "disk", "": "cpu"})
    assert mapped["h.1.proj.bias"].device.type == "cpu"


def test_load_state_dict_refuses_pickled_code_and_corrupt_files(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(1), "evil": Path("x")}, tmp_path / "evil.bin")
    with pytest.raises(ValueError, match="Could not read checkpoint file .*evil.bin"):
        load_state_dict(tmp_path / "evil.bin")
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(ValueError, match="junk.safetensors"):
        load_state_dict(tmp_path / "junk.safetensors")


def test_checkpoint_files_resolves_files_indexes_and_folders(tmp_path: Path) -> None:
    folder = save_sharded(TinyLM(), tmp_path / "ckpt")
    shards = checkpoint_files(folder)
    assert len(shards) == 3 and all(s.endswith(".safetensors") for s in shards)
    assert checkpoint_files(folder / "model.safetensors.index.json") == shards
    assert checkpoint_files(shards[0]) == [shards[0]]
    single = tmp_path / "single"
    single.mkdir()
    save_file({"a": torch.ones(1)}, single / "model.safetensors")
    assert checkpoint_files(single) == [str(single / "model.safetensors")]
    with pytest.raises(ValueError, match="does not exist"):
        checkpoint_files(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no weights file and no .index.json"):
        checkpoint_files(tmp_path / "empty")


@pytest.mark.parametrize("safe", [True, False])
def test_load_sharded_checkpoint_into_an_empty_model(tmp_path: Path, safe: bool) -> None:
    source = TinyLM()
    folder = save_sharded(source, tmp_path / "ckpt", safe=safe)
    model = _empty()
    load_checkpoint_in_model(model, folder)
    _assert_same(model, source)
    assert model.lm_head.weight is model.wte.weight


def test_dtype_and_keep_in_fp32_modules(tmp_path: Path) -> None:
    source = TinyLM()
    folder = save_sharded(source, tmp_path / "ckpt")
    model = _empty()
    load_checkpoint_in_model(model, folder, dtype="float16", keep_in_fp32_modules=["ln_f"])
    assert model.h[0].attn.weight.dtype == torch.float16
    assert model.ln_f.weight.dtype == torch.float32
    assert torch.equal(model.h[0].attn.weight, source.h[0].attn.weight.half())


def test_disk_entries_of_safetensors_are_indexed_in_place(tmp_path: Path) -> None:
    folder = save_sharded(TinyLM(), tmp_path / "ckpt")
    model = _empty()
    offload = tmp_path / "off"
    load_checkpoint_in_model(
        model,
        folder,
        device_map={"h": "disk", "wte": "cpu", "ln_f": "cpu", "lm_head": "cpu", "scale": "cpu"},
        offload_folder=offload,
    )
    index = json.loads((offload / "index.json").read_text())
    assert set(index) == {k for k in _state(TinyLM()) if k.startswith("h.")}
    assert all("safetensors_file" in v for v in index.values())
    assert not list(offload.glob("*.dat"))
    assert model.h[0].attn.weight.is_meta and not model.wte.weight.is_meta


def test_disk_entries_of_bin_checkpoints_are_written_and_cpu_staging(tmp_path: Path) -> None:
    source = TinyLM()
    folder = save_sharded(source, tmp_path / "ckpt", safe=False)
    model = _empty()
    device_map = {"h": "disk", "wte": "cpu", "ln_f": "cpu", "lm_head": "cpu", "scale": "cpu"}
    load_checkpoint_in_model(
        model,
        folder,
        device_map=device_map,
        offload_folder=tmp_path / "off",
        offload_state_dict=True,
    )
    assert len(list((tmp_path / "off").glob("*.dat"))) == len(
        [k for k in _state(source) if k.startswith("h.")]
    )
    assert torch.equal(model.wte.weight, source.wte.weight)


def test_staged_and_disk_weights_keep_the_requested_dtype(tmp_path: Path) -> None:
    # As Accelerate's test_load_checkpoint_in_model_dtype: float16 asked, float16 held.
    source = TinyLM()
    torch.save(source.state_dict(), tmp_path / "w.bin")  # both tied names, as saved by torch
    model = TinyLM()
    load_checkpoint_in_model(
        model,
        tmp_path / "w.bin",
        dtype=torch.float16,
        offload_state_dict=True,
        device_map={"": "cpu"},
    )
    assert model.wte.weight.dtype == torch.float16 and model.wte.weight.device.type == "cpu"
    assert torch.equal(model.wte.weight, source.wte.weight.half())
    disk = TinyLM()
    load_checkpoint_in_model(
        disk,
        tmp_path / "w.bin",
        dtype=torch.float16,
        device_map={"": "disk"},
        offload_folder=tmp_path / "o",
    )
    assert disk.wte.weight.device.type == "meta" and disk.wte.weight.dtype == torch.float16


def test_unexpected_keys_are_logged_with_accelerates_sentence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save_file(dict(_state(TinyLM())) | {"bonus.weight": torch.ones(1)}, tmp_path / "x.safetensors")
    load_checkpoint_in_model(_empty(), tmp_path / "x.safetensors")
    assert "Some weights of the model checkpoint at" in caplog.text
    assert "were not used when initializing TinyLM: ['bonus.weight']" in caplog.text


def test_bad_checkpoints_and_maps_raise_clear_errors(tmp_path: Path) -> None:
    source = TinyLM()
    state = _state(source)
    missing = dict(state)
    del missing["h.2.proj.weight"]
    save_file(missing, tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match=r"missing keys \['h.2.proj.weight'\]"):
        load_checkpoint_in_model(_empty(), tmp_path / "missing.safetensors", strict=True)
    with pytest.warns(UserWarning, match="no value for \\['h.2.proj.weight'\\]"):
        load_checkpoint_in_model(_empty(), tmp_path / "missing.safetensors")
    extra = dict(state) | {"bonus.weight": torch.ones(1)}
    save_file(extra, tmp_path / "extra.safetensors")
    with pytest.raises(ValueError, match=r"unexpected keys \['bonus.weight'\]"):
        load_checkpoint_in_model(_empty(), tmp_path / "extra.safetensors", strict=True)
    wrong = dict(state) | {"h.0.proj.weight": torch.ones(3, 3)}
    save_file(wrong, tmp_path / "wrong.safetensors")
    with pytest.raises(
        ValueError, match=r"'h.0.proj.weight' has shape \(3, 3\) in the checkpoint but \(16, 16\)"
    ):
        load_checkpoint_in_model(_empty(), tmp_path / "wrong.safetensors")
    torch.save(wrong, tmp_path / "wrong.bin")
    with pytest.raises(ValueError, match="'h.0.proj.weight' has shape"):
        load_checkpoint_in_model(_empty(), tmp_path / "wrong.bin")
    with pytest.raises(ValueError, match="offload_folder is None"):
        load_checkpoint_in_model(
            _empty(), tmp_path / "missing.safetensors", device_map={"": "disk"}
        )
    with pytest.raises(ValueError, match="is not a device"):
        load_checkpoint_in_model(_empty(), tmp_path / "missing.safetensors", device_map={"": "gpu"})


def test_truncated_shard_is_reported(tmp_path: Path) -> None:
    folder = save_sharded(TinyLM(), tmp_path / "ckpt")
    shard = sorted(folder.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match=f"Could not read checkpoint file .*{shard.name}"):
        load_checkpoint_in_model(_empty(), folder)


def test_broadcast_from_rank0_needs_a_process_group(tmp_path: Path) -> None:
    folder = save_sharded(TinyLM(), tmp_path / "ckpt")
    with pytest.raises(RuntimeError, match="initialized process group"):
        load_checkpoint_in_model(_empty(), folder, broadcast_from_rank0=True)
