"""Run by ``hasten launch`` for tests/cli/test_resume_matrix.py: save, resume, reshard.

``resume_matrix_script.py CHECKPOINTS RESULTS PHASE CASE [CASE ...]``. For each case (an engine
and state-dict type) the script builds that case's `Accelerator` and prepares one model per
optimizer variant (SGD with momentum, AdamW, AdamW with two parameter groups); every model sees
the same global batches, split across the data-parallel processes. Steps come in threes:

- ``save`` (2 processes): steps 0-2, ``save_state(CHECKPOINTS/by2/...)``, steps 3-5 ("after":
  the uninterrupted run);
- ``reshard`` (1 process): from other weights, ``load_state`` of the 2-process checkpoint,
  steps 3-5 ("resumed"), ``save_state(CHECKPOINTS/by1/...)``, steps 6-8 ("after");
- ``load`` (2 new processes): from other weights, ``load_state`` of the 2-process checkpoint,
  steps 3-5 ("resumed"), then ``load_state`` of the 1-process one, steps 6-8 ("resumed_by1").

Each process writes ``RESULTS/result_<rank>.json``: per case and variant the losses of each
part, or the error a refused part raised. Cases run one after another in this process (the state
and the environment are reset between them, the process group stays), so three launches cover
the whole matrix.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _support.fsdp_models import TinyTransformer, batches  # noqa: E402
from hasten import Accelerator  # noqa: E402
from hasten.state import AcceleratorState, GradientState  # noqa: E402
from hasten.utils import (  # noqa: E402
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    set_seed,
)

VARIANTS = ("sgd", "adamw", "adamw2")
BEFORE = 3  # steps before each save, and after it
GLOBAL_BATCH = 8  # rows per step, split across the data-parallel processes


class Net(TinyTransformer):
    """TinyTransformer with a tensor-parallel plan and a one-row head.

    The head has fewer rows than processes: FSDP1's sharded state dict then holds no chunk of
    it on process 1, which DCP's pre-2.4 fallback took for an old checkpoint layout (``Missing
    key in checkpoint state_dict: optimizer_0.param_groups``, see
    `hasten.checkpointing.storage.dcp_safe.SafeLoadPlanner`).
    """

    tp_plan = {"layers.*.up": "colwise", "layers.*.down": "rowwise"}

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 1)


def _optimizer(variant: str, model: nn.Module) -> torch.optim.Optimizer:
    if variant == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if variant == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-2)
    matrices = [p for p in model.parameters() if p.dim() > 1]
    vectors = [p for p in model.parameters() if p.dim() <= 1]  # biases and norms
    return torch.optim.AdamW(
        [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "lr": 3e-3}], lr=1e-2
    )


def _fsdp(version: int, state_dict_type: str, **options: Any) -> dict[str, Any]:
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=version,
        state_dict_type=state_dict_type,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        **options,
    )
    return {"fsdp_plugin": plugin}


def _accelerator_kwargs(case: str, processes: int) -> dict[str, Any]:
    """The Accelerator's arguments for ``case`` (created fresh for every group)."""
    engine, _, kind = case.partition("-")
    state_dict_type = f"{kind.upper()}_STATE_DICT"
    if engine == "fsdp2":
        return _fsdp(2, state_dict_type)
    if engine in ("fsdp1orig", "fsdp1flat"):
        return _fsdp(1, state_dict_type, use_orig_params=engine == "fsdp1orig")
    if engine in ("zero2", "zero3"):
        return {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=int(engine[-1]))}
    if engine == "tp":  # one process: the same model, unsharded (tensor parallel needs two)
        return {"parallelism_config": ParallelismConfig(tp_size=2)} if processes > 1 else {}
    raise ValueError(f"unknown case {case!r}")


def _groups(case: str) -> list[tuple[str, ...]]:
    """Variants prepared together by one Accelerator (DeepSpeed: one model per engine)."""
    if case.startswith("zero"):
        return [(variant,) for variant in VARIANTS]
    if case.startswith("fsdp1flat"):  # flat parameters take one group over all: refused
        return [VARIANTS[:2], VARIANTS[2:]]
    return [VARIANTS]


