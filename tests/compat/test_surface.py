"""Accelerate 1.15's whole public surface (``tests/compat/accelerate-surface.json``) exists in hasten.

Every entry of a checked group must resolve at the same path (``accelerate.`` -> ``hasten.``)
with the same parameter names, kinds and defaults (annotations are not compared). The file stays
in the repository (a clone with nothing beside it runs this test); when the workspace's
``shared/accelerate-surface.json`` lies beside the checkout, the copy must equal it.

Engine helpers turn their group on in `CHECKED_GROUPS` when their engine lands; names owned by
work still in flight sit in `PENDING` (expected to fail) and are removed as they land: a
pending name that passes fails the test, so the set only shrinks.
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

_ROOT = Path(__file__).resolve().parents[2]
SURFACE = Path(__file__).resolve().parent / "accelerate-surface.json"
_UPSTREAM = [base / "shared" / "accelerate-surface.json" for base in _ROOT.parents[:2]]

# Group -> checked here. Engine groups are switched on by the helpers wiring those engines.
CHECKED_GROUPS = {
    "general": True,
    "sagemaker": True,
    "xla_tpu": True,
    "deepspeed": True,
    "fsdp": True,
    "parallelism": True,
    "fp8": True,
    "megatron": True,
}

# Paths (hasten spelling) owned by other work still in flight. Remove a path when it lands.
PENDING: frozenset[str] = frozenset(
    {
        # helper `surface` (issue 10), landing in batches now
    }
)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _entries() -> list[dict[str, Any]]:
    names = json.loads(SURFACE.read_text(encoding="utf-8"))["names"]
    for entry in names:
        entry["hasten"] = "hasten" + entry["path"][len("accelerate") :]
    return [entry for entry in names if CHECKED_GROUPS.get(entry["group"], False)]


ENTRIES = _entries()


def resolve(path: str, kind: str = "module") -> Any:
    """Import the longest module prefix of ``path`` and walk the rest as attributes.

    A non-module entry is an attribute of its parent even where a submodule has the same name
    (``accelerate.utils.tqdm`` is the function, ``accelerate.utils.tqdm.tqdm`` too).
    """
    parts = path.split(".")
    longest = len(parts) if kind == "module" else len(parts) - 1
    for cut in range(longest, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not ".".join(parts[:cut]).startswith(exc.name):
                raise  # the module exists but imports something missing: a real error
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def split_top_level(text: str) -> list[str]:
    """Split a parameter list at commas outside brackets, quotes and ``<...>`` reprs."""
    parts: list[str] = []
    depth, quote, current = 0, "", ""
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{" or (char == "<" and text[index + 1 : index + 2].isalpha()):
            depth += 1
        elif char in ")]}" or (char == ">" and depth and text[index - 1 : index] != "-"):
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _parameter_list(signature: str) -> str:
    """The text between the signature's outer parentheses (dropping ``-> return``)."""
    depth, quote = 0, ""
    for index, char in enumerate(signature):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return signature[1:index]
    raise ValueError(f"unbalanced signature {signature!r}")


def parse_signature(signature: str) -> list[tuple[str, str, str | None]]:
    """``"(a, /, b: 'int' = 1, *c, d=2, **e)"`` -> ``[(name, kind, default repr or None)]``."""
    params: list[tuple[str, str, str | None]] = []
    kind = "POSITIONAL_OR_KEYWORD"
    for text in split_top_level(_parameter_list(signature)):
        if text == "/":
            params = [(n, "POSITIONAL_ONLY", d) for n, _, d in params]
        elif text == "*":
            kind = "KEYWORD_ONLY"
        elif text.startswith("**"):
            params.append((text[2:].split(":")[0].strip(), "VAR_KEYWORD", None))
        elif text.startswith("*"):
            params.append((text[1:].split(":")[0].strip(), "VAR_POSITIONAL", None))
            kind = "KEYWORD_ONLY"
        else:
            head, equals, default = _split_default(text)
            params.append((head.split(":")[0].strip(), kind, default.strip() if equals else None))
    return params


def _split_default(text: str) -> tuple[str, bool, str]:
    """Split ``name: annotation = default`` at the first ``=`` outside brackets and quotes."""
    depth, quote = 0, ""
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "=" and depth == 0:
            return text[:index], True, text[index + 1 :]
    return text, False, ""


def default_matches(documented: str, actual: Any) -> bool:
    """Compare a default as the reference printed it with hasten's default value."""
    if documented.startswith("<object object at"):
        return type(actual) is object  # a "not given" sentinel; any fresh object() is one
    if documented == "<factory>":
        return repr(actual) == "<factory>"
    member = re.fullmatch(r"<(\w+)\.(\w+): (.*)>", documented)
    if member:
        return isinstance(actual, enum.Enum) and actual.name == member.group(2)
    function = re.fullmatch(r"<function (\w+) at 0x[0-9a-f]+>", documented)
    if function:
        return getattr(actual, "__name__", None) == function.group(1)
    if documented.startswith("'/") and documented.endswith("default_config.yaml'"):
        # The reference prints its own machine's cache path; ours depends on $HF_HOME.
        return str(actual).endswith("default_config.yaml")
    try:
        expected = ast.literal_eval(documented)
    except (ValueError, SyntaxError):
        return _ADDRESS.sub("", repr(actual)) == _ADDRESS.sub("", documented)
    if isinstance(actual, enum.Enum) and not isinstance(expected, enum.Enum):
        actual = actual.value
    return bool(actual == expected) and type(actual) is type(expected)


