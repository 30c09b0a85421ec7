"""trl's SFTTrainer and DPOTrainer, and peft LoRA with Trainer, on hasten-as-accelerate.

Tiny Llama models and a word-level tokenizer built in code (tests/ecosystem/tiny.py); nothing
downloaded. One process each; the LoRA adapter saved here is loaded in a new process.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.ecosystem import SCRIPTS, require_alias, run_script

pytestmark = [pytest.mark.ecosystem, pytest.mark.timeout(600)]


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> Any:
    require_alias()
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import tiny

    return tiny


def _common(tmp_path: Path) -> dict[str, Any]:
    return {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 4,
        "max_steps": 4,
        "logging_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "seed": 0,
        "learning_rate": 1e-3,
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def _changed(before: dict[str, torch.Tensor], model: torch.nn.Module) -> set[str]:
    return {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}


def test_trl_sft_trainer(tiny: Any, tmp_path: Path) -> None:
    trl = pytest.importorskip("trl", reason="trl is not installed (make install)")
    from datasets import Dataset

    import hasten

    model = tiny.causal_lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = trl.SFTTrainer(
        model=model,
        args=trl.SFTConfig(max_length=16, **_common(tmp_path)),
        train_dataset=Dataset.from_dict({"text": tiny.sentences(32)}),
        processing_class=tiny.tokenizer(),
    )
    assert isinstance(trainer.accelerator, hasten.Accelerator)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    # The first loss is the untrained model's: about log(vocabulary size).
    assert abs(losses[0] - math.log(model.config.vocab_size)) < 0.5
    assert _changed(before, model)


def test_trl_dpo_trainer(tiny: Any, tmp_path: Path) -> None:
    trl = pytest.importorskip("trl", reason="trl is not installed (make install)")
    from datasets import Dataset

    policy, reference = tiny.causal_lm(), tiny.causal_lm()  # same seed: same weights
    frozen = {k: v.clone() for k, v in reference.state_dict().items()}
    data = Dataset.from_dict(
        {
            "prompt": tiny.sentences(16, seed=1, length=3),
            "chosen": tiny.sentences(16, seed=2, length=3),
            "rejected": tiny.sentences(16, seed=3, length=3),
        }
    )
    trainer = trl.DPOTrainer(
        model=policy,
        ref_model=reference,
        args=trl.DPOConfig(max_length=16, **_common(tmp_path)),
        train_dataset=data,
        processing_class=tiny.tokenizer(),
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 4
    # While the policy equals the reference, the DPO loss is -log(sigmoid(0)) = log 2.
    assert logs[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert not _changed(frozen, trainer.ref_model)  # prepared for evaluation: never trained
    assert any(not torch.equal(p, frozen[k]) for k, p in policy.state_dict().items())


def test_peft_lora_with_trainer_saves_an_adapter_that_loads_in_a_new_process(
    tiny: Any, tmp_path: Path
) -> None:
    peft = pytest.importorskip("peft", reason="peft is not installed (make install)")
    import transformers

    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(tiny.causal_lm(), config)
    base = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    ids = torch.randint(0, 30, (64, 12), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    trainer = transformers.Trainer(
        model=model, args=transformers.TrainingArguments(**_common(tmp_path)), train_dataset=data
    )
    trainer.train()
    changed = _changed(
        {**base, **{k: v for k, v in model.state_dict().items() if "lora_" in k}}, model
    )
    assert not changed  # the base weights are frozen ...
    lora_b = [v for k, v in model.state_dict().items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # ... and the adapter trained
    adapter = tmp_path / "adapter"
    trainer.save_model(str(adapter))
    assert (adapter / "adapter_model.safetensors").is_file()
    assert (adapter / "adapter_config.json").is_file()
    probe = torch.arange(10).reshape(1, 10)
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=probe).logits
    torch.save(expected, tmp_path / "expected.pt")
    result = run_script(
        "peft_load_script.py", [str(adapter), str(tmp_path / "expected.pt"), "0,1,2,3,4,5,6,7,8,9"]
    )
    assert result["max_abs_diff"] == 0.0 and result["lora_layers"] == 4