def _data_shard(accelerator: Accelerator, case: str) -> tuple[int, int]:
    """This process's (data-parallel rank, size): tensor parallel ranks see the same data."""
    if case.startswith("tp") and accelerator.num_processes > 1:
        return 0, 1
    return accelerator.process_index, accelerator.num_processes


def _train(
    accelerator: Accelerator, pairs: list[tuple[Any, Any]], shard: tuple[int, int], start: int
) -> list[list[float]]:
    """Steps ``start`` .. ``start + 3`` of every pair on the same batches; their losses.

    The global batches are the same on any number of processes (resharded runs compare).
    """
    rank, size = shard
    data = batches(rank, size, start + 3, size=GLOBAL_BATCH // size)[start:]
    losses: list[list[float]] = [[] for _ in pairs]
    for x, y in data:
        for index, (model, optimizer) in enumerate(pairs):
            loss = nn.functional.mse_loss(model(x), y[:, :1])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses[index].append(float(loss.detach()))
    return losses


def _resume(
    accelerator: Accelerator, pairs: list[Any], shard: tuple[int, int], folder: Path, start: int
) -> list[list[float]] | str:
    """``load_state(folder)``, then 3 steps from ``start``: their losses, or the refusal."""
    try:
        accelerator.load_state(str(folder))
    except Exception as exc:  # noqa: BLE001 - a refused load is a result (every process alike)
        return f"{type(exc).__name__}: {exc}"
    return _train(accelerator, pairs, shard, start)


def _run_group(checkpoints: Path, phase: str, case: str, group: tuple[str, ...]) -> dict[str, Any]:
    processes = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    accelerator = Accelerator(**_accelerator_kwargs(case, processes))
    shard = _data_shard(accelerator, case)
    if accelerator.state.deepspeed_plugin is not None:  # no DataLoader to take it from
        config = accelerator.state.deepspeed_plugin.deepspeed_config
        config["train_micro_batch_size_per_gpu"] = GLOBAL_BATCH // shard[1]
    by2, by1 = (checkpoints / saver / case / "-".join(group) for saver in ("by2", "by1"))
    set_seed(0 if phase == "save" else 99)  # a loading run starts from other weights
    objects: list[Any] = []
    for variant in group:
        model = Net()
        objects += [model, _optimizer(variant, model)]
    prepared = accelerator.prepare(*objects)
    pairs = list(zip(prepared[::2], prepared[1::2]))
    parts: dict[str, list[list[float]] | str] = {}
    if phase == "save":
        _train(accelerator, pairs, shard, 0)
        accelerator.save_state(str(by2))
        parts["after"] = _train(accelerator, pairs, shard, BEFORE)
    elif phase == "reshard":
        parts["resumed"] = _resume(accelerator, pairs, shard, by2, BEFORE)
        accelerator.save_state(str(by1))
        parts["after"] = _train(accelerator, pairs, shard, 2 * BEFORE)
    else:
        parts["resumed"] = _resume(accelerator, pairs, shard, by2, BEFORE)
        parts["resumed_by1"] = _resume(accelerator, pairs, shard, by1, 2 * BEFORE)
    return {
        variant: {
            part: value if isinstance(value, str) else value[index] for part, value in parts.items()
        }
        for index, variant in enumerate(group)
    }


def main() -> int:
    checkpoints, out, phase = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    cases = sys.argv[4:]
    results: dict[str, Any] = {}
    rank = 0
    environment = dict(os.environ)  # noqa: TID251 - plugins export ACCELERATE_USE_* settings
    for case in cases:
        results[case] = {}
        for group in _groups(case):
            try:
                results[case].update(_run_group(checkpoints, phase, case, group))
            except Exception as exc:  # noqa: BLE001 - a refused case is reported, not fatal
                message = f"{type(exc).__name__}: {exc}"
                results[case].update({variant: {"error": message} for variant in group})
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            AcceleratorState._reset_state(reset_partial_state=True)
            GradientState._reset_state()
            os.environ.clear()  # noqa: TID251 - the next case starts from the launch's settings
            os.environ.update(environment)  # noqa: TID251
    out.mkdir(parents=True, exist_ok=True)
    (out / f"result_{rank}.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
