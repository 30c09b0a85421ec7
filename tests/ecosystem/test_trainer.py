"""transformers' Trainer on hasten-as-accelerate: train, evaluate, save, resume exactly.

A tiny Llama causal LM and a tiny Llama sequence classifier (tests/ecosystem/tiny.py) train 8
steps, saving a checkpoint every 4. A run resumed from checkpoint-4 in a new process must log
the same losses for steps 5-8 and end with bit-identical weights, also when the checkpoint's
training_args.bin cannot be read (reading it is a clear error; resuming does not read it). One
process runs in `make test`; two processes through ``accelerate launch --config_file`` (DDP,
FSDP2 through Trainer's fsdp/fsdp_config and through an accelerate config file, DeepSpeed ZeRO-2
and ZeRO-3; Accelerate itself cannot run FSDP or DeepSpeed on CPUs) are marked ``ecosystem`` and
run by `make test-ecosystem`. Each sharded row checks that the processes really hold shards.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.ecosystem import (
    SCRIPTS,
    launch_config,
    read_weights,
    require_alias,
    run_script,
    run_script_results,
)

TASKS = ["causal", "classifier"]
_ZERO = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
}
ENGINES: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    # engine: (accelerate config distributed_type, its extra keys, the script's Trainer args)
    "ddp": ("MULTI_CPU", {}, []),
    "fsdp2_trainer_args": (
        "MULTI_CPU",
        {},
        [
            "--fsdp",
            "full_shard auto_wrap",
            "--fsdp_config",
            json.dumps(
                {
                    "fsdp_version": 2,
                    "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                    "reshard_after_forward": True,
                }
            ),
        ],
    ),
    "fsdp2_config_file": (
        "FSDP",
        {
            "fsdp_config": {
                "fsdp_version": 2,
                "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                "fsdp_reshard_after_forward": True,
                "fsdp_cpu_ram_efficient_loading": False,
            }
        },
        [],
    ),
    "deepspeed_zero2": (
        "MULTI_CPU",
        {},
        ["--deepspeed", json.dumps({"zero_optimization": {"stage": 2}, **_ZERO})],
    ),
    "deepspeed_zero3": (
        "MULTI_CPU",
        {},
        [
            "--deepspeed",
            json.dumps(
                {
                    "zero_optimization": {
                        "stage": 3,
                        "stage3_gather_16bit_weights_on_model_save": True,
                    },
                    **_ZERO,
                }
            ),
        ],
    ),
}


def _steps(losses: dict[Any, float]) -> dict[int, float]:
    return {int(step): loss for step, loss in losses.items()}


def _assert_same_weights(left: Path, right: Path) -> None:
    a, b = read_weights(left), read_weights(right)
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resuming"


def _assert_resumed_exactly(full: dict[str, Any], resumed: dict[str, Any], out: Path) -> None:
    assert full["accelerate_is_hasten"] and resumed["accelerate_is_hasten"]
    assert full["accelerator"] == resumed["accelerator"] == "hasten.accelerator"
    steps, again = _steps(full["losses"]), _steps(resumed["losses"])
    assert sorted(steps) == list(range(1, 9))
    assert {s: again[s] for s in range(5, 9)} == {s: steps[s] for s in range(5, 9)}
    assert resumed["eval_loss"] == full["eval_loss"]
    _assert_same_weights(
        out / "full" / "weights.safetensors", out / "resumed" / "weights.safetensors"
    )


def _unreadable_state(path: Path) -> None:
    """Rewrite a training_args.bin without an attribute hasten's PartialState needs."""
    args = torch.load(path, weights_only=False)
    del args.distributed_state.__dict__["_distributed_type"]
    torch.save(args, path)


