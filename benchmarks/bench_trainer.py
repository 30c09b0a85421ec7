"""transformers Trainer steps per second: hasten-as-accelerate against real Accelerate.

Most people reach accelerate through transformers' ``Trainer``. This benchmark trains the same tiny
Llama (built from a config, in-memory token data, AdamW) with ``Trainer.train`` in two virtual
environments that differ only in what ``accelerate`` is: real ``accelerate==1.15.0`` in one, the
``accelerate`` distribution that is hasten (``hasten accelerate install``) in the other. Each side
runs on 1 and on 2 CPU processes (launched the same way for both, by torchrun from that venv, so
the launcher is not what is measured); the rounds alternate the sides, and the median steps per
second of each is printed with the ratio hasten / accelerate (above 1: hasten is faster). A third
row, "torch", runs the same model, batches and optimizer in a hand-written loop (DDP on 2
processes) in the hasten venv: the floor that neither framework can beat. The final losses of
the two sides are printed too: they must agree, or the speed comparison compares different work.

Usage::

    python benchmarks/bench_trainer.py [--steps 60] [--warmup 10] [--rounds 3] [--procs 1 2]
        [--accelerate-venv DIR] [--hasten-venv DIR] [--cache-dir DIR]

Without ``--*-venv`` the two venvs are created (once, then reused) under ``--cache-dir``
(default ``~/.cache/hasten/bench_trainer``): torch 2.13.0 first (the local CPU wheel), then
transformers, and either ``accelerate==1.15.0`` or this repository (editable) plus
``hasten accelerate install``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TORCH_SPEC = "torch==2.13.0"
TRANSFORMERS_SPEC = "transformers==5.24.0"
ACCELERATE_SPEC = "accelerate==1.15.0"
SIDES = ("accelerate", "hasten")
SEQ = 64
RUN_TIMEOUT_S = 600  # one launch; a healthy one takes seconds
BATCH = 8


# -- the measured work (runs inside a venv, one process per rank) ---------------------------------


def _tiny_llama() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return LlamaForCausalLM(config)


def _tokens(n: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 512, (n, SEQ), generator=g)


def _accelerate_identity() -> str:
    """Which accelerate this process runs: the distribution's version and the Accelerator's module."""
    from importlib.metadata import version

    import accelerate

    return f"{version('accelerate')} ({accelerate.Accelerator.__module__})"


def trainer_worker(steps: int, warmup: int, out: Path) -> None:
    """Train with ``Trainer`` for ``warmup + steps`` steps; rank 0 writes steps/s to ``out``."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # noqa: TID251 - runs outside hasten
    data = _tokens((steps + warmup) * BATCH * world)
    dataset = [{"input_ids": row, "labels": row} for row in data]
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=BATCH,
            max_steps=steps + warmup,
            learning_rate=1e-3,
            use_cpu=True,
            logging_strategy="no",
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = Trainer(
            model=_tiny_llama(), args=args, train_dataset=dataset, callbacks=[Clock()]
        )
        result = trainer.train()
        rank0 = trainer.is_world_process_zero()
    if rank0:
        _write(out, stamps, warmup, result.training_loss, _accelerate_identity())


