"""save_state -> a new ``hasten launch`` -> load_state, over engines x state-dict types x optimizers.

`resume_matrix_script.py` runs every case in each launch, one after another: FSDP2, FSDP1 with
``use_orig_params`` true and false, each with FULL and SHARDED state dicts; tensor parallelism
(DCP shards: it has no state-dict type); DeepSpeed ZeRO-2 and ZeRO-3 (the engine writes its own
files); each with SGD (momentum), AdamW and AdamW with two parameter groups. Three launches:

1. 2 processes: 3 steps, save, 3 more steps (the uninterrupted run);
2. 1 new process: load the 2-process checkpoint (2 -> 1), 3 steps, save, 3 more steps;
3. 2 new processes: load the 2-process checkpoint, 3 steps: the same losses as launch 1, bit for
   bit (same processes, same reductions); then load the 1-process checkpoint (1 -> 2), 3 steps.

Resharded runs (FSDP2, FSDP1, tensor parallelism; ZeRO through DeepSpeed's universal checkpoint)
give the loss of each global batch within float rounding of the run they resume; process 1 of 2
has no saved RNG states and says so. Refusals are part of the matrix: FSDP1 with flat parameters
cannot take two parameter groups, and ZeRO with SGD (DeepSpeed's universal checkpoint carries
Adam's moments only) or ZeRO-3 with two parameter groups cannot change its number of processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cli

HERE = Path(__file__).parent
SCRIPT = HERE / "resume_matrix_script.py"
HASTEN = Path(sys.executable).parent / "hasten"

FSDP = [
    f"{engine}-{kind}"
    for engine in ("fsdp2", "fsdp1orig", "fsdp1flat")
    for kind in ("full", "sharded")
]
DEEPSPEED = ["zero2", "zero3"]
RESHARDING = [*FSDP, "tp", *DEEPSPEED]
CASES = RESHARDING
VARIANTS = ("sgd", "adamw", "adamw2")
# Resharded runs reduce in another order (one process sums the whole batch; two all-reduce
# halves): the same math, float32 rounding apart. Over these few steps the losses move by about
# 1e-7 relative; 1e-5 leaves room and still catches a wrong state (a lost momentum or Adam
# moment changes the next losses by 1e-3 or more).
RESHARD_RTOL = 1e-5


def _launch(
    processes: int, checkpoints: Path, results: Path, phase: str
) -> tuple[list[dict[str, Any]], str]:
    """Every case in one ``hasten launch``: each process's results, and the launch's stderr."""
    command = [str(HASTEN), "launch", "--cpu", "--num_processes", str(processes)]
    done = subprocess.run(
        [*command, str(SCRIPT), str(checkpoints), str(results), phase, *CASES],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    runs = [json.loads((results / f"result_{r}.json").read_text()) for r in range(processes)]
    return runs, done.stderr


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory, deepspeed_ops: None) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("matrix")
    found: dict[str, Any] = {}
    for name, processes in (("save", 2), ("reshard", 1), ("load", 2)):
        found[name], found[f"{name}_stderr"] = _launch(processes, root, root / name, name)
    return found


def _part(run: dict[str, Any], case: str, variant: str, part: str) -> Any:
    entry = run[case][variant]
    assert "error" not in entry, f"{case}/{variant}: {entry['error']}"
    return entry[part]


def _losses(run: dict[str, Any], case: str, variant: str, part: str) -> list[float]:
    value = _part(run, case, variant, part)
    assert isinstance(value, list), f"{case}/{variant} {part}: {value}"
    return value


def _global(runs: list[dict[str, Any]], case: str, variant: str, part: str) -> list[float]:
    """The loss of each global batch: the mean over data-parallel processes (equal halves)."""
    if case == "tp":  # both processes compute the loss of the whole batch
        return _losses(runs[0], case, variant, part)
    per_rank = [_losses(run, case, variant, part) for run in runs]
    return [sum(values) / len(values) for values in zip(*per_rank)]


def _variants(case: str) -> tuple[str, ...]:
    """The variants that run (FSDP1's flat parameters refuse two groups, tested apart)."""
    return VARIANTS[:2] if case.startswith("fsdp1flat") else VARIANTS


def _resharded_variants(case: str) -> tuple[str, ...]:
    """The variants that load on another number of processes (ZeRO refuses SGD, and ZeRO-3 two
    parameter groups: tested apart)."""
    if case == "zero3":
        return ("adamw",)
    return VARIANTS[1:] if case in DEEPSPEED else _variants(case)


@pytest.mark.timeout(1300)
@pytest.mark.parametrize("case", CASES)
def test_new_processes_resume_exactly(matrix: dict[str, Any], case: str) -> None:
    for variant in _variants(case):
        for rank in (0, 1):
            after_save = _losses(matrix["save"][rank], case, variant, "after")
            resumed = _losses(matrix["load"][rank], case, variant, "resumed")
            assert resumed == after_save, (case, variant, rank)  # bitwise


@pytest.mark.parametrize("case", RESHARDING)
def test_two_process_checkpoints_load_on_one_process(matrix: dict[str, Any], case: str) -> None:
    for variant in _resharded_variants(case):
        expected = _global(matrix["save"], case, variant, "after")
        got = _losses(matrix["reshard"][0], case, variant, "resumed")
        assert got == pytest.approx(expected, rel=RESHARD_RTOL), (case, variant)


@pytest.mark.parametrize("case", RESHARDING)
def test_one_process_checkpoints_load_on_two_processes(matrix: dict[str, Any], case: str) -> None:
    for variant in _resharded_variants(case):
        expected = _losses(matrix["reshard"][0], case, variant, "after")
        got = _global(matrix["load"], case, variant, "resumed_by1")
        assert got == pytest.approx(expected, rel=RESHARD_RTOL), (case, variant)
    # process 1 has no RNG states in a 1-process checkpoint: it keeps its own, and says so
    assert "saved by 1 process(es), so process 1 has no saved RNG states" in matrix["load_stderr"]


@pytest.mark.parametrize("case", ["fsdp1flat-full", "fsdp1flat-sharded"])
def test_fsdp1_flat_parameters_refuse_two_parameter_groups(
    matrix: dict[str, Any], case: str
) -> None:
    for run in (*matrix["save"], *matrix["load"]):  # (one process runs without FSDP)
        error = run[case]["adamw2"]["error"]
        assert error.startswith("ValueError: The optimizer AdamW has 2 parameter group(s)"), error
        assert "Set use_orig_params=True" in error


@pytest.mark.parametrize("case", DEEPSPEED)
def test_deepspeed_zero_checkpoints_of_sgd_refuse_another_number_of_processes(
    matrix: dict[str, Any], case: str
) -> None:
    refusals = [(matrix["reshard"][0], "resumed", 2, 1)]
    refusals += [(run, "resumed_by1", 1, 2) for run in matrix["load"]]  # on every process
    for run, part, saved, loading in refusals:
        error = _part(run, case, "sgd", part)
        assert isinstance(error, str), (case, part)
        assert error.startswith(
            f"ValueError: This ZeRO checkpoint was saved by {saved} process(es) and is "
            f"loaded by {loading}, which goes through DeepSpeed's universal checkpoint"
        ), error
        assert "the state of SGD would be lost" in error


def test_deepspeed_zero3_checkpoints_of_two_groups_refuse_another_number_of_processes(
    matrix: dict[str, Any],
) -> None:
    refusals = [(matrix["reshard"][0], "resumed", 2, 1)]
    refusals += [(run, "resumed_by1", 1, 2) for run in matrix["load"]]  # on every process
    for run, part, saved, loading in refusals:
        error = _part(run, "zero3", "adamw2", part)
        assert isinstance(error, str), part
        assert error.startswith(
            f"ValueError: This ZeRO-3 checkpoint was saved by {saved} process(es) and is "
            f"loaded by {loading}, through DeepSpeed's universal checkpoint"
        ), error
        assert "use one parameter group, or use ZeRO stage 1 or 2" in error