@pytest.mark.timeout(300)
def test_trainer_resumes_exactly_on_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_alias()
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import trainer_script

    # The uninterrupted runs here; the resumed ones in one new process, from their checkpoint-4.
    full = {}
    for task in TASKS:
        result = trainer_script.run(["--task", task, "--output_dir", str(tmp_path / task / "full")])
        assert result is not None and result["distributed_type"] == "NO"
        assert (tmp_path / task / "full" / "checkpoint-4" / "training_args.bin").is_file()
        assert (tmp_path / task / "full" / "final" / "model.safetensors").is_file()  # save_model
        full[task] = result
    # The classifier's training_args.bin as a hasten version whose state lacks what this one
    # needs would write it: reading it is a clear error with the fix; the resume does not need it.
    _unreadable_state(tmp_path / "classifier" / "full" / "checkpoint-4" / "training_args.bin")
    runs = [
        ["--task", task, "--output_dir", str(tmp_path / task / "resumed")]
        + ["--resume", str(tmp_path / task / "full" / "checkpoint-4")]
        for task in TASKS
    ]
    resumed = run_script_results("trainer_script.py", [*runs[0], "--then", *runs[1]])
    causal, classifier = resumed
    # training_args.bin written by this process read back in the new one, as hasten's state
    assert causal["resumed_args_state"] == "hasten.state.partial"
    unreadable = classifier["resumed_args_state"]
    assert unreadable.startswith("unreadable: Cannot read a pickled PartialState"), unreadable
    assert "it has no _distributed_type" in unreadable
    assert "build the TrainingArguments" in unreadable and "does not read it" in unreadable
    for task, again in zip(TASKS, resumed):
        _assert_resumed_exactly(full[task], again, tmp_path / task)
        _assert_same_weights(
            tmp_path / task / "full" / "final" / "model.safetensors",
            tmp_path / task / "resumed" / "final" / "model.safetensors",
        )


def _check_sharding(engine: str, held: list[dict[str, int]]) -> None:
    """Each process holds what its engine promises: all of it (DDP) or a shard."""
    assert len(held) == 2
    full = held[0]["full"]
    params = [h["params"] for h in held]
    optimizer = [h.get("optimizer_fp32") for h in held]
    if engine == "ddp":
        assert params == [full, full]
    elif engine.startswith("fsdp2") or engine == "deepspeed_zero3":
        assert all(p < full for p in params) and sum(params) >= full, params
    if engine == "deepspeed_zero2":
        assert params == [full, full]  # ZeRO-2 keeps the parameters whole ...
    if engine.startswith("deepspeed"):
        # ... and shards the fp32 optimizer state (ZeRO-3 too).
        assert all(o is not None and o < full for o in optimizer) and sum(optimizer) >= full


@pytest.mark.ecosystem
@pytest.mark.timeout(900)
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("engine", list(ENGINES))
def test_trainer_on_two_processes_shards_and_resumes_exactly(
    engine: str, task: str, tmp_path: Path
) -> None:
    require_alias()
    if engine.startswith("deepspeed"):
        pytest.importorskip(
            "deepspeed", reason="deepspeed is not installed (pip install deepspeed)"
        )
    distributed_type, extra, trainer_args = ENGINES[engine]
    config = launch_config(tmp_path, distributed_type, **extra)
    common = ["--task", task, *trainer_args]
    full = run_script(
        "trainer_script.py", [*common, "--output_dir", str(tmp_path / "full")], config
    )
    resumed = run_script(
        "trainer_script.py",
        [
            *common,
            "--output_dir",
            str(tmp_path / "resumed"),
            "--resume",
            str(tmp_path / "full" / "checkpoint-4"),
        ],
        config,
    )
    expected_type = {"ddp": "MULTI_CPU", "deepspeed_zero2": "DEEPSPEED"}.get(
        engine, "DEEPSPEED" if engine.startswith("deepspeed") else "FSDP"
    )
    assert full["distributed_type"] == expected_type and full["num_processes"] == 2
    _check_sharding(engine, full["held"])
    _assert_resumed_exactly(full, resumed, tmp_path)


@pytest.mark.ecosystem
@pytest.mark.timeout(600)
def test_trainer_deepspeed_sequence_parallelism_splits_each_sequence(tmp_path: Path) -> None:
    # ParallelismConfig(sp_size=2, sp_backend="deepspeed") in TrainingArguments: DeepSpeed's
    # Ulysses attention and Trainer's deepspeed_ulysses_dl_adapter path, on 2 CPU processes.
    require_alias()
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    config = launch_config(tmp_path, "MULTI_CPU")
    zero3 = json.dumps({"zero_optimization": {"stage": 3}, **_ZERO})
    result = run_script(
        "trainer_script.py",
        ["--output_dir", str(tmp_path / "sp"), "--deepspeed", zero3, "--sp_size", "2"]
        + ["--batch_size", "1", "--max_steps", "4", "--save_steps", "4"],
        config,
    )
    assert result["distributed_type"] == "DEEPSPEED" and result["num_processes"] == 2
    for held in result["held"]:
        assert held["train_seq_lengths"] == [8]  # each process ran half of every 16 tokens
    _check_sharding("deepspeed_zero3", result["held"])
    losses = _steps(result["losses"])
    assert sorted(losses) == [1, 2, 3, 4]
    # The untrained model's loss on random tokens: about log(vocabulary size) = log(30).
    assert all(abs(loss - math.log(30)) < 0.3 for loss in losses.values())
