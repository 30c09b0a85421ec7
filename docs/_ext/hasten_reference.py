"""Sphinx extension: writes the API reference pages (``docs/api/``) from Accelerate's surface.

Every public name of Accelerate 1.15 (``tests/compat/accelerate-surface.json``) that hasten exports gets an
entry, grouped into pages as Accelerate's own reference is (the Accelerator, state, kwargs
handlers, plugins, trackers, launchers, big models, utilities...). Each object is documented
once, from its docstring (autodoc imports it through its public path, lazy tables included), and
the other paths it is importable from are listed under it as aliases, so every path is in the
site's index (``objects.inv``); ``tests/docs/test_site.py`` checks that.
"""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import make_id

__all__ = ["PAGES", "AliasDirective", "Entry", "collect", "find_surface", "setup", "write_pages"]

# (file, title, intro) in the order of the reference's table of contents.
PAGES: list[tuple[str, str, str]] = [
    (
        "accelerator",
        "Accelerator",
        "The main class: prepares objects, runs the loop's steps, saves and loads state.",
    ),
    (
        "state",
        "State",
        "Who and where this process is, shared by every instance "
        "(`PartialState`, `AcceleratorState`, `GradientState`).",
    ),
    (
        "kwargs",
        "Kwargs handlers",
        "Objects passed to `Accelerator(kwargs_handlers=[...])` to "
        "customise how the PyTorch objects behind it are built.",
    ),
    (
        "torch_wrappers",
        "Data loaders, optimizers and schedulers",
        "What `prepare` returns for a data loader, an optimizer and a scheduler.",
    ),
    (
        "tracking",
        "Experiment trackers",
        "Trackers chosen with `log_with=`, and the base class for your own.",
    ),
    ("launchers", "Launchers", "Starting several processes from Python (notebooks, tests)."),
    (
        "cli",
        "Command line",
        "The functions behind `hasten launch`, `hasten config`, "
        "`hasten env` and the other commands (hasten's parsers match Accelerate's).",
    ),
    (
        "big_modeling",
        "Big models",
        "Device maps, offload to CPU and disk, empty-weight "
        "initialisation and the hooks that move weights in and out.",
    ),
    (
        "inference",
        "Pipeline inference",
        "`prepare_pippy`: a model split into stages over processes.",
    ),
    ("logging", "Logging", "A logger that knows which process it is on."),
    ("fsdp", "FSDP", "Fully Sharded Data Parallel: the plugin and its helpers (FSDP2 and FSDP1)."),
    (
        "deepspeed",
        "DeepSpeed",
        "The DeepSpeed plugin, config helpers and the objects `prepare` returns under DeepSpeed.",
    ),
    ("megatron", "Megatron-LM", "The Megatron-LM plugin and its helpers."),
    (
        "parallelism",
        "N-D parallelism",
        "`ParallelismConfig` and the tensor, context and sequence parallel settings.",
    ),
    ("fp8", "FP8", "fp8 training recipes and backends (TransformerEngine, MS-AMP, torchao)."),
    ("cloud", "SageMaker and TPUs", "Settings and helpers for Amazon SageMaker and TPU pods."),
    ("utilities", "Utilities", "The other functions and classes of `hasten.utils`, by use."),
]

