"""Point Accelerate's own tests at hasten (used only by ``make conformance``).

``import accelerate`` and ``import accelerate.<path>`` return hasten's module objects themselves
(not copies), so a patch target such as ``"accelerate.accelerator.is_xpu_available"`` patches the
name hasten's code looks up. The one exception is ``accelerate.test_utils``: Accelerate's test
helpers are loaded from the release archive (``HASTEN_CONFORMANCE_ACCELERATE_DIR``), their own
imports again resolving to hasten.

``HASTEN_CONFORMANCE_CPU_GATES=1`` is the documented override of the hardware gate (see
docs/conformance.md): the tests named in ``HASTEN_CONFORMANCE_OPEN_GATES`` (a file, one
``tests/file.py::Class::test`` a line) run on CPU processes joined by gloo, with two processes
where Accelerate would use one per device.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["install"]

_SOURCE = "accelerate"
_TARGET = "hasten"
_ARCHIVE_PACKAGE = "accelerate.test_utils"
# Accelerate's gates that skip a test on a machine without accelerators. Under the override, an
# allow-listed test passes these; every other gate (libraries, versions, slow) is untouched.
_HARDWARE_GATES = (
    "require_cuda",
    "require_cuda_or_hpu",
    "require_cuda_or_xpu",
    "require_multi_device",
    "require_multi_gpu",
    "require_multi_gpu_or_xpu",
    "require_non_cpu",
    "require_single_device",
    "require_single_gpu",
)
# The number of CPU processes that stands in for "every device" under the override.
_CPU_PROCESSES = 2


def _archive_dir() -> Path:
    value = os.environ.get("HASTEN_CONFORMANCE_ACCELERATE_DIR")
    if not value:
        raise ImportError(
            "accelerate.test_utils is loaded from Accelerate's release archive, but "
            "HASTEN_CONFORMANCE_ACCELERATE_DIR is not set; run the tests through "
            "`make conformance` (conformance/run.py sets it)."
        )
    return Path(value)


def _in_archive(fullname: str) -> bool:
    return fullname == _ARCHIVE_PACKAGE or fullname.startswith(_ARCHIVE_PACKAGE + ".")


class _ArchiveLoader(importlib.machinery.SourceFileLoader):
    """Loads one of Accelerate's test_utils modules, then adjusts ``testing`` for hasten."""

    def exec_module(self, module: ModuleType) -> None:
        super().exec_module(module)
        if module.__name__ == _ARCHIVE_PACKAGE + ".testing":
            _adjust_testing(module)


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``accelerate[.x]`` -> hasten's ``hasten[.x]`` module object; test_utils from the archive."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _SOURCE and not fullname.startswith(_SOURCE + "."):
            return None
        if _in_archive(fullname):
            return _archive_spec(fullname)
        target_name = _TARGET + fullname[len(_SOURCE) :]
        try:
            found = importlib.util.find_spec(target_name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname,
            self,
            origin=target_name,
            is_package=found.submodule_search_locations is not None,
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        assert spec.origin is not None
        return importlib.import_module(spec.origin)

    def exec_module(self, module: ModuleType) -> None:
        """hasten's module is already executed: the alias shares it, nothing runs twice."""


def _archive_spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    parts = fullname.split(".")[1:]  # test_utils[, ...]
    base = _archive_dir().joinpath(*parts)
    if (base / "__init__.py").is_file():
        origin, locations = base / "__init__.py", [str(base)]
    elif base.with_suffix(".py").is_file():
        origin, locations = base.with_suffix(".py"), None
    else:
        return None
    loader = _ArchiveLoader(fullname, str(origin))
    return importlib.util.spec_from_file_location(
        fullname, origin, loader=loader, submodule_search_locations=locations
    )


def _adjust_testing(testing: ModuleType) -> None:
    """Scripts are found in the archive; under the override, hardware gates open for listed tests."""
    package_dir = _archive_dir()

    def path_in_accelerate_package(*components: str) -> Path:
        return package_dir.joinpath(*components)

    path_in_accelerate_package.__doc__ = testing.path_in_accelerate_package.__doc__
    testing.path_in_accelerate_package = path_in_accelerate_package
    if os.environ.get("HASTEN_CONFORMANCE_CPU_GATES") != "1":
        return
    opened = _opened_tests()
    testing.device_count = _CPU_PROCESSES
    testing.DEFAULT_LAUNCH_COMMAND = testing.get_launch_command(
        num_processes=_CPU_PROCESSES, monitor_interval=0.1
    )
    for name in _HARDWARE_GATES:
        original = getattr(testing, name, None)
        if original is not None:
            setattr(testing, name, _open_gate(original, opened))


def _opened_tests() -> frozenset[str]:
    listing = os.environ.get("HASTEN_CONFORMANCE_OPEN_GATES")
    if not listing:
        return frozenset()
    ids = set()
    for line in Path(listing).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            ids.add(line.split()[0].rsplit("/", 1)[-1])  # tests/x.py::C::t -> x.py::C::t
    return frozenset(ids)


def _test_ids(test_case: Any) -> set[str]:
    """``file.py::Class::test`` and ``file.py::Class`` for a decorated test method or class."""
    module = test_case.__module__.rsplit(".", 1)[-1] + ".py"
    qualname = test_case.__qualname__.split(".")
    return {module + "::" + "::".join(qualname[: i + 1]) for i in range(len(qualname))}


def _open_gate(gate: Callable[[Any], Any], opened: frozenset[str]) -> Callable[[Any], Any]:
    def open_gate(test_case: Any) -> Any:
        # parameterized tests are listed by their generated names (test_x_0, test_x_use_...)
        ids = _test_ids(test_case)
        if any(o == t or o.startswith(t + "_") for t in ids for o in opened):
            return test_case
        return gate(test_case)

    open_gate.__name__ = gate.__name__
    open_gate.__doc__ = gate.__doc__
    return open_gate


_FINDER = _AliasFinder()


def install() -> None:
    """Put the alias first on ``sys.meta_path`` (ahead of any installed ``accelerate``)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for name in [n for n in sys.modules if n == _SOURCE or n.startswith(_SOURCE + ".")]:
        del sys.modules[name]
