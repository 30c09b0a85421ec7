"""``hasten estimate-memory``: how much memory a model needs to load and to train, per dtype.

The model is built on the meta device (no weights are allocated, nothing is downloaded) from a
local folder holding a transformers ``config.json``, or from ``module:callable`` returning an
``nn.Module``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from torch import nn

from hasten.big_modeling import init_empty_weights
from hasten.big_modeling.sizes import ModuleTree
from hasten.config.enums import CustomDtype
from hasten.core.imports import require

__all__ = [
    "DTYPES",
    "create_empty_model",
    "estimate_command",
    "estimate_command_parser",
    "estimate_rows",
    "format_table",
    "register",
]

DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")
_DEFAULT_DTYPES = ["float32", "float16", "int8", "int4"]


def _from_callable(spec: str) -> nn.Module:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not 'module:callable'")
    sys.path.insert(0, str(Path.cwd()))
    try:
        target: Any = importlib.import_module(module_name)
    finally:
        sys.path.pop(0)
    for part in attr.split("."):
        target = getattr(target, part)
    model = target() if callable(target) and not isinstance(target, nn.Module) else target
    if not isinstance(model, nn.Module):
        raise TypeError(f"{spec!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _from_config(path: Path, trust_remote_code: bool) -> nn.Module:
    # optional: transformers
    transformers = require(
        "transformers", feature="hasten estimate-memory on a config folder", extra="transformers"
    )
    folder = path.parent if path.is_file() else path
    config = transformers.AutoConfig.from_pretrained(
        str(folder), trust_remote_code=trust_remote_code, local_files_only=True
    )
    return transformers.AutoModel.from_config(config, trust_remote_code=trust_remote_code)


def create_empty_model(model_name: str, trust_remote_code: bool = False) -> nn.Module:
    """Build ``model_name`` on the meta device: a config folder/file or ``module:callable``.

    Raises:
        ValueError: if it is neither a local config nor ``module:callable`` (nothing is
            downloaded).
    """
    path = Path(model_name)
    with init_empty_weights():
        if (path.is_dir() and (path / "config.json").is_file()) or (
            path.is_file() and path.suffix == ".json"
        ):
            return _from_config(path, trust_remote_code)
        if ":" in model_name and not path.exists():
            return _from_callable(model_name)
    raise ValueError(
        f"{model_name!r} is not a local folder with a config.json, a config .json file, or "
        "'module:callable' returning an nn.Module. hasten estimate-memory never downloads: "
        "save the config locally first."
    )


def estimate_rows(model: nn.Module, dtypes: list[str]) -> list[dict[str, Any]]:
    """Per dtype: largest layer, total size and training memory with Adam, in bytes.

    Training with Adam keeps fp32 weights, fp32 gradients and two fp32 Adam states (4x the
    fp32 size); fp16/bf16 mixed precision adds the half-precision copy of the weights. Quantized
    dtypes are inference-only (training: None).
    """
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    fp32 = ModuleTree(model, dtype="float32", no_split_module_classes=no_split)
    rows = []
    for name in dtypes:
        if name not in DTYPES:
            raise ValueError(f"dtype {name!r} is not supported: choose among {DTYPES}")
        target: Any = CustomDtype.INT4 if name == "int4" else name
        tree = ModuleTree(model, dtype=target, no_split_module_classes=no_split)
        largest = max((tree.size[i] for i in tree.layers), default=0)
        total = tree.size[0]
        if name == "float32":
            training: float | None = 4 * fp32.size[0]
        elif name in ("float16", "bfloat16"):
            training = 4 * fp32.size[0] + total
        else:
            training = None
        rows.append({"dtype": name, "largest_layer": largest, "total": total, "training": training})
    return rows


def _human(size: float | None) -> str:
    if size is None:
        return "N/A"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.2f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.2f} TB"


def format_table(title: str, rows: list[dict[str, Any]]) -> str:
    """An ASCII table of `estimate_rows`."""
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    cells = [
        [r["dtype"], _human(r["largest_layer"]), _human(r["total"]), _human(r["training"])]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) + 2 for i, h in enumerate(headers)]
    line = "+" + "+".join("-" * w for w in widths) + "+"
    width = len(line) - 2
    out = ["+" + "-" * width + "+", "|" + title.center(width) + "|", line]
    out.append("|" + "|".join(h.center(w) for h, w in zip(headers, widths)) + "|")
    out.append(line)
    out += ["|" + "|".join(c.center(w) for c, w in zip(row, widths)) + "|" for row in cells]
    out.append(line)
    return "\n".join(out)


def estimate_command(args: argparse.Namespace) -> int:
    """Run ``hasten estimate-memory``: print the table; return the exit code."""
    model = create_empty_model(args.model_name, trust_remote_code=args.trust_remote_code)
    rows = estimate_rows(model, list(args.dtypes))
    print(format_table(f"Memory Usage for loading `{args.model_name}`", rows))
    return 0


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Build the ``estimate-memory`` parser (standalone, or under ``subparsers``)."""
    description = "Estimate the memory a model needs to load and train, per dtype (no download)."
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", help=description, description=description)
    else:
        parser = argparse.ArgumentParser("hasten estimate-memory", description=description)
    parser.add_argument(
        "model_name",
        help="a local folder with config.json (built with transformers), or module:callable",
    )
    parser.add_argument(
        "--library_name",
        choices=["transformers"],
        default=None,
        help="library building the model from a config folder (only transformers)",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=_DEFAULT_DTYPES,
        choices=DTYPES,
        help="dtypes to report (default: float32 float16 int8 int4)",
    )
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="allow custom modelling code shipped with a local config folder",
    )
    parser.set_defaults(func=estimate_command)
    return parser


def register(subparsers: Any) -> None:
    """Add ``estimate-memory`` to the ``hasten`` command table."""
    estimate_command_parser(subparsers)
