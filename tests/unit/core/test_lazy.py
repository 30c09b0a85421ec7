"""core/lazy.py: table names, submodules as attributes, pending capabilities, cheap import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hasten.core.lazy import CapabilityNotBuiltError, invert_table


def _make_package(root: Path, name: str) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            from hasten.core.lazy import lazy_namespace
            _TABLE = {{"{name}.home": ["thing", "sub"]}}
            _PENDING = {{"the Warp engine": ["warp_drive", "thing"]}}
            __getattr__, __dir__ = lazy_namespace(__name__, _TABLE, globals(), _PENDING)
            __all__ = ["sub", "thing"]
            """
        )
    )
    (pkg / "home.py").write_text("thing = 'from home'\nsub = 'table wins'\n__all__ = []\n")
    (pkg / "sub.py").write_text("__all__ = []\n")
    (pkg / "other.py").write_text("VALUE = 3\n__all__ = ['VALUE']\n")


def _run(root: Path, code: str) -> subprocess.CompletedProcess[str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_submodules_table_names_and_pending_names(tmp_path: Path) -> None:
    _make_package(tmp_path, "lazypkg")
    result = _run(
        tmp_path,
        """
        import sys
        import lazypkg
        assert "lazypkg.other" not in sys.modules, "submodule loaded eagerly"
        assert lazypkg.other.VALUE == 3
        assert lazypkg.thing == "from home", "a table name beats a pending one"
        assert lazypkg.sub == "table wins", "a table name beats a submodule"
        assert {"home", "other", "sub", "thing"} <= set(dir(lazypkg))
        assert "warp_drive" not in dir(lazypkg)
        try:
            from lazypkg import warp_drive
        except ImportError as exc:
            assert type(exc).__name__ == "CapabilityNotBuiltError", type(exc)
            assert "the Warp engine" in str(exc) and "lazypkg.warp_drive" in str(exc), exc
        else:
            raise SystemExit("pending name resolved")
        try:
            lazypkg.nothing_here
        except AttributeError as exc:
            assert "has no attribute 'nothing_here'" in str(exc)
        else:
            raise SystemExit("unknown name resolved")
        assert not hasattr(lazypkg, "nothing_here")
        print("ok")
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_hasten_submodules_are_attributes_and_import_stays_lazy() -> None:
    code = """
        import sys
        import hasten
        loaded = sorted(m for m in sys.modules if m.startswith("hasten."))
        assert "hasten.utils" not in loaded and "hasten.big_modeling" not in loaded, loaded
        hasten.utils.set_seed(7)
        assert hasten.big_modeling.init_empty_weights is hasten.init_empty_weights
        assert callable(hasten.utils.modeling.compute_module_sizes)
        assert hasten.tracking.base.GeneralTracker is hasten.tracking.GeneralTracker
        assert hasten.checkpointing.storage.io.save is hasten.checkpointing.save
        assert "utils" in dir(hasten) and "modeling" in dir(hasten.utils)
        print("ok")
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_invert_table_refuses_a_name_listed_twice() -> None:
    with pytest.raises(ValueError, match="'x' is listed under both 'a' and 'b'"):
        invert_table({"a": ["x"], "b": ["x"]})


def test_capability_error_is_an_import_error() -> None:
    assert issubclass(CapabilityNotBuiltError, ImportError)
    assert not issubclass(CapabilityNotBuiltError, AttributeError)