_GROUP_PAGES = {
    "fsdp": "fsdp", "deepspeed": "deepspeed", "megatron": "megatron", "fp8": "fp8",
    "parallelism": "parallelism", "sagemaker": "cloud", "xla_tpu": "cloud",
}  # fmt: skip
# First match wins: the second part of any of the object's paths (or of its home module).
_AREA_PAGES = [
    ("accelerator", "accelerator"), ("state", "state"), ("commands", "cli"),
    ("tracking", "tracking"), ("data_loader", "torch_wrappers"), ("optimizer", "torch_wrappers"),
    ("scheduler", "torch_wrappers"), ("launchers", "launchers"), ("inference", "inference"),
    ("hooks", "big_modeling"), ("big_modeling", "big_modeling"), ("logging", "logging"),
]  # fmt: skip
# Sections of the utilities page, by the object's home module (first prefix that matches).
_UTILITY_SECTIONS = [
    ("hasten.core.constants", "Constants"),
    ("hasten.core.imports", "Environment checks"),
    ("hasten.core.versions", "Versions"),
    ("hasten.ops.random", "Random"),
    ("hasten.ops", "Operations on tensors and nested structures"),
    ("hasten.platforms.memory", "Memory"),
    ("hasten.platforms", "Devices and environment"),
    ("hasten.core.environment", "Devices and environment"),
    ("hasten.config", "Dataclasses and enums"),
    ("hasten.big_modeling", "Modeling"),
    ("hasten.precision", "Precision"),
    ("hasten.checkpointing", "Checkpoints and saving"),
    ("hasten.training", "Training helpers"),
    ("hasten.local_sgd", "Training helpers"),
    ("", "Other helpers"),
]
_DIRECTIVES = {"class": "autoclass", "function": "autofunction"}


@dataclass
class Entry:
    """One documented object and every public path it is importable from."""

    kind: str
    paths: list[str]
    home: str
    groups: set[str] = field(default_factory=set)
    canonical: str = ""

    @property
    def primary(self) -> str:
        """The path the entry is documented under: the shortest, outside `hasten.utils` first."""
        return min(self.paths, key=lambda p: (p.count("."), ".utils" in p, p))

    @property
    def page(self) -> str:
        """The reference page the entry belongs on."""
        for group in sorted(self.groups):
            if group in _GROUP_PAGES:
                return _GROUP_PAGES[group]
        if self.home.startswith("hasten.config.kwargs"):
            return "kwargs"
        areas = {p.split(".")[1] for p in [*self.paths, self.home] if p.count(".") >= 1}
        for area, page in _AREA_PAGES:
            if area in areas:
                return page
        return "utilities"

    @property
    def section(self) -> str:
        """The utilities page's section (empty elsewhere)."""
        if self.page != "utilities":
            return ""
        return next(title for prefix, title in _UTILITY_SECTIONS if self.home.startswith(prefix))


def find_surface(start: Path) -> Path:
    """Return the repository's copy of Accelerate's surface list (``tests/compat/``) above ``start``."""
    for folder in [start, *start.parents]:
        candidate = folder / "tests" / "compat" / "accelerate-surface.json"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"tests/compat/accelerate-surface.json was not found above {start}; the API reference is "
        "generated from it. Run the docs build from a hasten checkout (git restores the file)."
    )


def _resolve(path: str) -> tuple[bool, Any]:
    module, _, name = path.rpartition(".")
    try:
        return True, getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False, None


def _table_home(path: str) -> str:
    """The module a lazy namespace (``hasten.utils``...) takes ``path``'s name from."""
    module, _, name = path.rpartition(".")
    table = getattr(importlib.import_module(module), "_TABLE", {})
    return next((home for home, names in table.items() if name in names), module)


def collect(surface: Iterable[dict[str, Any]]) -> tuple[list[Entry], list[str], list[str]]:
    """Return (entries, modules, names hasten does not export) for the surface's names."""
    by_key: dict[Any, Entry] = {}
    modules: list[str] = []
    missing: list[str] = []
    for item in surface:
        path = "hasten" + item["path"][len("accelerate") :]
        found, obj = _resolve(path)
        if not found:
            missing.append(path)
            continue
        if item["kind"] == "module":
            modules.append(path)
            continue
        home_module = getattr(obj, "__module__", None) or ""
        documentable = item["kind"] in ("class", "function") and home_module.startswith("hasten")
        kind = item["kind"] if documentable else "constant"
        key: Any = id(obj) if documentable else (path.rpartition(".")[2], repr(obj))
        entry = by_key.get(key)
        if entry is None:
            home = home_module if documentable else _table_home(path)
            canonical = f"{home}.{obj.__qualname__}" if documentable else ""
            entry = by_key[key] = Entry(kind=kind, paths=[], home=home, canonical=canonical)
        entry.paths.append(path)
        entry.groups.add(item["group"])
    return list(by_key.values()), sorted(modules), sorted(missing)


