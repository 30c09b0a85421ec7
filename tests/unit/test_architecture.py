"""Architecture rules that keep the codebase in the shape docs/architecture.md describes."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "hasten"
MODULES = sorted(SRC.rglob("*.py"))
LINE_CAP = 800
LINE_CAP_EXCEPTIONS = {"accelerator.py": 1500}
# `DistributedType.X` member access (a branch on the label) is allowed only where the label is
# defined, declared by a platform, detected, resolved to an engine, mapped to a strategy, or written by the questionnaire.
DISPATCH_ALLOWED = (
    "config/enums.py",
    "platforms/",
    "state/detect.py",
    "state/engine.py",
    "strategies/select.py",
    "commands/config/",
)
COMPAT_SHIMS = [
    p for p in MODULES if p.relative_to(SRC).parts[0] == "utils" and p.name != "__init__.py"
] + [SRC / "hooks.py", SRC / "parallelism_config.py"]


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_module_size_cap(path: Path) -> None:
    cap = LINE_CAP_EXCEPTIONS.get(_rel(path), LINE_CAP)
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= cap, f"{_rel(path)} has {lines} lines (cap {cap}): split it by concept"


def _declared_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else ([node.target] if isinstance(node, ast.AnnAssign) else [])
        )
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "__all__":
                try:
                    return list(ast.literal_eval(node.value))  # type: ignore[arg-type]
                except ValueError:
                    return None  # computed (lazy tables): checked by the compat tests
    return None


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_module_declares_sorted_complete_all(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    if "__all__" not in source:
        pytest.fail(f"{_rel(path)} declares no __all__")
    declared = _declared_all(tree)
    if declared is None:
        return
    assert declared == sorted(declared), f"{_rel(path)}: __all__ is not sorted"
    public = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and not node.name.startswith("_")
    }
    missing = sorted(public - set(declared))
    assert not missing, f"{_rel(path)}: public names missing from __all__: {missing}"


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_distributed_type_dispatch_only_where_allowed(path: Path) -> None:
    rel = _rel(path)
    if rel.startswith(DISPATCH_ALLOWED):
        return
    hits = [
        f"{rel}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"DistributedType\.[A-Z_]+", line)
    ]
    assert not hits, "branch on a Strategy/Platform object instead:\n" + "\n".join(hits)


@pytest.mark.parametrize("path", COMPAT_SHIMS, ids=_rel)
def test_compat_shims_are_thin(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{_rel(path)} not written yet")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
            "__all__"
        ]:
            continue
        pytest.fail(f"{_rel(path)}:{node.lineno}: compat modules hold only imports and __all__")


def test_import_hasten_has_no_side_effects_and_loads_nothing_optional() -> None:
    code = (
        "import os, sys\nimport torch\nbefore = dict(os.environ); had = set(sys.modules)\n"
        "import hasten\nfrom hasten import Accelerator\n"
        "assert dict(os.environ) == before, 'import hasten changed os.environ'\n"
        "heavy = ['transformers', 'tensorboard', 'matplotlib', 'wandb', 'mlflow', 'deepspeed',"
        " 'bitsandbytes', 'torchdata', 'rich', 'tqdm', 'safetensors', 'yaml', 'psutil']\n"
        "loaded = [m for m in heavy if m in sys.modules and m not in had]\n"
        "assert not loaded, f'import hasten loaded optional/heavy modules: {loaded}'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def _calls(path: Path) -> list[tuple[str, int]]:
    """(name, line) of every call in ``path`` whose callee is a plain or dotted name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            found.append((name, node.lineno))
    return found


#: torch's calls that apply a composable parallelism, and the one module allowed to make each:
#: the order is written once, in strategies/parallelize.py (TP plans are resolved and applied in
#: tensor_parallel.py, which its apply_tp calls).
PARALLELISM_CALLS = {
    "fully_shard": "strategies/parallelize.py",
    "parallelize_module": "strategies/tensor_parallel.py",
}


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_parallelisms_are_applied_in_their_one_place(path: Path) -> None:
    rel = _rel(path)
    misplaced = [
        f"{rel}:{line}: {name}() belongs in {PARALLELISM_CALLS[name]}"
        for name, line in _calls(path)
        if name in PARALLELISM_CALLS and PARALLELISM_CALLS[name] != rel
    ]
    assert not misplaced, "apply parallelisms through strategies.parallelize:\n" + "\n".join(
        misplaced
    )


STRATEGY_MODULES = [p for p in MODULES if _rel(p).startswith("strategies/")]


@pytest.mark.parametrize("path", STRATEGY_MODULES, ids=_rel)
def test_no_strategy_takes_the_accelerator(path: Path) -> None:
    """Strategies get a PrepareCall; Megatron-LM's Accelerate-API helpers take a RunView."""
    loose = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        for arg in args:
            annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if arg.arg == "accelerator" and not annotation.startswith("RunView"):
                loose.append(f"{_rel(path)}:{arg.lineno}: {node.name}({arg.arg}: {annotation})")
    assert not loose, "hand strategies a PrepareCall, not the Accelerator:\n" + "\n".join(loose)


def test_the_facade_asks_its_strategy_through_methods() -> None:
    source = (SRC / "accelerator.py").read_text(encoding="utf-8")
    private = re.findall(r"strategy\._[a-z]\w*", source)
    assert not private, f"accelerator.py reads private strategy attributes: {private}"
    assert "DDPStrategy(" not in source, "the facade builds no strategy of its own"


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_optimizers_are_unwrapped_in_one_place(path: Path) -> None:
    rel = _rel(path)
    if rel == "optimizer.py":
        return
    hits = re.findall(r'getattr\((\w+), "optimizer", \1\)', path.read_text(encoding="utf-8"))
    assert not hits, f"{rel}: use hasten.optimizer.unwrap_optimizer instead of getattr"
