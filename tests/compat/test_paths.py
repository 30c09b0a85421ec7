"""Pin the documented Accelerate surface: every path imports, every name resolves, signatures match.

The manifest `accelerate_api.json` is built from the reference pages by `build_manifest.py`.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

MANIFEST = json.loads(Path(__file__).with_name("accelerate_api.json").read_text(encoding="utf-8"))

COMPAT_MODULES = [
    "hasten",
    "hasten.state",
    "hasten.accelerator",
    "hasten.data_loader",
    "hasten.optimizer",
    "hasten.scheduler",
    "hasten.hooks",
    "hasten.big_modeling",
    "hasten.tracking",
    "hasten.logging",
    "hasten.launchers",
    "hasten.utils",
    "hasten.utils.constants",
    "hasten.utils.dataclasses",
    "hasten.utils.operations",
    "hasten.utils.modeling",
    "hasten.utils.offload",
    "hasten.utils.memory",
    "hasten.utils.random",
    "hasten.utils.imports",
    "hasten.utils.versions",
    "hasten.utils.environment",
    "hasten.utils.other",
    "hasten.utils.launch",
    "hasten.commands.launch",
    "hasten.commands.config",
    "hasten.commands.config.default",
    "hasten.commands.env",
    "hasten.commands.estimate",
    "hasten.commands.test",
]

CONSTANTS = {
    "MODEL_NAME": "pytorch_model",
    "OPTIMIZER_NAME": "optimizer",
    "RNG_STATE_NAME": "random_states",
    "SCALER_NAME": "scaler.pt",
    "SCHEDULER_NAME": "scheduler",
    "WEIGHTS_NAME": "pytorch_model.bin",
    "SAFE_WEIGHTS_NAME": "model.safetensors",
    "WEIGHTS_INDEX_NAME": "pytorch_model.bin.index.json",
    "SAFE_WEIGHTS_INDEX_NAME": "model.safetensors.index.json",
}


def resolve(path: str) -> Any:
    """Import the longest module prefix of ``path`` and walk the rest as attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def _default_matches(documented: str, actual: Any) -> bool:
    if documented == "<factory>":
        return repr(actual) == "<factory>"
    function = re.fullmatch(r"<function (\w+) at 0x[0-9a-f]+>", documented)
    if function:
        return getattr(actual, "__name__", None) == function.group(1)
    member = re.fullmatch(r"<\w+\.(\w+): '([^']*)'>", documented)
    if member:
        return getattr(actual, "value", actual) == member.group(2)
    if documented.startswith("'/") and documented.endswith("default_config.yaml'"):
        # The reference prints its own machine's cache path; ours depends on $HF_HOME.
        return str(actual).endswith("default_config.yaml")
    expected = ast.literal_eval(documented)
    if isinstance(actual, enum.Enum):
        actual = actual.value
    return bool(actual == expected) and type(actual) is type(expected)


def _parameters(obj: Any) -> list[inspect.Parameter]:
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name in ("self", "cls") and not inspect.isclass(obj):
        params = params[1:]
    return params


@pytest.mark.parametrize("module", COMPAT_MODULES)
def test_compat_module_imports(module: str) -> None:
    importlib.import_module(module)


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["path"] for e in MANIFEST])
def test_documented_name_has_documented_signature(entry: dict[str, Any]) -> None:
    obj = resolve("hasten" + entry["path"][len("accelerate") :])
    if "members" in entry or (
        [p["name"] for p in entry["params"]] == ["values"] and inspect.isclass(obj)
    ):
        assert issubclass(obj, enum.Enum)
        assert set(entry.get("members", [])) <= set(obj.__members__)
        return
    actual = _parameters(obj)
    documented_names = [p["name"] for p in entry["params"]]
    # Accelerate 1.15 (tests/compat/accelerate-surface.json) appended a few optional parameters to
    # what the seed pages document (DeepSpeedPlugin's msamp fields): calls written against the
    # documented signature keep working, so trailing extras with defaults are allowed.
    assert [p.name for p in actual][: len(documented_names)] == documented_names
    extras = actual[len(documented_names) :]
    assert all(p.default is not inspect.Parameter.empty for p in extras), extras
    for documented, param in zip(entry["params"], actual):
        assert (
            param.kind.name == documented["kind"]
            or documented["kind"] == ("POSITIONAL_OR_KEYWORD")
            and param.kind.name in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")
        ), param
        if "default" in documented:
            assert param.default is not inspect.Parameter.empty, f"{param.name} has no default"
            assert _default_matches(documented["default"], param.default), (
                f"{param.name}: documented {documented['default']}, hasten has {param.default!r}"
            )
        elif documented["kind"] == "POSITIONAL_OR_KEYWORD":
            assert param.default is inspect.Parameter.empty, f"{param.name} should be required"


@pytest.mark.parametrize(("name", "value"), sorted(CONSTANTS.items()))
def test_checkpoint_constants(name: str, value: str) -> None:
    utils = importlib.import_module("hasten.utils")
    assert getattr(utils, name) == value


def test_every_utils_name_resolves() -> None:
    utils = importlib.import_module("hasten.utils")
    missing = []
    for name in utils.__all__:
        try:
            getattr(utils, name)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, "\n".join(missing)


def test_every_top_level_name_resolves() -> None:
    hasten = importlib.import_module("hasten")
    missing = [name for name in hasten.__all__ if not hasattr(hasten, name)]
    assert not missing
