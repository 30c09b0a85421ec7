"""Helpers that test suites import from ``accelerate.test_utils.testing``: skip decorators that
really probe the hardware and packages, launch/subprocess helpers and small `TestCase` bases.

The backend (``torch_device``, ``device_count``, ``memory_allocated_func``) is probed once at
import, as in Accelerate.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import torch

import hasten
from hasten.config import envvars
from hasten.core import imports
from hasten.core.environment import parse_flag_from_env
from hasten.core.versions import is_torch_version
from hasten.platforms import checks

__all__ = [
    "AccelerateTestCase",
    "DEFAULT_LAUNCH_COMMAND",
    "MockingTestCase",
    "SubprocessCallException",
    "TempDirTestCase",
    "are_the_same_tensors",
    "assert_exception",
    "capture_call_output",
    "device_count",
    "execute_subprocess_async",
    "get_backend",
    "get_launch_command",
    "get_torch_dist_unique_port",
    "memory_allocated_func",
    "path_in_accelerate_package",
    "pytest_xdist_worker_id",
    "require_aim",
    "require_bnb",
    "require_clearml",
    "require_comet_ml",
    "require_cpu",
    "require_cuda",
    "require_cuda_or_hpu",
    "require_cuda_or_xpu",
    "require_deepspeed",
    "require_dvclive",
    "require_fp16",
    "require_fp8",
    "require_fsdp",
    "require_hpu",
    "require_huggingface_suite",
    "require_import_timer",
    "require_matplotlib",
    "require_mlflow",
    "require_mlu",
    "require_mps",
    "require_multi_device",
    "require_multi_gpu",
    "require_multi_gpu_or_xpu",
    "require_multi_xpu",
    "require_musa",
    "require_non_cpu",
    "require_non_hpu",
    "require_non_torch_xla",
    "require_non_xpu",
    "require_npu",
    "require_pandas",
    "require_pippy",
    "require_schedulefree",
    "require_sdaa",
    "require_single_device",
    "require_single_gpu",
    "require_single_xpu",
    "require_swanlab",
    "require_tensorboard",
    "require_timm",
    "require_torch_min_version",
    "require_torchao",
    "require_torchdata_stateful_dataloader",
    "require_torchvision",
    "require_tp",
    "require_tpu",
    "require_trackers",
    "require_trackio",
    "require_transformer_engine",
    "require_transformers",
    "require_triton",
    "require_wandb",
    "require_xpu",
    "run_command",
    "run_first",
    "skip",
    "slow",
    "torch_device",
]

T = TypeVar("T")


def get_backend() -> tuple[str, int, Callable[[], int]]:
    """Return ``(device type, device count, memory-allocated function)`` of this machine."""
    if checks.is_torch_xla_available():
        return "xla", torch.cuda.device_count(), torch.cuda.memory_allocated
    if checks.is_cuda_available():
        return "cuda", torch.cuda.device_count(), torch.cuda.memory_allocated
    if checks.is_mps_available(min_version="2.0"):
        return "mps", 1, torch.mps.current_allocated_memory
    if checks.is_mps_available():
        return "mps", 1, lambda: 0
    if checks.is_xpu_available():
        return "xpu", torch.xpu.device_count(), torch.xpu.memory_allocated
    for family, check in (
        ("mlu", checks.is_mlu_available),
        ("sdaa", checks.is_sdaa_available),
        ("musa", checks.is_musa_available),
        ("npu", checks.is_npu_available),
        ("hpu", checks.is_hpu_available),
    ):
        if check():
            module = getattr(torch, family)
            return family, module.device_count(), module.memory_allocated
    return "cpu", 1, lambda: 0


torch_device, device_count, memory_allocated_func = get_backend()


def get_launch_command(**kwargs: Any) -> list[str]:
    """The ``hasten launch`` command line for these flags (True -> ``--flag``, None dropped).

    Example:
        >>> get_launch_command(num_processes=2, cpu=True)
        ['hasten', 'launch', '--num_processes=2', '--cpu']
    """
    command = ["hasten", "launch"]
    for key, value in kwargs.items():
        if isinstance(value, bool):
            if value:
                command.append(f"--{key}")
        elif value is not None:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)

_run_slow_tests = parse_flag_from_env("RUN_SLOW", default=False)


def _unless(condition: bool, reason: str) -> Callable[[T], T]:
    return unittest.skipUnless(condition, reason)  # type: ignore[return-value]


def skip(test_case: T) -> T:
    """Skip the test unconditionally."""
    return unittest.skip("Test was skipped")(test_case)  # type: ignore[type-var]


def slow(test_case: T) -> T:
    """Skip the test unless ``RUN_SLOW`` is set to a true value."""
    return _unless(_run_slow_tests, "test is slow")(test_case)


def require_cpu(test_case: T) -> T:
    """Run the test only on a machine without accelerators."""
    return _unless(torch_device == "cpu", "test requires only a CPU")(test_case)


def require_non_cpu(test_case: T) -> T:
    """Run the test only where a hardware accelerator exists."""
    return _unless(torch_device != "cpu", "test requires a GPU")(test_case)


def require_cuda(test_case: T) -> T:
    """Run the test only with CUDA (and no torch_xla)."""
    ok = checks.is_cuda_available() and not checks.is_torch_xla_available()
    return _unless(ok, "test requires a GPU")(test_case)


def require_cuda_or_hpu(test_case: T) -> T:
    """Run the test only with CUDA or an HPU."""
    ok = (checks.is_cuda_available() and not checks.is_torch_xla_available()) or (
        checks.is_hpu_available()
    )
    return _unless(ok, "test requires a GPU or HPU")(test_case)


def require_cuda_or_xpu(test_case: T) -> T:
    """Run the test only with CUDA or an XPU."""
    ok = (checks.is_cuda_available() and not checks.is_torch_xla_available()) or (
        checks.is_xpu_available()
    )
    return _unless(ok, "test requires a CUDA GPU or XPU")(test_case)


def _family(name: str, check: Callable[[], bool]) -> Callable[[T], T]:
    def decorator(test_case: T) -> T:
        return _unless(check(), f"test requires a {name}")(test_case)

    decorator.__doc__ = f"Run the test only where a {name} is available."
    return decorator


require_xpu = _family("XPU", checks.is_xpu_available)
require_mlu = _family("MLU", checks.is_mlu_available)
require_musa = _family("MUSA", checks.is_musa_available)
require_npu = _family("NPU", checks.is_npu_available)
require_sdaa = _family("SDAA", checks.is_sdaa_available)
require_hpu = _family("HPU", checks.is_hpu_available)
require_mps = _family("`mps` backend support in `torch`", checks.is_mps_available)
require_tpu = _family("TPU", partial(checks.is_torch_xla_available, check_is_tpu=True))


def require_non_xpu(test_case: T) -> T:
    """Skip the test on XPU machines."""
    return _unless(torch_device != "xpu", "test requires a non-XPU")(test_case)


def require_non_hpu(test_case: T) -> T:
    """Skip the test on HPU machines."""
    return _unless(torch_device != "hpu", "test requires a non-HPU")(test_case)


def require_non_torch_xla(test_case: T) -> T:
    """Skip the test where torch_xla is installed."""
    return _unless(not checks.is_torch_xla_available(), "test requires an env without TorchXLA")(
        test_case
    )


def require_fp16(test_case: T) -> T:
    """Run the test only where fp16 compute is supported."""
    return _unless(checks.is_fp16_available(), "test requires fp16 support")(test_case)


def _fp8_usable() -> bool:
    if not imports.is_fp8_available():
        return False
    if torch.cuda.is_available():
        return torch.cuda.get_device_capability() >= (8, 9)
    return True


def require_fp8(test_case: T) -> T:
    """Run the test only with an FP8 backend (and, on CUDA, compute capability >= 8.9)."""
    return _unless(_fp8_usable(), "test requires FP8 support")(test_case)


def require_single_device(test_case: T) -> T:
    """Run the test only with exactly one hardware accelerator."""
    ok = torch_device != "cpu" and device_count == 1
    return _unless(ok, "test requires a hardware accelerator")(test_case)


def require_single_gpu(test_case: T) -> T:
    """Run the test only with exactly one CUDA GPU."""
    return _unless(torch.cuda.device_count() == 1, "test requires a GPU")(test_case)


def require_single_xpu(test_case: T) -> T:
    """Run the test only with exactly one XPU."""
    count = torch.xpu.device_count() if checks.is_xpu_available() else 0
    return _unless(count == 1, "test requires a XPU")(test_case)


def require_multi_device(test_case: T) -> T:
    """Run the test only with two or more hardware accelerators."""
    ok = torch_device != "cpu" and device_count > 1
    return _unless(ok, "test requires multiple hardware accelerators")(test_case)


def require_multi_gpu(test_case: T) -> T:
    """Run the test only with two or more CUDA GPUs."""
    return _unless(torch.cuda.device_count() > 1, "test requires multiple GPUs")(test_case)


def require_multi_xpu(test_case: T) -> T:
    """Run the test only with two or more XPUs."""
    count = torch.xpu.device_count() if checks.is_xpu_available() else 0
    return _unless(count > 1, "test requires multiple XPUs")(test_case)


def require_multi_gpu_or_xpu(test_case: T) -> T:
    """Run the test only with two or more CUDA GPUs or XPUs."""
    ok = (checks.is_cuda_available() or checks.is_xpu_available()) and device_count > 1
    return _unless(ok, "test requires multiple GPUs or XPUs")(test_case)


def _package(reason: str, check: Callable[[], bool]) -> Callable[[T], T]:
    def decorator(test_case: T) -> T:
        return _unless(check(), reason)(test_case)

    decorator.__doc__ = f"Skip the test unless: {reason[len('test requires ') :]}."
    return decorator


require_huggingface_suite = _package(
    "test requires the Hugging Face suite",
    lambda: imports.is_transformers_available() and imports.is_datasets_available(),
)
require_transformers = _package("test requires Transformers", imports.is_transformers_available)
require_timm = _package("test requires timm", imports.is_timm_available)
require_torchvision = _package("test requires torchvision", imports.is_torchvision_available)
require_triton = _package("test requires triton", imports.is_triton_available)
require_schedulefree = _package("test requires schedulefree", imports.is_schedulefree_available)
require_bnb = _package("test requires the bitsandbytes library", imports.is_bnb_available)
require_deepspeed = _package("test requires DeepSpeed", imports.is_deepspeed_available)
require_tensorboard = _package("test requires Tensorboard", imports.is_tensorboard_available)
require_wandb = _package("test requires wandb", imports.is_wandb_available)
require_comet_ml = _package("test requires comet_ml", imports.is_comet_ml_available)
require_clearml = _package("test requires clearml", imports.is_clearml_available)
require_aim = _package("test requires aim", imports.is_aim_available)
require_dvclive = _package("test requires dvclive", imports.is_dvclive_available)
require_swanlab = _package("test requires swanlab", imports.is_swanlab_available)
require_trackio = _package("test requires trackio", imports.is_trackio_available)
require_mlflow = _package("test requires mlflow", imports.is_mlflow_available)
require_pandas = _package("test requires pandas", imports.is_pandas_available)
require_matplotlib = _package("test requires matplotlib", imports.is_matplotlib_available)
require_pippy = _package("test requires pippy", imports.is_pippy_available)
require_import_timer = _package("test requires tuna interpreter", imports.is_import_timer_available)
require_transformer_engine = _package(
    "test requires transformers engine", imports.is_transformer_engine_available
)
require_torchao = _package("test requires torchao", imports.is_torchao_available)
require_torchdata_stateful_dataloader = _package(
    "test requires torchdata.stateful_dataloader",
    imports.is_torchdata_stateful_dataloader_available,
)
require_fsdp = _package(
    "test requires torch version >= 1.12.0", lambda: is_torch_version(">=", "1.12.0")
)
require_tp = _package(
    "test requires torch version >= 2.3.0", lambda: is_torch_version(">=", "2.3.0")
)

_atleast_one_tracker_available = (
    any([imports.is_wandb_available(), imports.is_tensorboard_available()])
    and not imports.is_comet_ml_available()
)


def require_trackers(test_case: T) -> T:
    """Run the test only when wandb or tensorboard is installed and comet_ml is not."""
    return _unless(
        _atleast_one_tracker_available,
        "test requires at least one tracker to be available and for `comet_ml` to not be installed",
    )(test_case)


def require_torch_min_version(test_case: Any = None, version: str | None = None) -> Any:
    """Run the test only with torch >= ``version`` (usable as ``@require_torch_min_version(version=...)``).

    Raises:
        ValueError: no version was given.
    """
    if version is None:
        raise ValueError("require_torch_min_version needs version=..., e.g. version='2.4.0'")
    if test_case is None:
        return partial(require_torch_min_version, version=version)
    ok = is_torch_version(">=", version)
    return _unless(ok, f"test requires torch version >= {version}")(test_case)


def run_first(test_case: T) -> T:
    """Mark the test ``order(1)``: with the pytest-order plugin it runs before the others."""
    if imports.is_pytest_available():
        import pytest  # optional: pytest

        return cast(T, pytest.mark.order(1)(test_case))
    return test_case


class TempDirTestCase(unittest.TestCase):
    """A TestCase with one temporary directory per class (``self.tmpdir``), emptied before
    each test when ``clear_on_setup`` is True and removed after the class.
    """

    clear_on_setup = True
    tmpdir: Path

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def setUp(self) -> None:
        if self.clear_on_setup:
            for path in self.tmpdir.glob("**/*"):
                if path.is_file():
                    path.unlink()
                elif path.is_dir():
                    shutil.rmtree(path)


class AccelerateTestCase(unittest.TestCase):
    """A TestCase that resets the accelerator and process state after every test."""

    def tearDown(self) -> None:
        super().tearDown()
        from hasten.state import AcceleratorState, PartialState

        AcceleratorState._reset_state()
        PartialState._reset_state()


class MockingTestCase(unittest.TestCase):
    """A TestCase whose ``add_mocks`` starts patches and stops them when the test ends."""

    def add_mocks(self, mocks: Any) -> None:
        """Start ``mocks`` (one patcher or a list of them) until the end of the test."""
        self.mocks = list(mocks) if isinstance(mocks, (tuple, list)) else [mocks]
        for patcher in self.mocks:
            patcher.start()
            self.addCleanup(patcher.stop)


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Whether every process holds the same values in ``tensor``."""
    from hasten.ops.collectives import gather
    from hasten.state import PartialState

    local = tensor[None].clone().to(PartialState().device)
    everyone = gather(local).cpu()
    mine = local[0].cpu()
    return all(torch.equal(everyone[i], mine) for i in range(everyone.shape[0]))


