"""Every example of the gallery (``examples/``) runs end to end at a small setting, and says so.

Distributed examples run on 2 processes through ``hasten launch`` (HSDP on 4); to spare a torch
import and a rendezvous per example, one launch runs a batch of examples one after another
(``tests/_support/run_scripts.py``: each script as ``__main__`` with its own arguments and
folder, hasten's state reset between them). Each test then checks what its examples printed
(losses fall, metrics present, the right counts) and the files they wrote.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.core.imports import is_deepspeed_available, is_transformers_available

pytestmark = [
    pytest.mark.cli,
    # A batch launch runs many examples: ~40 s on a quiet 2-core machine, minutes under load.
    pytest.mark.timeout(900),
    pytest.mark.skipif(not is_transformers_available(), reason="transformers is not installed"),
]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RUNNER = ROOT / "tests" / "_support" / "run_scripts.py"
FLOAT = r"([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)"

#: Examples tested elsewhere: (file, test that runs it).
TESTED_ELSEWHERE = {
    "train_classifier.py": "tests/cli/test_training_e2e_demo.py",
    "hello_distributed.py": "tests/cli/test_launch_cli.py",
    "by_feature/megatron_lm_gpt_pretraining.py": "tests/cli/test_megatron_example.py",
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return env


def _run(command: list[str], tmp: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run a launch in its own session: on a timeout its workers are stopped with it."""
    with subprocess.Popen(
        command, cwd=tmp, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"timed out after {timeout} s:\n{stdout[-3000:]}{stderr[-6000:]}")
    assert proc.returncode == 0, stdout[-4000:] + stderr[-8000:]
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _launch_batch(
    tmp: Path, jobs: list[tuple[str, str, list[str]]], processes: int = 2
) -> dict[str, str]:
    """Run (name, script, args) jobs in one launch; return each job's main-process output."""
    spec = [
        {"name": name, "script": str(EXAMPLES / script), "args": args, "cwd": str(tmp / name)}
        for name, script, args in jobs
    ]
    (tmp / "jobs.json").write_text(json.dumps(spec))
    launcher = [sys.executable, "-m", "hasten.commands.cli", "launch"]
    if processes > 1:
        launcher += ["--num_processes", str(processes)]
    _run([*launcher, str(RUNNER), str(tmp / "jobs.json")], tmp)
    return {name: (tmp / name / "stdout.0.txt").read_text() for name, _, _ in jobs}


def _epochs(text: str, metric: str = "loss") -> list[float]:
    return [float(v) for v in re.findall(rf"epoch \d+: {metric} {FLOAT}", text)]


def _falls(values: list[float]) -> bool:
    return len(values) >= 2 and values[-1] < values[0]


@pytest.fixture(scope="module")
def ddp_batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("ddp")
    jobs = [
        ("nlp", "nlp_example.py", ["--epochs", "2", "--train_samples", "256", "--batch_size", "8"]),
        ("cv", "cv_example.py", ["--epochs", "2", "--train_samples", "512", "--batch_size", "16"]),
        ("complete", "complete_example.py",
         ["--epochs", "2", "--train_samples", "256", "--checkpointing_steps", "5"]),
        ("accumulation", "by_feature/gradient_accumulation.py", ["--epochs", "1", "--samples", "256"]),
        ("accumulation_lm", "by_feature/gradient_accumulation_for_autoregressive_models.py",
         ["--epochs", "2", "--samples", "128"]),
        ("local_sgd", "by_feature/local_sgd.py", ["--epochs", "2", "--samples", "512"]),
        ("early_stopping", "by_feature/early_stopping.py", []),
        ("batch_size", "by_feature/find_executable_batch_size.py", ["--epochs", "1"]),
        ("metrics", "by_feature/multi_process_metrics.py", ["--epochs", "1"]),
        ("profiler", "by_feature/profiler.py", ["--output_trace_dir", "traces"]),
        ("schedule_free", "by_feature/schedule_free.py", ["--epochs", "2"]),
        ("tensor_parallel", "by_feature/tensor_parallel.py", ["--epochs", "2"]),
        ("fsdp2", "by_feature/fsdp2_causal_lm.py", ["--steps", "16"]),
        ("pippy", "inference/pippy_inference.py", []),
        ("split", "inference/distributed_inference.py", ["--prompts", "11"]),
    ]  # fmt: skip
    return tmp, _launch_batch(tmp, jobs)


