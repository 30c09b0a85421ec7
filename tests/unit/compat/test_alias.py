"""``import accelerate`` through hasten's distribution: every ``accelerate.x`` is ``hasten.x``.

The wheel is built and unpacked into a folder put first on ``PYTHONPATH`` of a fresh
interpreter, so these tests see the alias whatever this environment has installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from hasten.compat.distribution import build_wheel

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("alias-site")
    with zipfile.ZipFile(build_wheel(folder / "wheel")) as wheel:
        wheel.extractall(folder)
    return folder


def _run(site: Path, code: str, *args: str) -> str:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    )
    command = [sys.executable, *(args or ("-c", textwrap.dedent(code)))]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# What Accelerate 1.15 writes for its PartialState (inside torch.save(training_args)): the class
# by its accelerate name, then its attributes (protocol 4, unframed).
_ACCELERATE_PICKLE = (
    b"\x80\x04\x8c\x10accelerate.state\x8c\x0cPartialState\x93)\x81}("
    b"\x8c\x04_cpu\x88\x8c\x07backendN"
    b"\x8c\x06device\x8c\x05torch\x8c\x06device\x93\x8c\x03cpu\x85R"
    b"\x8c\x05debug\x89\x8c\x10distributed_type"
    b"\x8c\x1caccelerate.utils.dataclasses\x8c\x0fDistributedType\x93\x8c\x02NO\x85R"
    b"\x8c\x0dnum_processesK\x01\x8c\x0dprocess_indexK\x00"
    b"\x8c\x13local_process_indexK\x00\x8c\x0dfork_launched\x89ub."
)


def test_accelerate_is_hasten_module_for_module(site: Path, tmp_path: Path) -> None:
    # One interpreter (each costs seconds): identity in any import order, patches seen from
    # both names, and a pickle that names accelerate.state.PartialState.
    (tmp_path / "state.pkl").write_bytes(_ACCELERATE_PICKLE)
    out = _run(
        site,
        f"""
        import importlib.metadata
        import accelerate.utils.modeling as modeling  # a submodule before anything else
        import hasten, hasten.utils, hasten.utils.modeling
        import accelerate

        assert accelerate.__version__ == "1.15.0", accelerate.__version__
        assert accelerate.__hasten_version__ == hasten.__version__
        assert importlib.metadata.version("accelerate").startswith("1.15.0+hasten.")
        assert modeling is hasten.utils.modeling and accelerate.utils is hasten.utils
        # hasten's modules keep their own names and specs
        assert hasten.utils.__spec__.name == "hasten.utils"
        assert hasten.utils.modeling.__name__ == "hasten.utils.modeling"
        import hasten.state                        # hasten first, then the accelerate name
        import accelerate.state
        assert accelerate.state is hasten.state
        from accelerate import Accelerator, PartialState
        from accelerate.hooks import AlignDevicesHook
        from accelerate.utils import DummyOptim, DeepSpeedSchedulerWrapper
        assert Accelerator is hasten.Accelerator and PartialState is hasten.PartialState
        assert AlignDevicesHook is hasten.hooks.AlignDevicesHook
        assert "Accelerator" in dir(accelerate)
        try:
            import accelerate.no_such_module
        except ModuleNotFoundError as err:
            assert err.name == "accelerate.no_such_module", err.name
        else:
            raise AssertionError("accelerate.no_such_module imported")

        # Patching one patches the other.
        from unittest import mock
        import accelerate.big_modeling
        original = accelerate.big_modeling.check_device_map
        accelerate.big_modeling.check_device_map = "patched"
        assert hasten.big_modeling.check_device_map == "patched"
        accelerate.big_modeling.check_device_map = original
        with mock.patch("accelerate.utils.set_seed") as patched:
            assert hasten.utils.set_seed is patched
        assert hasten.utils.set_seed is not patched
        with mock.patch.object(hasten, "Accelerator", "x"):
            assert accelerate.Accelerator == "x"  # the top-level module forwards too
        accelerate.extra_name = 1
        assert hasten.extra_name == 1
        del accelerate.extra_name
        assert not hasattr(hasten, "extra_name")

        # A pickle written under Accelerate.
        import pickle
        state = pickle.load(open({str(tmp_path / "state.pkl")!r}, "rb"))
        print(type(state).__module__, type(state).__name__, state.distributed_type.value,
              state.num_processes, state.is_main_process)
        """,
    )
    assert out.split() == ["hasten.state.partial", "PartialState", "NO", "1", "True"]


def test_python_dash_m_runs_hastens_module(site: Path) -> None:
    out = _run(site, "", "-m", "accelerate.commands.launch", "--help")
    assert "--num_processes" in out and "--config_file" in out
