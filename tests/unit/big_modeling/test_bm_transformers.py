"""A tiny GPT-2 from transformers (built locally, never downloaded) through the big-model path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hasten.big_modeling import cpu_offload, init_empty_weights, load_checkpoint_and_dispatch
from hasten.big_modeling.device_map import device_for, infer_auto_device_map

transformers = pytest.importorskip("transformers", reason="transformers is optional")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, Path]:
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=96, n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder, max_shard_size="40KB")
    return config, model, folder


def _empty(config: object) -> torch.nn.Module:
    with init_empty_weights():
        model = transformers.GPT2LMHeadModel(config)
    model.tie_weights()
    return model.eval()


def test_gpt2_dispatched_on_cpu_and_disk_is_exact(gpt2, tmp_path: Path) -> None:
    config, reference, folder = gpt2
    assert len(list(folder.glob("*.safetensors"))) > 1  # really sharded
    device_map = {
        "transformer.wte": "cpu",
        "transformer.wpe": "cpu",
        "transformer.drop": "cpu",
        "transformer.h.0": "cpu",
        "transformer.h.1": "disk",
        "transformer.h.2": "cpu",
        "transformer.ln_f": "disk",
        "lm_head": "cpu",
    }
    model = load_checkpoint_and_dispatch(
        _empty(config),
        folder,
        device_map=device_map,
        offload_folder=tmp_path / "off",
        no_split_module_classes=["GPT2Block"],
    )
    ids = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    kwargs = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(model.generate(ids, **kwargs), reference.generate(ids, **kwargs))


def test_gpt2_auto_map_keeps_blocks_whole_and_ties(gpt2) -> None:
    config, _, _ = gpt2
    model = _empty(config)
    got = infer_auto_device_map(
        model,
        max_memory={0: "60KB", 1: "60KB", "cpu": "1GB"},
        no_split_module_classes=["GPT2Block"],
    )
    assert not [k for k in got if k.startswith("transformer.h.") and k.count(".") > 2]
    assert device_for("lm_head.weight", got) == device_for("transformer.wte.weight", got)


def test_gpt2_cpu_offload_is_exact(gpt2) -> None:
    config, reference, _ = gpt2
    model = transformers.GPT2LMHeadModel(config).eval()
    model.load_state_dict(reference.state_dict())
    cpu_offload(model, execution_device=torch.device("cpu"))
    ids = torch.randint(0, 96, (1, 10))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