def signature_mismatches(documented: str, obj: Any) -> list[str]:
    """What differs between the documented signature and ``obj``'s (empty when they agree)."""
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return []  # enum call signatures come from the Python version, not from the class
    try:
        actual = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError) as exc:
        return [f"no signature: {exc}"]
    expected = parse_signature(documented)
    names = [p.name for p in actual]
    if names != [name for name, _, _ in expected]:
        return [f"parameters {names} != documented {[name for name, _, _ in expected]}"]
    problems = []
    for (name, kind, default), param in zip(expected, actual, strict=True):
        if param.kind.name != kind:
            problems.append(f"{name}: kind {param.kind.name}, documented {kind}")
        if default is None and param.default is not inspect.Parameter.empty and "VAR" not in kind:
            problems.append(f"{name}: has default {param.default!r}, documented required")
        elif default is not None and param.default is inspect.Parameter.empty:
            problems.append(f"{name}: required, documented default {default}")
        elif default is not None and not default_matches(default, param.default):
            problems.append(f"{name}: default {param.default!r}, documented {default}")
    return problems


def check(entry: dict[str, Any]) -> list[str]:
    """Problems with one surface entry in hasten (empty when it resolves and matches)."""
    try:
        obj = resolve(entry["hasten"], entry["kind"])
    except (ImportError, AttributeError) as exc:
        return [f"does not resolve: {type(exc).__name__}: {exc}"]
    if entry["kind"] == "module":
        return [] if inspect.ismodule(obj) else [f"is {type(obj).__name__}, not a module"]
    if entry["signature"] is None:
        return []
    return signature_mismatches(entry["signature"], obj)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["hasten"] for e in ENTRIES])
def test_accelerate_name_exists_with_its_signature(entry: dict[str, Any]) -> None:
    problems = check(entry)
    if entry["hasten"] in PENDING:
        assert problems, f"{entry['hasten']} now resolves and matches: remove it from PENDING"
        pytest.xfail(f"pending (owned by other work): {problems[0]}")
    assert not problems, f"{entry['hasten']} ({entry['group']}):\n" + "\n".join(problems)


def test_pending_names_are_real_surface_names() -> None:
    every = {
        "hasten" + e["path"][len("accelerate") :]
        for e in json.loads(SURFACE.read_text(encoding="utf-8"))["names"]
    }
    assert sorted(PENDING - every) == []


def test_surface_list_is_carried_by_the_repository() -> None:
    # A clone with nothing beside it must still check the whole surface: the list is committed.
    assert SURFACE.is_file(), f"{SURFACE} is missing: restore it with git checkout"
    assert len(ENTRIES) > 700, f"only {len(ENTRIES)} checked entries in {SURFACE}"


def test_repository_copy_matches_the_workspace_list() -> None:
    upstream = next((path for path in _UPSTREAM if path.is_file()), None)
    if upstream is None:
        pytest.skip("no shared/accelerate-surface.json beside this checkout to compare with")
    assert json.loads(upstream.read_text(encoding="utf-8")) == json.loads(
        SURFACE.read_text(encoding="utf-8")
    ), f"{SURFACE} differs from {upstream}: copy the newer list into the repository"


@pytest.mark.parametrize(
    ("signature", "expected"),
    [
        ("()", []),
        (
            "(a, /, b: 'int' = 1, *c, d=<object object at 0x7f>, **e) -> None",
            [
                ("a", "POSITIONAL_ONLY", None),
                ("b", "POSITIONAL_OR_KEYWORD", "1"),
                ("c", "VAR_POSITIONAL", None),
                ("d", "KEYWORD_ONLY", "<object object at 0x7f>"),
                ("e", "VAR_KEYWORD", None),
            ],
        ),
        (
            "(x: 'dict[str, int] | None' = None, *, y: Literal['a', 'b'] = 'a, b')",
            [("x", "POSITIONAL_OR_KEYWORD", "None"), ("y", "KEYWORD_ONLY", "'a, b'")],
        ),
        (
            "(hook=<DDPCommunicationHookType.NO: 'no'>, f=<function g at 0x1>)",
            [
                ("hook", "POSITIONAL_OR_KEYWORD", "<DDPCommunicationHookType.NO: 'no'>"),
                ("f", "POSITIONAL_OR_KEYWORD", "<function g at 0x1>"),
            ],
        ),
    ],
)
def test_parse_signature(signature: str, expected: list[tuple[str, str, str | None]]) -> None:
    assert parse_signature(signature) == expected


def test_default_rules() -> None:
    assert default_matches("<object object at 0x7f00>", object())
    assert not default_matches("<object object at 0x7f00>", None)
    assert default_matches("1", 1)
    assert not default_matches("1", 1.0)
    assert not default_matches("1", True)
    assert default_matches("<function print at 0x1>", print)
    assert default_matches("<built-in function callable>", callable)
    assert not default_matches("'fp16'", "bf16")


def test_signature_mismatches_name_each_difference() -> None:
    def f(a: int, b: int = 2, *, c: int = 3) -> None:
        del a, b, c

    assert signature_mismatches("(a, b=2, *, c=3)", f) == []
    assert signature_mismatches("(a, b=3, *, c=3)", f) == ["b: default 2, documented 3"]
    assert signature_mismatches("(a, b, c=3)", f) == [
        "b: has default 2, documented required",
        "c: kind KEYWORD_ONLY, documented POSITIONAL_OR_KEYWORD",
    ]
    assert signature_mismatches("(a, d)", f) == [
        "parameters ['a', 'b', 'c'] != documented ['a', 'd']"
    ]
