"""hasten.test_utils.testing: decorators probe this machine; helpers run and capture for real."""

from __future__ import annotations

import io
import sys
import unittest
from pathlib import Path
from unittest import mock

import pytest
import torch

from hasten.core import imports
from hasten.core.environment import patch_environment
from hasten.test_utils import testing
from hasten.test_utils.testing import (
    AccelerateTestCase,
    MockingTestCase,
    SubprocessCallException,
    TempDirTestCase,
    are_the_same_tensors,
    assert_exception,
    capture_call_output,
    execute_subprocess_async,
    get_launch_command,
    get_torch_dist_unique_port,
    path_in_accelerate_package,
    pytest_xdist_worker_id,
    require_torch_min_version,
    run_command,
)


def _skipped(decorator: object) -> bool:
    def probe() -> None:
        pass

    return bool(getattr(decorator(probe), "__unittest_skip__", False))  # type: ignore[operator]


def test_backend_matches_the_machine() -> None:
    device, count, allocated = testing.get_backend()
    assert (device, count) == (testing.torch_device, testing.device_count)
    if torch.cuda.is_available():
        assert device == "cuda" and count == torch.cuda.device_count()
    elif device == "cpu":
        assert count == 1 and allocated() == 0


def test_hardware_decorators_follow_the_backend() -> None:
    on_cpu = testing.torch_device == "cpu"
    assert _skipped(testing.require_cpu) is not on_cpu
    assert _skipped(testing.require_non_cpu) is on_cpu
    assert _skipped(testing.require_cuda) is not torch.cuda.is_available()
    assert _skipped(testing.require_multi_device) is not (not on_cpu and testing.device_count > 1)
    assert _skipped(testing.require_single_gpu) is not (torch.cuda.device_count() == 1)
    assert _skipped(testing.require_fp16) is not testing.checks.is_fp16_available()
    assert _skipped(testing.require_tpu)  # no TPU in CI or device sessions
    assert _skipped(testing.skip)


def test_package_decorators_follow_what_is_installed() -> None:
    assert _skipped(testing.require_tensorboard) is not imports.is_tensorboard_available()
    assert _skipped(testing.require_deepspeed) is not imports.is_deepspeed_available()
    assert _skipped(testing.require_wandb) is not imports.is_wandb_available()
    assert _skipped(testing.require_transformers) is not imports.is_transformers_available()
    assert not _skipped(testing.require_pippy)  # torch 2.13 has torch.distributed.pipelining
    assert not _skipped(testing.require_fsdp)
    assert _skipped(testing.slow) is not testing._run_slow_tests


def test_require_torch_min_version_both_forms_and_bad_input() -> None:
    assert not _skipped(lambda f: require_torch_min_version(f, version="1.0"))
    assert _skipped(require_torch_min_version(version="99.0"))
    with pytest.raises(ValueError, match="needs version="):
        require_torch_min_version(lambda: None)


def test_launch_command_is_hastens() -> None:
    assert get_launch_command(num_processes=2, cpu=True, debug=False, config_file=None) == [
        "hasten",
        "launch",
        "--num_processes=2",
        "--cpu",
    ]
    assert testing.DEFAULT_LAUNCH_COMMAND[:2] == ["hasten", "launch"]
    assert f"--num_processes={testing.device_count}" in testing.DEFAULT_LAUNCH_COMMAND


def test_execute_subprocess_async_streams_and_raises_with_stderr() -> None:
    result = execute_subprocess_async(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
        quiet=True,
        echo=False,
    )
    assert result.returncode == 0 and result.stdout == ["out"] and result.stderr == ["err"]
    with pytest.raises(RuntimeError, match="failed with returncode 3(.|\n)*boom"):
        execute_subprocess_async(
            [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
            quiet=True,
            echo=False,
        )


@pytest.mark.cli
@pytest.mark.timeout(120)
def test_execute_subprocess_async_runs_hasten_launch(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(
        # One os.write per line: both workers share the pipe, and a single short write is
        # atomic where print's separate writes can interleave ("rankrank 1").
        "import os\nfrom hasten import PartialState\n"
        "os.write(1, f'rank {PartialState().process_index}\\n'.encode())\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "hasten.commands.cli",
        *get_launch_command(num_processes=2, cpu=True)[1:],
    ]
    result = execute_subprocess_async([*cmd, script], quiet=True, echo=False, timeout=110)
    assert sorted(line for line in result.stdout if line.startswith("rank")) == ["rank 0", "rank 1"]


def test_run_command_returns_output_or_raises() -> None:
    assert run_command([sys.executable, "-c", "print(42)"], return_stdout=True) == "42\n"
    assert run_command([sys.executable, "-c", "pass"]) is None
    with pytest.raises(SubprocessCallException, match="nope"):
        run_command([sys.executable, "-c", "import sys; sys.exit('nope')"])


def test_assert_exception_and_capture_call_output() -> None:
    with assert_exception(ValueError, "bad"):
        raise ValueError("a bad value")
    with pytest.raises(AssertionError, match="ran without issue"), assert_exception(ValueError):
        pass
    with pytest.raises(AssertionError, match="but got"), assert_exception(ValueError):
        raise KeyError("x")
    with (
        pytest.raises(AssertionError, match="to be in exception"),
        assert_exception(ValueError, "zz"),
    ):
        raise ValueError("a")
    assert capture_call_output(print, "hello", end="!") == "hello!"


def test_xdist_worker_port_and_package_path() -> None:
    with patch_environment(PYTEST_XDIST_WORKER="gw3"):
        assert pytest_xdist_worker_id() == 3
        assert get_torch_dist_unique_port() == 29503
    assert path_in_accelerate_package("test_utils", "scripts", "self_check.py").is_file()
    assert are_the_same_tensors(torch.arange(3))


def test_test_case_bases_clean_up() -> None:
    events: list[object] = []

    class Files(TempDirTestCase):
        def test_a(self) -> None:
            (self.tmpdir / "f.txt").write_text("x")
            (self.tmpdir / "d").mkdir()
            events.append(self.tmpdir)

        def test_b(self) -> None:
            events.append(sorted(self.tmpdir.iterdir()))

    class State(AccelerateTestCase):
        def test_state(self) -> None:
            from hasten import PartialState

            PartialState()

    class Mocks(MockingTestCase):
        def test_mocks(self) -> None:
            self.add_mocks(mock.patch("os.getcwd", return_value="/mocked"))
            import os

            events.append(os.getcwd())

    suite = unittest.TestSuite()
    for case in (Files, State, Mocks):
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    assert result.wasSuccessful(), result.errors + result.failures
    tmpdir, listing, cwd = events
    assert listing == []  # cleared before the second test
    assert not Path(str(tmpdir)).exists()  # removed after the class
    assert cwd == "/mocked"
    import os

    assert os.getcwd() != "/mocked"  # the mock was stopped
    from hasten.state import PartialState

    assert not PartialState._shared_state  # reset after the test