def torch_worker(steps: int, warmup: int, out: Path) -> None:
    """The same model, batches and AdamW in a hand-written loop (DDP on more than one process)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # noqa: TID251
    model = _tiny_llama()
    if world > 1:
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    rank = dist.get_rank() if world > 1 else 0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total = steps + warmup
    # Trainer's defaults: linear decay to 0, gradient norm clipped at 1.0.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: max(0.0, (total - i) / total))
    data = _tokens(total * BATCH * world)
    stamps: list[float] = []
    losses = []
    model.train()
    for i in range(total):
        start = (i * world + rank) * BATCH
        batch = data[start : start + BATCH]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        stamps.append(time.perf_counter())
    if rank == 0:
        _write(out, stamps, warmup, statistics.fmean(losses), "none (torch)")
    if world > 1:
        # torch 2.13 can deadlock when a destroyed gloo group is freed (here by DDP's reducer)
        # while one of its threads still drops a work issued in backward: it hung torchrun once.
        # Free the model while the group is alive, and let the threads drain before the destroy
        # (hasten does the same in end_training: src/hasten/state/teardown.py).
        del model, opt, sched
        dist.barrier()
        time.sleep(0.05)
        dist.destroy_process_group()


def _write(out: Path, stamps: list[float], warmup: int, loss: float, identity: str) -> None:
    measured = stamps[warmup - 1 :] if warmup else stamps
    rate = (len(measured) - 1) / (measured[-1] - measured[0])
    out.write_text(json.dumps({"steps_per_s": rate, "loss": loss, "accelerate": identity}))


# -- venvs ----------------------------------------------------------------------------------------


def _pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args], check=True)


def ensure_venv(side: str, cache: Path) -> Path:
    """Create (once) the venv of one side under ``cache``; return its folder."""
    venv = cache / side
    stamp = venv / ".bench-trainer-ready"
    if stamp.exists():
        return venv
    print(f"creating the {side} venv in {venv} (once; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _pip(venv, TORCH_SPEC)
    if side == "accelerate":
        _pip(venv, TORCH_SPEC, TRANSFORMERS_SPEC, ACCELERATE_SPEC)
    else:
        _pip(venv, TORCH_SPEC, TRANSFORMERS_SPEC, "-e", str(REPO))
        subprocess.run([str(venv / "bin" / "hasten"), "accelerate", "install"], check=True)
    stamp.touch()
    return venv


def check_side(side: str, venv: Path) -> str:
    """The accelerate a venv runs; refuse a venv whose accelerate is not the side it stands for."""
    code = f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import bench_trainer as b; print(b._accelerate_identity())"
    ident = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False
    )
    if ident.returncode != 0:
        raise SystemExit(f"{side} venv {venv}: cannot import accelerate:\n{ident.stderr[-2000:]}")
    found = ident.stdout.strip()
    if (side == "hasten") != found.endswith("(hasten.accelerator)"):
        raise SystemExit(
            f"{side} venv {venv} runs accelerate {found}: expected "
            + (
                "hasten's (run `hasten accelerate install` there)"
                if side == "hasten"
                else "the real one"
            )
        )
    return found


# -- the run --------------------------------------------------------------------------------------


def run_once(venv: Path, kind: str, nproc: int, steps: int, warmup: int) -> dict[str, Any]:
    """One launch of ``nproc`` workers of ``kind`` ("trainer" or "torch") from ``venv``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            str(venv / "bin" / "python"),
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            str(Path(__file__).resolve()),
            "--worker",
            kind,
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--out",
            str(out),
        ]
        env = dict(os.environ)  # noqa: TID251 - the workers' environment, outside hasten
        env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        # Its own session, so that a launch that hangs is killed with all of its workers.
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            raise SystemExit(
                f"{kind} run in {venv} ({nproc} proc) still running after {RUN_TIMEOUT_S} s: "
                f"killed. Its stderr:\n{stderr[-4000:]}"
            ) from None
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"{kind} run failed in {venv} ({nproc} proc):\n{stderr[-4000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the clock starts")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side and process count")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--accelerate-venv", type=Path, help="a venv with real accelerate 1.15")
    parser.add_argument("--hasten-venv", type=Path, help="a venv with hasten as accelerate")
    parser.add_argument("--no-torch", action="store_true", help="skip the hand-written loop")
    parser.add_argument(
        "--cache-dir", type=Path, default=Path.home() / ".cache" / "hasten" / "bench_trainer"
    )
    parser.add_argument("--worker", choices=["trainer", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        (trainer_worker if args.worker == "trainer" else torch_worker)(
            args.steps, args.warmup, args.out
        )
        return
    venvs = {
        "accelerate": args.accelerate_venv or ensure_venv("accelerate", args.cache_dir),
        "hasten": args.hasten_venv or ensure_venv("hasten", args.cache_dir),
    }
    for side, venv in venvs.items():
        print(f"{side:<10} venv {venv}: accelerate {check_side(side, venv)}")
    runs: list[tuple[str, str]] = [("accelerate", "trainer"), ("hasten", "trainer")]
    if not args.no_torch:
        runs.append(("hasten", "torch"))
    print(f"tiny Llama, batch {BATCH}x{SEQ} per process, {args.steps} steps after {args.warmup}")
    for nproc in args.procs:
        rates: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
        losses: dict[tuple[str, str], float] = {}
        for r in range(args.rounds):
            for side, kind in runs[r % len(runs) :] + runs[: r % len(runs)]:
                result = run_once(venvs[side], kind, nproc, args.steps, args.warmup)
                rates[(side, kind)].append(result["steps_per_s"])
                losses[(side, kind)] = result["loss"]
        med = {run: statistics.median(v) for run, v in rates.items()}
        base = med[("accelerate", "trainer")]
        print(f"{nproc} process{'es' if nproc > 1 else ''}:")
        for (side, kind), rate in med.items():
            label = f"{side} Trainer" if kind == "trainer" else "torch loop"
            print(
                f"  {label:<20} {rate:8.2f} steps/s (median of {args.rounds}; "
                f"best {max(rates[(side, kind)]):.2f})   ratio to accelerate {rate / base:.3f}"
                f"   loss {losses[(side, kind)]:.6f}"
            )
        if losses[("accelerate", "trainer")] != losses[("hasten", "trainer")]:
            print("  note: the two Trainer runs ended with different losses")


if __name__ == "__main__":
    main()
