"""The Accelerator's multi-process guarantees, checked through `hasten launch` (2 CPU processes).

One launch of `training_checks.py` records every section's observations; each test below
checks one guarantee against a single-process reference computed here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hasten import Accelerator
from hasten.state._shared import reset_state

pytestmark = pytest.mark.cli

HERE = Path(__file__).parent
HASTEN = Path(sys.executable).parent / "hasten"


def _checks_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("training_checks", HERE / "training_checks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _checks_module()


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("training_checks")
    proc = subprocess.run(
        [
            str(HASTEN),
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            str(HERE / "training_checks.py"),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results: dict[str, Any] = torch.load(out / "results.pt", weights_only=False)
    return results


def section(results: dict[str, Any], name: str) -> dict[str, Any]:
    data = results[name]
    assert "error" not in data, data.get("error")
    return data


def reference_weights(n: int) -> list[torch.Tensor]:
    """Plain PyTorch: one process, global batch 8 (the last one short), loss sum / 8."""
    model = checks.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = checks.make_data(n)
    for _ in range(checks.EPOCHS):
        for start in range(0, n, checks.GLOBAL_BATCH):
            x, y = data[start : start + checks.GLOBAL_BATCH]
            loss = F.mse_loss(model(x), y, reduction="sum") / checks.GLOBAL_BATCH
            loss.backward()
            opt.step()
            opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [32, 30])
def test_every_layout_reaches_the_same_weights(launched: dict[str, Any], n: int) -> None:
    reference = reference_weights(n)
    reset_state()
    assert_same(checks.train(Accelerator(cpu=True), n, checks.GLOBAL_BATCH), reference)
    reset_state()
    accumulated = Accelerator(cpu=True, gradient_accumulation_steps=4)
    assert_same(checks.train(accumulated, n, checks.GLOBAL_BATCH // 4), reference)
    equivalence = section(launched, "equivalence")
    assert_same(equivalence[f"split_{n}"], reference)
    assert_same(equivalence[f"per_process_{n}"], reference)


def test_accumulation_all_reduces_only_on_sync_steps(launched: dict[str, Any]) -> None:
    data = section(launched, "accumulation")
    # 6 micro-batches, 4 per step: sync on the 4th and on the last batch of the loader.
    assert data["sync_flags"] == [False, False, False, True, False, True]
    assert data["allreduces_per_step"] == [0, 0, 0, 1, 0, 1]


def test_gather_for_metrics_returns_the_dataset_in_order(launched: dict[str, Any]) -> None:
    data = section(launched, "gather_for_metrics")
    # 13 samples, batch 2 on 2 processes: the last global batch is padded, then trimmed.
    assert data["tensors"] == [float(i) for i in range(13)]
    assert data["objects"] == [f"s{i}" for i in range(13)]


def test_fp16_overflow_skips_the_step_and_the_scheduler(launched: dict[str, Any]) -> None:
    data = section(launched, "fp16_overflow")
    assert data["num_processes"] == 2
    assert data["skipped"] is True
    assert data["weights_unchanged"] is True
    assert data["lr_after_skip"] == pytest.approx(0.1)
    assert data["skipped_after_good_step"] is False
    # Without split_batches the scheduler steps once per process: 0.1 / (2 + 1).
    assert data["lr_after_good_step"] == pytest.approx(0.1 / 3)


SETTINGS_SCRIPT = """
import json
from hasten import Accelerator
from hasten.state._shared import reset_state

acc = Accelerator()
launched = [acc.mixed_precision, acc.gradient_accumulation_steps, str(acc.state.dynamo_plugin.backend.value)]
reset_state()
acc = Accelerator(mixed_precision="no", gradient_accumulation_steps=2)
explicit = [acc.mixed_precision, acc.gradient_accumulation_steps]
print("SETTINGS", json.dumps({"launched": launched, "explicit": explicit}))
"""


def test_launcher_settings_reach_the_accelerator_and_arguments_win(tmp_path: Path) -> None:
    script = tmp_path / "settings.py"
    script.write_text(SETTINGS_SCRIPT)
    flags = ["--mixed_precision", "bf16", "--gradient_accumulation_steps", "3"]
    proc = subprocess.run(
        [
            str(HASTEN),
            "launch",
            "--cpu",
            "--num_processes",
            "1",
            *flags,
            "--dynamo_backend",
            "eager",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("SETTINGS "))
    settings = json.loads(line.removeprefix("SETTINGS "))
    assert settings["launched"] == ["bf16", 3, "EAGER"]
    assert settings["explicit"] == ["no", 2]