def test_training_basics(ddp_batch: tuple[Path, dict[str, str]]) -> None:
    _, out = ddp_batch
    for name, eval_size in (("nlp", 250), ("cv", 300)):
        assert _falls(_epochs(out[name])), out[name]
        assert len(_epochs(out[name], "loss [0-9.]+ accuracy")) == 2, out[name]
        assert f"({eval_size} samples)" in out[name]  # every evaluation sample, once
    assert _epochs(out["cv"], "loss [0-9.]+ accuracy")[-1] > 0.4  # 4 classes: chance is 0.25


def test_feature_examples(ddp_batch: tuple[Path, dict[str, str]]) -> None:
    tmp, out = ddp_batch
    updates, batches = map(
        int, re.findall(r"(\d+) optimizer updates for (\d+) batches", out["accumulation"])[0]
    )
    assert updates * 4 == batches == 16  # 256 samples / batch 8 / 2 processes, 4 per update
    assert _falls(_epochs(out["accumulation_lm"])), out["accumulation_lm"]
    assert float(re.findall(rf"mean model after training: {FLOAT}", out["local_sgd"])[0]) < 1e-6
    assert "stopped early at step" in out["early_stopping"], out["early_stopping"]
    assert "trying batch size 128" in out["batch_size"]
    assert "trained with batch size 32 x 4 accumulation steps" in out["batch_size"]
    # 1001 evaluation samples: each process evaluates 32 batches of 16 (repeats fill the last
    # ones), and the gathered predictions are the 1001 samples again.
    assert "over 1001 samples (512 on the main process)" in out["metrics"], out["metrics"]
    assert "aten::" in out["profiler"]
    assert sorted(p.name for p in (tmp / "profiler" / "traces").iterdir()) == [
        "profile_0.json",
        "profile_1.json",
    ]
    accuracy = _epochs(out["schedule_free"], "loss [0-9.]+ accuracy")
    assert _falls(_epochs(out["schedule_free"])) and accuracy[-1] > 0.8, out["schedule_free"]


def test_parallelism_and_inference_examples(ddp_batch: tuple[Path, dict[str, str]]) -> None:
    tmp, out = ddp_batch
    assert "up.weight (128, 32) holds (64, 32) here" in out["tensor_parallel"]
    assert _falls(_epochs(out["tensor_parallel"])), out["tensor_parallel"]
    assert "2 stages split at" in out["pippy"]
    assert float(re.findall(rf"unsplit model {FLOAT}", out["pippy"])[0]) < 1e-5
    assert "process 0 answered 6 prompts" in out["split"]  # 11 prompts: 6 + 5
    assert "11 answers in prompt order: True" in out["split"], out["split"]
    assert "same as one process answering all: True" in out["split"]


def test_fsdp2_saves_a_model_and_a_checkpoint_that_merge_weights_turns_into_the_same_file(
    ddp_batch: tuple[Path, dict[str, str]],
) -> None:
    from safetensors.torch import load_file

    from hasten.utils import merge_fsdp_weights

    tmp, out = ddp_batch
    losses = [float(v) for v in re.findall(rf"(?:step \d+|final): loss {FLOAT}", out["fsdp2"])]
    assert _falls(losses), out["fsdp2"]
    folder = tmp / "fsdp2" / "fsdp2_out"
    saved = load_file(folder / "model.safetensors")
    merge_fsdp_weights(str(folder / "checkpoint" / "pytorch_model_fsdp_0"), str(tmp / "merged"))
    merged = load_file(tmp / "merged" / "model.safetensors")
    assert set(saved) <= set(merged)  # the merged state also holds the tied head
    for key, tensor in saved.items():
        assert merged[key].equal(tensor), key


