"""Which trackers exist, which are installed, and turning ``log_with`` into a checked list.

Built-in trackers are listed by module path so that choosing them imports nothing: a tracker's
module (and its library) is loaded only when a run is actually created with it.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from hasten.config.enums import LoggerType
from hasten.core.errors import TrackerClassError
from hasten.core.imports import is_package_available
from hasten.tracking.base import GeneralTracker

__all__ = [
    "BUILTIN_TRACKER",
    "LOGGER_TYPE_TO_CLASS",
    "LogWith",
    "LoggerTypeTable",
    "TrackerSpec",
    "filter_trackers",
    "get_available_trackers",
    "known_tracker_names",
    "register_tracker_class",
    "tracker_class",
]

BUILTIN_TRACKER = "jsonl"
"""Name of hasten's dependency-free tracker (one JSON line per log call)."""

LogWith = str | LoggerType | GeneralTracker | Sequence[str | LoggerType | GeneralTracker] | None


@dataclass(frozen=True)
class TrackerSpec:
    """Where a built-in tracker class lives and which package makes it usable."""

    module: str
    cls: str
    packages: tuple[str, ...]
    pip_name: str
    requires_logging_directory: bool


_BUILTINS: dict[str, TrackerSpec] = {
    BUILTIN_TRACKER: TrackerSpec("hasten.tracking.jsonl", "JSONLTracker", (), "", True),
    "aim": TrackerSpec("hasten.tracking.aim", "AimTracker", ("aim",), "aim", True),
    "clearml": TrackerSpec(
        "hasten.tracking.clearml", "ClearMLTracker", ("clearml",), "clearml", False
    ),
    "comet_ml": TrackerSpec(
        "hasten.tracking.comet_ml", "CometMLTracker", ("comet_ml",), "comet-ml", False
    ),
    "dvclive": TrackerSpec(
        "hasten.tracking.dvclive", "DVCLiveTracker", ("dvclive",), "dvclive", False
    ),
    "mlflow": TrackerSpec("hasten.tracking.mlflow", "MLflowTracker", ("mlflow",), "mlflow", False),
    "swanlab": TrackerSpec(
        "hasten.tracking.swanlab", "SwanLabTracker", ("swanlab",), "swanlab", False
    ),
    "tensorboard": TrackerSpec(
        "hasten.tracking.tensorboard",
        "TensorBoardTracker",
        ("tensorboard", "tensorboardX"),
        "tensorboard",
        True,
    ),
    "trackio": TrackerSpec(
        "hasten.tracking.trackio", "TrackioTracker", ("trackio",), "trackio", False
    ),
    "wandb": TrackerSpec("hasten.tracking.wandb", "WandBTracker", ("wandb",), "wandb", False),
}

_CUSTOM: dict[str, type[GeneralTracker]] = {}
# Built-in names removed from LOGGER_TYPE_TO_CLASS (del / clear), until set again.
_HIDDEN: set[str] = set()


def known_tracker_names() -> list[str]:
    """Every name ``log_with`` accepts: "all", the built-in trackers and registered classes."""
    return ["all", *sorted(n for n in set(_BUILTINS) | set(_CUSTOM) if _known(n))]


def _installed(name: str) -> bool:
    spec = _BUILTINS[name]
    return not spec.packages or any(is_package_available(pkg) for pkg in spec.packages)


def get_available_trackers() -> list[str]:
    """Names of the built-in trackers whose library is installed (the built-in one always is)."""
    return [name for name in sorted(_BUILTINS) if _installed(name)]


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make a `GeneralTracker` subclass selectable by its ``name`` in ``log_with``.

    It is then built like the built-in trackers: ``cls(project_name, [logging_dir,] **init_kwargs)``.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise TrackerClassError(
            f"register_tracker_class got {tracker_class!r}; it takes a subclass of "
            "hasten.tracking.GeneralTracker (the class itself, not an instance)."
        )
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{tracker_class.__name__}.name is {name!r}; set a non-empty string class attribute "
            "`name`, the word used in log_with."
        )
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(
            f"{tracker_class.__name__} has no `requires_logging_directory`; set it to True if the "
            "tracker writes under the logging directory, else False."
        )
    if name == "all" or _known(name):
        warnings.warn(
            f"register_tracker_class: {name!r} was already a tracker name; {tracker_class.__name__} "
            "now replaces it in log_with.",
            UserWarning,
            stacklevel=2,
        )
    _CUSTOM[name] = tracker_class
    _HIDDEN.discard(name)


def _known(name: str) -> bool:
    """Whether ``name`` is in the table: registered, or built in and not removed from it."""
    return name in _CUSTOM or (name in _BUILTINS and name not in _HIDDEN)


