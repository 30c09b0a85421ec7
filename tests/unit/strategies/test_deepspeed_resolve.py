"""The DeepSpeed config hasten hands to `deepspeed.initialize`: "auto" filled, bad input refused.

None of this imports deepspeed: the config is resolved before the engine is built.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten.config.deepspeed import DeepSpeedPlugin
from hasten.strategies.deepspeed import (
    DummyOptim,
    DummyScheduler,
    EngineInputs,
    check_batch_sizes,
    resolve_config,
)


def _model() -> torch.nn.Module:
    return torch.nn.Linear(4, 2)


def _plugin(**config: Any) -> DeepSpeedPlugin:
    return DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, **config})


def _inputs(**kwargs: Any) -> EngineInputs:
    model = kwargs.pop("model", _model())
    optimizer = kwargs.pop("optimizer", torch.optim.SGD(model.parameters(), lr=0.1))
    return EngineInputs(model=model, optimizer=optimizer, **kwargs)


def test_auto_values_are_filled_from_the_accelerator() -> None:
    plugin = _plugin(
        train_batch_size="auto",
        train_micro_batch_size_per_gpu="auto",
        gradient_accumulation_steps="auto",
        gradient_clipping="auto",
    )
    config = resolve_config(
        plugin, _inputs(micro_batch_size=8, num_processes=2, accumulation_steps=4)
    )
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert config["gradient_accumulation_steps"] == 4
    assert config["train_batch_size"] == 8 * 4 * 2
    assert config["gradient_clipping"] == 1.0  # Accelerate's value for "auto"


def test_a_torch_optimizer_in_code_is_allowed_by_zero_as_in_accelerate() -> None:
    # DeepSpeed refuses optimizers outside its tested list (SGD) without this flag
    config = resolve_config(_plugin(train_micro_batch_size_per_gpu=2), _inputs())
    assert config["zero_allow_untested_optimizer"] is True
    model = _model()
    dummy = DummyOptim(model.parameters(), lr=0.1)
    plugin = _plugin(
        train_micro_batch_size_per_gpu=2, optimizer={"type": "AdamW", "params": {"lr": "auto"}}
    )
    config = resolve_config(plugin, _inputs(model=model, optimizer=dummy))
    assert "zero_allow_untested_optimizer" not in config  # DeepSpeed builds its own


def test_dummy_optimizer_and_scheduler_fill_the_config_sections() -> None:
    model = _model()
    plugin = _plugin(
        train_micro_batch_size_per_gpu=2,
        optimizer={"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},
    )
    optimizer = DummyOptim(model.parameters(), lr=3e-4, weight_decay=0.1)
    scheduler = DummyScheduler(optimizer, warmup_num_steps=7)
    config = resolve_config(plugin, _inputs(model=model, optimizer=optimizer, scheduler=scheduler))
    assert config["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.1}
    assert config["scheduler"]["params"] == {"warmup_num_steps": 7}


def test_hidden_size_autos_come_from_the_model_config() -> None:
    model = _model()
    model.config = type("Config", (), {"hidden_size": 16})()  # type: ignore[assignment]
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
        }
    )
    config = resolve_config(plugin, _inputs(model=model))
    assert config["zero_optimization"]["reduce_bucket_size"] == 256


def test_an_auto_that_cannot_be_filled_names_the_value_to_set() -> None:
    plugin = _plugin(train_micro_batch_size_per_gpu="auto")
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu: pass the training"):
        resolve_config(plugin, _inputs())
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
        }
    )
    with pytest.raises(ValueError, match="zero_optimization.reduce_bucket_size: set it"):
        resolve_config(plugin, _inputs())


def test_train_batch_size_must_be_micro_batch_times_accumulation_times_processes() -> None:
    config = {
        "train_batch_size": 30,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
    }
    with pytest.raises(ValueError, match=r"= 16\. Set train_batch_size to 16 or to 'auto'"):
        check_batch_sizes(config, num_processes=2)
    plugin = _plugin(train_batch_size=30, train_micro_batch_size_per_gpu=4)
    with pytest.raises(ValueError, match="train_batch_size=30"):
        resolve_config(plugin, _inputs(num_processes=2))
    check_batch_sizes({**config, "train_batch_size": 16}, num_processes=2)  # consistent


def test_offload_with_a_client_optimizer_needs_the_force_flag() -> None:
    offload = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    plugin = DeepSpeedPlugin(
        hf_ds_config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": offload}
    )
    with pytest.raises(ValueError, match="zero_force_ds_cpu_optimizer") as caught:
        resolve_config(plugin, _inputs())
    assert "DummyOptim" in str(caught.value)  # the second fix
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "train_micro_batch_size_per_gpu": 1,
            "zero_force_ds_cpu_optimizer": False,
            "zero_optimization": offload,
        }
    )
    resolve_config(plugin, _inputs())


def test_an_optimizer_in_the_config_and_in_code_is_refused() -> None:
    plugin = _plugin(train_micro_batch_size_per_gpu=1, optimizer={"type": "AdamW"})
    with pytest.raises(ValueError, match="'optimizer' section and a real optimizer"):
        resolve_config(plugin, _inputs())
    with pytest.raises(ValueError, match="no 'optimizer' section"):
        resolve_config(
            _plugin(train_micro_batch_size_per_gpu=1),
            _inputs(optimizer=DummyOptim(_model().parameters())),
        )


def test_a_scheduler_in_the_config_and_in_code_is_refused() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    plugin = _plugin(train_micro_batch_size_per_gpu=1, scheduler={"type": "WarmupLR"})
    with pytest.raises(ValueError, match="'scheduler' section and a real scheduler"):
        resolve_config(plugin, _inputs(model=model, optimizer=optimizer, scheduler=scheduler))
    with pytest.raises(ValueError, match="lr_scheduler_callable"):
        resolve_config(
            _plugin(train_micro_batch_size_per_gpu=1),
            _inputs(model=model, optimizer=optimizer, scheduler=DummyScheduler(optimizer)),
        )


def test_explicit_accumulation_that_contradicts_the_accelerator_names_both() -> None:
    plugin = _plugin(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=4)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=4 but the Accelerator"):
        resolve_config(plugin, _inputs(accumulation_steps=2))


def test_config_file_missing_or_not_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist; check the path"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 2},}')
    with pytest.raises(ValueError, match="is not valid JSON"):
        DeepSpeedPlugin(hf_ds_config=str(bad))
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="not a JSON object"):
        DeepSpeedPlugin(hf_ds_config=str(listed))


def test_building_the_strategy_does_not_import_deepspeed() -> None:
    code = (
        "import sys\nfrom hasten import Accelerator\nfrom hasten.utils import DeepSpeedPlugin\n"
        "from hasten.strategies.deepspeed import DeepSpeedStrategy, DummyOptim\n"
        "assert 'deepspeed' not in sys.modules, 'deepspeed was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