@pytest.mark.skipif(not is_deepspeed_available(), reason="deepspeed is not installed")
def test_resume_in_new_processes_and_deepspeed_zero3(
    ddp_batch: tuple[Path, dict[str, str]], tmp_path: Path, deepspeed_ops: None
) -> None:
    first_tmp, first = ddp_batch
    project = first_tmp / "complete" / "complete_example_out"
    records = [json.loads(line) for line in (project / "complete_example" / "metrics.jsonl").open()]
    assert {"train_loss", "accuracy"} <= {k for r in records for k in r.get("values", r)}
    jobs = [
        ("resume", "complete_example.py",
         ["--epochs", "2", "--train_samples", "256", "--project_dir", str(project),
          "--resume_from_checkpoint", "latest"]),
        ("deepspeed", "by_feature/deepspeed_zero3.py", ["--epochs", "2"]),
    ]  # fmt: skip
    out = _launch_batch(tmp_path, jobs)
    # 8 steps per epoch per process; checkpoints at steps 5, 10, 15: the newest is step 15.
    assert "resumed after 15 steps" in out["resume"], out["resume"]
    checksum = re.findall(r"final weights checksum (\S+)", first["complete"])
    assert checksum and re.findall(r"final weights checksum (\S+)", out["resume"]) == checksum
    assert "ZeRO stage 3" in out["deepspeed"]
    assert _falls(_epochs(out["deepspeed"])), out["deepspeed"]
    assert (tmp_path / "deepspeed" / "deepspeed_out" / "model.safetensors").is_file()


def test_hsdp_on_a_two_by_two_mesh(tmp_path: Path) -> None:
    out = _launch_batch(tmp_path, [("hsdp", "by_feature/hsdp.py", ["--epochs", "2"])], 4)["hsdp"]
    assert "mesh {'dp_replicate': 2, 'dp_shard': 2}" in out
    assert _falls(_epochs(out)), out


def test_preemption_checkpoints_exits_and_the_restart_continues(tmp_path: Path) -> None:
    script = "by_feature/preemption.py"
    result = _run(
        [sys.executable, "-m", "hasten.commands.cli", "launch", "--num_processes", "2",
         "--max_restarts", "1", str(EXAMPLES / script),
         "--preempt_at_step", "20", "--epochs", "2"],
        tmp_path,
    )  # fmt: skip
    text = result.stdout + result.stderr
    assert "attempt 0: starting" in text and "the scheduler sends SIGTERM" in text
    resumed = int(re.findall(r"attempt 1: resumed after (\d+) steps", text)[0])
    assert resumed in (20, 21)  # the step in flight when the signal came, or the next one
    assert "finished after 64 steps" in text  # 1024 samples / 16 / 2 processes x 2 epochs


def test_single_process_examples(tmp_path: Path) -> None:
    jobs = [
        ("big_model", "inference/big_model_inference.py", []),
        ("notebook", "notebook_launcher.py", ["--epochs", "2"]),
    ]
    out = _launch_batch(tmp_path, jobs, processes=1)
    placement = re.findall(r"placement of \d+ modules: (\{.*\})", out["big_model"])[0]
    assert "'disk'" in placement and "'cpu'" in placement
    assert float(re.findall(rf"model in memory: {FLOAT}", out["big_model"])[0]) == 0.0
    assert (tmp_path / "big_model" / "big_model_out" / "offload").is_dir()
    assert _falls(_epochs(out["notebook"])), out["notebook"]
    assert "trained on 2 processes" in out["notebook"]


def test_every_example_is_run_by_a_test_and_linked_from_the_gallery() -> None:
    here = Path(__file__).read_text()
    gallery = (ROOT / "docs" / "examples.md").read_text()
    scripts = sorted(
        str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.py") if not p.name.startswith("_")
    )
    assert len(scripts) >= 20
    for script in scripts:
        assert f'"{script}"' in here or script in TESTED_ELSEWHERE, f"{script} is not run by a test"
        assert f"examples/{script}" in gallery, f"docs/examples.md does not link {script}"
    for script, test in TESTED_ELSEWHERE.items():
        assert Path(script).name in (ROOT / test).read_text(), (script, test)