def _value(obj: Any) -> str:
    text = repr(obj).replace("\n", " ")
    return text if len(text) <= 70 else text[:67] + "..."


def _document(entry: Entry) -> list[str]:
    if entry.kind == "constant":
        module, _, name = entry.primary.rpartition(".")
        lines = [f".. py:data:: {name}", f"   :module: {module}"]
        lines += [f"   :value: {_value(_resolve(entry.primary)[1])}", ""]
    else:
        lines = [f".. {_DIRECTIVES[entry.kind]}:: {entry.primary}"]
        lines += ["   :members:", ""] if entry.kind == "class" else [""]
    role = {"class": "class", "function": "function", "constant": "data"}[entry.kind]
    # autodoc registers a class's home path itself (as its canonical name).
    skip = {entry.primary, entry.canonical if entry.kind == "class" else ""}
    for alias in sorted(p for p in entry.paths if p not in skip):
        lines += [f".. hasten-alias:: {role} {alias} {entry.primary}", ""]
    return lines


class AliasDirective(SphinxDirective):
    """``.. hasten-alias:: KIND PATH PRIMARY``: PATH is another name of the object at PRIMARY.

    Registers PATH in the Python domain as an alias (in ``objects.inv``, resolvable, never an
    ambiguous target) and says where the object is documented.
    """

    required_arguments = 3

    def run(self) -> list[nodes.Node]:
        objtype, name, primary = self.arguments
        node_id = make_id(self.env, self.state.document, "", name)
        target = nodes.target("", "", ids=[node_id])
        self.state.document.note_explicit_target(target)
        domain = self.env.get_domain("py")
        domain.note_object(name, objtype, node_id, aliased=True, location=target)
        text = nodes.paragraph()
        text += nodes.Text("Also importable as ")
        text += nodes.literal(name, name)
        text += nodes.Text(f" (the same object as {primary}).")
        return [target, text]


def _heading(text: str, underline: str) -> list[str]:
    return [text, underline * len(text), ""]


def write_pages(out: Path, surface_file: Path) -> tuple[list[Entry], list[str]]:
    """Write ``out/index.rst`` and one page per group; return the entries and missing names."""
    surface = json.loads(surface_file.read_text())["names"]
    entries, modules, missing = collect(surface)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    pages: dict[str, list[Entry]] = {name: [] for name, _, _ in PAGES}
    for entry in entries:
        pages[entry.page].append(entry)
    module_pages = {m: Entry("module", [m], m).page for m in modules}
    for name, title, intro in PAGES:
        lines = _heading(title, "=") + [intro, ""]
        for module in (m for m in modules if module_pages[m] == name):
            lines += [f".. automodule:: {module}", ""]
        chosen = sorted(pages[name], key=lambda e: (e.section, e.kind != "class", e.primary))
        section = None
        for entry in chosen:
            if entry.section and entry.section != section:
                section = entry.section
                lines += _heading(section, "-")
            lines += _document(entry)
        (out / f"{name}.rst").write_text("\n".join(lines) + "\n")
    index = _heading("API reference", "=")
    index += [
        "Every public name of Accelerate's API that hasten provides, under the same path with",
        "``accelerate`` replaced by ``hasten``, documented from its docstring.",
        "",
        ".. toctree::",
        "   :maxdepth: 1",
        "",
    ]
    index += [f"   {name}" for name, _, _ in PAGES] + [""]
    if missing:
        index += ["Names of Accelerate's API that hasten does not provide:", ""]
        index += [f"- ``{path}``" for path in missing] + [""]
    (out / "index.rst").write_text("\n".join(index))
    return entries, missing


def _generate(app: Any) -> None:
    srcdir = Path(app.srcdir)
    write_pages(srcdir / "api", find_surface(srcdir))


def setup(app: Any) -> dict[str, Any]:
    """Sphinx entry point: generate the reference pages before the sources are read."""
    app.add_directive("hasten-alias", AliasDirective)
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