class _RunOutput:
    def __init__(self, returncode: int, stdout: list[str], stderr: list[str]) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


async def _read_stream(stream: Any, callback: Callable[[bytes], None]) -> None:
    while True:
        line = await stream.readline()
        if not line:
            break
        callback(line)


async def _stream_subprocess(
    cmd: list[str],
    env: dict[str, str] | None,
    stdin: Any,
    timeout: float | None,
    quiet: bool,
    echo: bool,
) -> _RunOutput:
    if echo:
        print("\nRunning: ", " ".join(cmd))
    process = await asyncio.create_subprocess_exec(
        cmd[0],
        *cmd[1:],
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out: list[str] = []
    err: list[str] = []

    def tee(line: bytes, sink: list[str], pipe: Any, label: str = "") -> None:
        text = line.decode("utf-8").rstrip()
        sink.append(text)
        if not quiet:
            print(label, text, file=pipe)

    try:
        await asyncio.wait_for(
            asyncio.gather(
                _read_stream(process.stdout, lambda line: tee(line, out, sys.stdout, "stdout:")),
                _read_stream(process.stderr, lambda line: tee(line, err, sys.stderr, "stderr:")),
            ),
            timeout=timeout,
        )
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise
    return _RunOutput(await process.wait(), out, err)


def execute_subprocess_async(
    cmd: list[Any],
    env: dict[str, str] | None = None,
    stdin: Any = None,
    timeout: int = 180,
    quiet: bool = False,
    echo: bool = True,
) -> _RunOutput:
    """Run ``cmd``, streaming its output, and return it (``returncode``, ``stdout``, ``stderr``).

    Raises:
        RuntimeError: the command exited with a non-zero code (its stderr is in the message).
        asyncio.TimeoutError: it ran longer than ``timeout`` seconds (it is killed).
    """
    cmd = [str(c) if isinstance(c, Path) else c for c in cmd]
    result = asyncio.run(_stream_subprocess(cmd, env, stdin, timeout, quiet, echo))
    if result.returncode > 0:
        stderr = "\n".join(result.stderr)
        raise RuntimeError(
            f"'{' '.join(cmd)}' failed with returncode {result.returncode}\n\n"
            f"The combined stderr from workers follows:\n{stderr}"
        )
    return result


class SubprocessCallException(Exception):
    """`run_command` failed; the message holds the command's output."""


def run_command(
    command: list[Any], return_stdout: bool = False, env: dict[str, str] | None = None
) -> str | None:
    """Run ``command`` (stderr merged into stdout); return the output if ``return_stdout``.

    Raises:
        SubprocessCallException: the command failed.
    """
    command = [str(c) if isinstance(c, Path) else c for c in command]
    try:
        output = subprocess.check_output(command, stderr=subprocess.STDOUT, env=env)
    except subprocess.CalledProcessError as exc:
        raise SubprocessCallException(
            f"Command `{' '.join(command)}` failed with the following error:\n\n"
            f"{exc.output.decode()}"
        ) from exc
    return output.decode("utf-8") if return_stdout else None


def path_in_accelerate_package(*components: str) -> Path:
    """Path of ``components`` inside the installed hasten package."""
    return Path(inspect.getfile(hasten)).parent.joinpath(*components)


@contextmanager
def assert_exception(
    exception_class: type[BaseException], msg: str | None = None
) -> Iterator[None]:
    """Assert that the block raises ``exception_class`` (with ``msg`` in its text, if given)."""
    was_ran = False
    try:
        yield
        was_ran = True
    except Exception as exc:
        if not isinstance(exc, exception_class):
            raise AssertionError(
                f"Expected exception of type {exception_class} but got {type(exc)}"
            ) from exc
        if msg is not None and msg not in str(exc):
            raise AssertionError(
                f"Expected message '{msg}' to be in exception but got '{exc}'"
            ) from exc
    if was_ran:
        raise AssertionError(f"Expected exception of type {exception_class} but ran without issue.")


def capture_call_output(func: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """Call ``func(*args, **kwargs)`` and return what it printed to stdout."""
    captured = io.StringIO()
    original = sys.stdout
    try:
        sys.stdout = captured
        func(*args, **kwargs)
    finally:
        sys.stdout = original
    return captured.getvalue()


def pytest_xdist_worker_id() -> int:
    """The pytest-xdist worker number (``gw3`` -> 3; 0 without xdist)."""
    worker = envvars.read("PYTEST_XDIST_WORKER", "gw0") or "gw0"
    return int(re.sub(r"^gw", "", worker, count=0, flags=re.M))


def get_torch_dist_unique_port() -> int:
    """A master port unique per pytest-xdist worker (29500 + worker id)."""
    return 29500 + pytest_xdist_worker_id()
