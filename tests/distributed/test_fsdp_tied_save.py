"""save_model of a tied model under FSDP2 / FSDP1 on 2 CPU processes: the tie written once,
the same files as the unsharded save of the same weights, loadable into a fresh model, and
no warning on the way (FSDP1 gathers unit by unit, without torch's deprecated ShardedTensor)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from _support.distributed import run_distributed
from _support.fsdp_models import Block

pytestmark = pytest.mark.distributed

ENGINES = {
    "fsdp2": {"fsdp_version": 2},
    "fsdp1_orig": {"fsdp_version": 1, "use_orig_params": True},
    "fsdp1_flat": {"fsdp_version": 1, "use_orig_params": False},
    # bf16 compute (buffers cast by FSDP1) and checkpoint wrappers: still the fp32 weights.
    "fsdp1_bf16": {"fsdp_version": 1, "activation_checkpointing": True, "mixed": "bf16"},
}
SIZES = ("1KB", "10GB")  # several shards plus an index (the tie alone in one), or one file


class TiedLM(nn.Module):
    """Embedding, one block, a head sharing the embedding's weight (like tied-embedding LMs)."""

    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.layers = nn.ModuleList([Block(16)])
        self.lm_head = nn.Linear(16, 32, bias=False)
        self.lm_head.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) * self.scale
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(h)


def _tokens() -> torch.Tensor:
    return torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(7))


def _save_tied(folder: str) -> dict[str, list[str]]:
    """Each engine in turn on one process group: train 1 step, save_model every way; return
    the warnings save_model raised (FSDP1's ShardedTensors raised torch's deprecation)."""
    import warnings

    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.state._shared import reset_state

    raised: dict[str, list[str]] = {}
    for engine, settings in ENGINES.items():
        reset_state()
        settings = dict(settings)
        mixed = settings.pop("mixed", "no")
        plugin = FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", **settings
        )
        accelerator = Accelerator(fsdp_plugin=plugin, mixed_precision=mixed)
        torch.manual_seed(0)
        model = TiedLM()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, optimizer = accelerator.prepare(model, optimizer)
        tokens = _tokens()[accelerator.process_index :: accelerator.num_processes]
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        accelerator.backward(loss)
        optimizer.step()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for size in SIZES:
                for safe in (True, False):
                    path = f"{folder}/{engine}_{size}_{safe}"
                    accelerator.save_model(model, path, size, safe_serialization=safe)
        raised[engine] = [f"{w.category.__name__}: {w.message}" for w in caught]
        state = accelerator.get_state_dict(model)  # the trained weights, gathered whole
        if accelerator.is_main_process:
            torch.save(state, f"{folder}/{engine}_weights.pt")
    return raised


def _reference(weights: Path) -> TiedLM:
    """An unsharded TiedLM holding the weights FSDP trained (the tie intact)."""
    model = TiedLM()
    state = torch.load(weights)
    assert torch.equal(state["embed.weight"], state["lm_head.weight"])
    model.load_state_dict(state)
    assert model.lm_head.weight is model.embed.weight
    return model


@pytest.mark.timeout(120)
def test_fsdp_save_model_writes_a_tied_weight_once_like_an_unsharded_save(
    tmp_path: Path,
) -> None:
    from safetensors.torch import load_file

    from hasten import load_checkpoint_in_model
    from hasten.checkpointing.model import save_model_weights

    raised = run_distributed(_save_tied, str(tmp_path), world_size=2, timeout=90)
    assert raised == [{engine: [] for engine in ENGINES}] * 2  # no deprecated torch path
    for engine in ENGINES:
        reference = _reference(tmp_path / f"{engine}_weights.pt")
        for size in SIZES:
            for safe in (True, False):
                tag = f"{engine}_{size}_{safe}"
                new, old = tmp_path / tag, tmp_path / f"plain_{tag}"
                save_model_weights(reference.state_dict(), old, size, safe_serialization=safe)
                names = sorted(p.name for p in old.iterdir())
                assert sorted(p.name for p in new.iterdir()) == names, tag
                assert (len(names) > 2) == (size == "1KB"), tag
                for name in names:
                    if safe or name.endswith(".json"):  # byte for byte
                        assert (new / name).read_bytes() == (old / name).read_bytes(), tag
                        continue
                    got, want = torch.load(new / name), torch.load(old / name)
                    assert list(got) == list(want), tag
                    assert all(torch.equal(got[k], want[k]) for k in want), tag
                    if "lm_head.weight" in got and "embed.weight" in got:  # still one storage
                        assert (
                            got["lm_head.weight"].untyped_storage().data_ptr()
                            == got["embed.weight"].untyped_storage().data_ptr()
                        ), tag
            if size == "10GB":
                saved = load_file(str(tmp_path / f"{engine}_{size}_True" / "model.safetensors"))
                assert "embed.weight" in saved and "lm_head.weight" not in saved, engine
            fresh = TiedLM()
            load_checkpoint_in_model(fresh, str(tmp_path / f"{engine}_{size}_True"), strict=True)
            assert fresh.lm_head.weight is fresh.embed.weight
            with torch.no_grad():
                assert torch.equal(fresh(_tokens()), reference(_tokens())), engine