def tracker_class(name: str) -> type[GeneralTracker]:
    """Return the class registered under ``name``, importing its module now."""
    if name in _CUSTOM:
        return _CUSTOM[name]
    spec = _BUILTINS.get(name)
    if spec is None:
        raise ValueError(
            f"Unknown tracker {name!r}. Valid names: {known_tracker_names()}; or pass a "
            "GeneralTracker instance, or register a class with register_tracker_class()."
        )
    cls: type[GeneralTracker] = getattr(importlib.import_module(spec.module), spec.cls)
    return cls


class LoggerTypeTable(MutableMapping[str, type[GeneralTracker]]):
    """The table ``tracker name -> class`` of the built-in and registered trackers.

    Accelerate's ``LOGGER_TYPE_TO_CLASS`` (a dict there): it can be read, set, deleted from,
    cleared and updated like one. A built-in tracker's module is imported when its class is
    looked up, not when the table is read, so iterating names stays cheap.
    """

    def __getitem__(self, name: str) -> type[GeneralTracker]:
        if not _known(name):
            raise KeyError(name)
        return tracker_class(name)

    def __setitem__(self, name: str, cls: type[GeneralTracker]) -> None:
        _CUSTOM[name] = cls
        _HIDDEN.discard(name)

    def __delitem__(self, name: str) -> None:
        if not _known(name):
            raise KeyError(name)
        _CUSTOM.pop(name, None)
        if name in _BUILTINS:
            _HIDDEN.add(name)

    def clear(self) -> None:
        """Empty the table without importing the built-in trackers' modules."""
        _CUSTOM.clear()
        _HIDDEN.update(_BUILTINS)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(n for n in set(_BUILTINS) | set(_CUSTOM) if _known(n)))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"LoggerTypeTable({list(self)})"


LOGGER_TYPE_TO_CLASS = LoggerTypeTable()


def _requires_logging_directory(name: str) -> bool:
    if name in _CUSTOM:
        return bool(_CUSTOM[name].requires_logging_directory)
    return _BUILTINS[name].requires_logging_directory


def _normalize(entry: Any) -> str | GeneralTracker:
    if isinstance(entry, GeneralTracker):
        return entry
    if isinstance(entry, type) and issubclass(entry, GeneralTracker):
        raise TypeError(
            f"log_with got the class {entry.__name__}; pass an instance "
            f"({entry.__name__}(...)) or register the class with register_tracker_class()."
        )
    if not isinstance(entry, str):
        raise TypeError(
            f"log_with entries must be tracker names or GeneralTracker instances, got "
            f"{entry!r} ({type(entry).__name__})."
        )
    name = str(entry.value) if isinstance(entry, LoggerType) else entry
    key = name.lower()
    if _known(key) or key == "all":
        return key
    if name in _CUSTOM:
        return name
    raise ValueError(
        f"Unknown tracker {entry!r} in log_with. Valid names: {known_tracker_names()}; or pass "
        "a GeneralTracker instance, or register a class with register_tracker_class()."
    )


def _check_named(name: str, logging_dir: str | os.PathLike[str] | None) -> None:
    if name in _BUILTINS and not _installed(name):
        spec = _BUILTINS[name]
        raise ImportError(
            f"log_with={name!r} needs the {spec.packages[0]!r} package, which is not installed. "
            f"Fix: pip install {spec.pip_name}  (or drop {name!r} from log_with)."
        )
    if logging_dir is None and _requires_logging_directory(name):
        raise ValueError(
            f"Logging with `{name}` requires a `logging_dir` to be passed in. (hasten: it writes "
            "files under a logging directory; pass Accelerator(project_dir=...) or "
            "ProjectConfiguration(logging_dir=...).)"
        )


def _expand_all(logging_dir: str | os.PathLike[str] | None) -> list[str]:
    names = get_available_trackers()
    if logging_dir is not None:
        return names
    left_out = [n for n in names if _requires_logging_directory(n)]
    if left_out:
        warnings.warn(
            f"log_with='all' leaves out {left_out}: they write under a logging directory and none "
            "was given. Pass Accelerator(project_dir=...) to include them.",
            UserWarning,
            stacklevel=3,
        )
    return [n for n in names if n not in left_out]


def filter_trackers(
    log_with: LogWith, logging_dir: str | os.PathLike[str] | None = None
) -> list[str | GeneralTracker]:
    """Check ``log_with`` and return the trackers to create: names (deduplicated) and instances.

    ``"all"`` expands to every installed built-in tracker (a tracker that needs a logging
    directory is left out, with a warning, when there is none). A named tracker whose library
    is missing raises ImportError naming the pip package; an unknown name raises ValueError
    listing the valid ones. Nothing is imported here except availability checks.
    """
    if log_with is None:
        return []
    entries = [log_with] if isinstance(log_with, str | GeneralTracker) else list(log_with)
    picked: list[str | GeneralTracker] = []
    for entry in map(_normalize, entries):
        if isinstance(entry, GeneralTracker):
            picked.append(entry)
        elif entry == "all":
            picked.extend(n for n in _expand_all(logging_dir) if n not in picked)
        elif entry not in picked:
            _check_named(entry, logging_dir)
            picked.append(entry)
    return picked
