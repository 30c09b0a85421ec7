"""PartialState across 2 real processes (forked, gloo on loopback)."""

from __future__ import annotations

import contextlib
import datetime
import io
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(60)]


def _describe_state() -> dict[str, Any]:
    import torch.distributed as dist

    from hasten.state import PartialState

    state = PartialState()
    return {
        "type": state.distributed_type.value,
        "backend": state.backend,
        "group_backend": dist.get_backend(),
        "num": state.num_processes,
        "index": state.process_index,
        "local": state.local_process_index,
        "device": str(state.device),
        "main": state.is_main_process,
        "local_main": state.is_local_main_process,
        "last": state.is_last_process,
        "distributed": state.use_distributed,
        "timeout": state.process_group_timeout,
    }


def test_multi_process_launch_on_cpu_is_multi_cpu_gloo_without_cpu_flag() -> None:
    first, second = run_distributed(_describe_state, world_size=2)
    for rank, info in enumerate((first, second)):
        assert info["type"] == "MULTI_CPU" and info["backend"] == info["group_backend"] == "gloo"
        assert (info["num"], info["index"], info["local"]) == (2, rank, rank)
        assert info["device"] == "cpu" and info["distributed"]
        assert info["timeout"] == datetime.timedelta(minutes=10)
    assert (first["main"], first["local_main"], first["last"]) == (True, True, False)
    assert (second["main"], second["local_main"], second["last"]) == (False, False, True)


def _mpi_style_launch() -> tuple[str, int, int, str | None]:
    from hasten.config import envvars
    from hasten.state import PartialState

    rank, size = envvars.read("RANK"), envvars.read("WORLD_SIZE")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        envvars.remove(name)
    envvars.write("OMPI_COMM_WORLD_RANK", rank)
    envvars.write("OMPI_COMM_WORLD_SIZE", size)
    state = PartialState(timeout=datetime.timedelta(seconds=20))
    state.wait_for_everyone()
    return (
        state.distributed_type.value,
        state.num_processes,
        state.process_index,
        envvars.read("RANK"),
    )


def test_mpi_style_variables_start_a_gloo_group() -> None:
    results = run_distributed(_mpi_style_launch, world_size=2)
    assert results == [("MULTI_CPU", 2, 0, "0"), ("MULTI_CPU", 2, 1, "1")]


def _split(inputs: Any, apply_padding: bool) -> Any:
    from hasten.state import PartialState

    with PartialState().split_between_processes(inputs, apply_padding=apply_padding) as share:
        if isinstance(share, torch.Tensor):
            return share.tolist()
        if isinstance(share, dict):
            return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in share.items()}
        return share


@pytest.mark.parametrize(
    ("inputs", "padding", "expected"),
    [
        (["a", "b", "c"], False, [["a", "b"], ["c"]]),
        (["a", "b", "c"], True, [["a", "b"], ["c", "c"]]),
        (("a", "b", "c", "d", "e"), True, [("a", "b", "c"), ("d", "e", "e")]),
        (torch.arange(5), False, [[0, 1, 2], [3, 4]]),
        (torch.arange(5), True, [[0, 1, 2], [3, 4, 4]]),
        (
            {"x": [1, 2, 3], "y": torch.tensor([4, 5, 6])},
            True,
            [{"x": [1, 2], "y": [4, 5]}, {"x": [3, 3], "y": [6, 6]}],
        ),
        (["only"], True, [["only"], ["only"]]),
        (["only"], False, [["only"], []]),
    ],
    ids=["list", "list-pad", "tuple-pad", "tensor", "tensor-pad", "dict-pad", "short-pad", "short"],
)
def test_split_between_processes_uneven(inputs: Any, padding: bool, expected: list[Any]) -> None:
    assert run_distributed(_split, inputs, padding, world_size=2) == expected


def _main_first(log: str) -> None:
    from hasten.state import PartialState

    state = PartialState()
    with state.main_process_first():
        if state.is_main_process:
            time.sleep(0.2)  # a slow main must still finish first
        with open(log, "a") as handle:
            handle.write(f"{state.process_index}\n")


def test_main_process_first_orders_processes(tmp_path: Path) -> None:
    log = tmp_path / "order.txt"
    run_distributed(_main_first, str(log), world_size=2)
    assert log.read_text().split() == ["0", "1"]


def _wait(flag: str) -> bool:
    from hasten.state import PartialState, wait_for_everyone

    state = PartialState()
    if state.is_main_process:
        time.sleep(0.2)
        Path(flag).write_text("done")
    wait_for_everyone()
    return os.path.exists(flag)


def test_wait_for_everyone_blocks_until_all_arrive(tmp_path: Path) -> None:
    assert run_distributed(_wait, str(tmp_path / "flag"), world_size=2) == [True, True]


def _decorated() -> list[Any]:
    from hasten.state import PartialState

    state = PartialState()

    @state.on_process(process_index=1)
    def on_one() -> str:
        return "one"

    @state.on_main_process
    def on_main() -> str:
        return "main"

    @state.on_last_process
    def on_last() -> str:
        return "last"

    @state.on_local_process(local_process_index=0)
    def on_local_zero() -> str:
        return "local0"

    return [on_one(), on_main(), on_last(), on_local_zero()]


def test_on_process_decorators() -> None:
    assert run_distributed(_decorated, world_size=2) == [
        [None, "main", None, "local0"],
        ["one", None, "last", None],
    ]


def _print_and_log() -> tuple[str, list[str]]:
    from hasten.logging import get_logger
    from hasten.state import PartialState

    state = PartialState()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        state.print("printed")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = get_logger(f"hasten.dist.{state.process_index}", log_level="INFO")
    logger.logger.addHandler(handler)
    logger.info("main")
    logger.info("all", main_process_only=False)
    logger.info("ordered", in_order=True)
    return out.getvalue(), records


def test_print_and_logger_choose_processes() -> None:
    (out0, logs0), (out1, logs1) = run_distributed(_print_and_log, world_size=2)
    assert out0 == "printed\n" and out1 == ""
    assert logs0 == ["[RANK 0] main", "[RANK 0] all", "[RANK 0] ordered"]
    assert logs1 == ["[RANK 1] all", "[RANK 1] ordered"]


def _accelerator_state() -> tuple[str, bool, str]:
    from hasten.state import AcceleratorState

    state = AcceleratorState(mixed_precision="bf16", _from_accelerator=True)
    state.wait_for_everyone()
    return state.distributed_type.value, state.is_main_process, state.mixed_precision


def test_accelerator_state_across_processes() -> None:
    assert run_distributed(_accelerator_state, world_size=2) == [
        ("MULTI_CPU", True, "bf16"),
        ("MULTI_CPU", False, "bf16"),
    ]


def _pickled_states() -> bytes:
    import pickle

    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    loaded = pickle.loads(pickle.dumps(accelerator.state))
    loaded.wait_for_everyone()  # the record's barrier acts on this process's group
    return pickle.dumps((accelerator.state._partial, accelerator.state))


def test_states_of_a_two_process_run_pickle_and_read_back_elsewhere() -> None:
    import pickle

    from hasten.config.enums import DistributedType

    for rank, data in enumerate(run_distributed(_pickled_states, world_size=2)):
        partial, state = pickle.loads(data)  # here: no process group
        assert partial.distributed_type == state.distributed_type == DistributedType.MULTI_CPU
        assert (partial.num_processes, partial.process_index) == (2, rank)
        assert partial.is_main_process == (rank == 0) and state.use_distributed
