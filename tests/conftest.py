"""Autouse fixtures: every test starts with fresh hasten state and leaves the environment as found."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

# DeepSpeed JIT-compiles its shared-memory comm op on first use (~80 s); building it inside the
# venv means a fresh clone builds it once (`make test` warms it) and every later run reuses it.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
# torch runs the first `ninja` on PATH; two ninja versions (the venv's pip one, a system one)
# write incompatible build logs, so each rebuilds the op the other built (~80 s each time).
# The venv's bin first (as `make`'s op build does) means one ninja for every test process.
_VENV_BIN = str(Path(sys.executable).parent)
_PATH = os.environ.get("PATH", "").split(os.pathsep)
if (Path(_VENV_BIN) / "ninja").is_file() and _PATH[:1] != [_VENV_BIN]:
    os.environ["PATH"] = os.pathsep.join([_VENV_BIN, *_PATH])

# Collection imports torch, transformers and every test module: hundreds of thousands of objects
# that live for the whole session. Full collections would scan them again and again (~16 s of
# the unit tests alone, the product's gc.collect() calls included), so the collector pauses
# while they are imported and then sets them aside for good.
gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection created out of the garbage collector's reach, then resume it."""
    gc.collect()
    gc.freeze()
    gc.enable()


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(autouse=True)
def _fresh_hasten_state() -> Iterator[None]:
    yield
    try:
        from hasten.state._shared import reset_state
    except ImportError:
        return
    reset_state()


@pytest.fixture(scope="session")
def deepspeed_ops() -> None:
    """Build DeepSpeed's comm op once per session, before any worker needs it (skip without it)."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Forked workers inherit the parent's modules. deepspeed.initialize imports its Muon optimizer
    # (whose torch.compile decorators import torch._inductor, ~3 s of CPU) and the op's JIT
    # loader: importing them here once spares every worker of every DeepSpeed test the imports.
    for name in ("deepspeed.runtime.zero.muon.muon_optimizer", "torch.utils.cpp_extension"):
        with contextlib.suppress(ImportError), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's, on import
            importlib.import_module(name)
