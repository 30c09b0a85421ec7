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
from hasten.commands.utils import CustomArgumentParser
from hasten.config import envvars
from hasten.config.enums import CustomDtype
from hasten.core.errors import ModelNotLocalError
from hasten.core.imports import require

__all__ = [
    "DTYPES",
    "add_timm_hub_prefix",
    "check_has_model",
    "create_ascii_table",
    "create_empty_model",
    "estimate_command",
    "estimate_command_parser",
    "estimate_rows",
    "estimate_training_usage",
    "format_table",
    "gather_data",
    "main",
    "register",
    "verify_on_hub",
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


def create_empty_model(
    model_name: str,
    library_name: str | None,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> nn.Module:
    """Build ``model_name`` on the meta device: a config folder/file or ``module:callable``.

    Args:
        model_name: a local folder holding ``config.json``, a config ``.json`` file, or
            ``module:callable`` returning an ``nn.Module``.
        library_name: the library that builds a config folder: ``"transformers"`` or None
            (the same). ``"timm"`` needs the hub, which hasten does not use.
        trust_remote_code: allow custom modelling code shipped with a local config folder.
        access_token: unused (nothing is downloaded); accepted for Accelerate's signature.

    Raises:
        ModelNotLocalError: (a ValueError and an OSError) it is neither a local config nor
            ``module:callable`` (nothing is downloaded).
    """
    del access_token  # nothing is fetched from the hub
    if library_name not in (None, "transformers"):
        raise ValueError(
            f"library_name={library_name!r}: hasten estimate-memory builds local transformers "
            "configs or module:callable models; for timm pass 'module:callable' that calls "
            "timm.create_model(...) instead."
        )
    path = Path(model_name)
    with init_empty_weights():
        if (path.is_dir() and (path / "config.json").is_file()) or (
            path.is_file() and path.suffix == ".json"
        ):
            return _from_config(path, trust_remote_code)
        if ":" in model_name and not path.exists():
            return _from_callable(model_name)
    raise ModelNotLocalError(
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


def create_ascii_table(headers: list[Any], rows: list[Any], title: str) -> str:
    """Return a boxed ASCII table: `title` on top, then `headers`, then each row (cells centred).

    Raises:
        ValueError: a row does not have one cell per header.
    """
    cells = [[str(cell) for cell in row] for row in rows]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError(
                f"create_ascii_table: row {row!r} has {len(row)} cells for {len(headers)} "
                f"headers {list(headers)}; give one cell per header."
            )
    names = [str(header) for header in headers]
    widths = [max(len(h), *(len(c[i]) for c in cells)) + 2 for i, h in enumerate(names)]
    line = "+" + "+".join("-" * w for w in widths) + "+"
    width = max(len(line) - 2, len(title) + 2)
    if width > len(line) - 2:  # a long title widens the last column
        widths[-1] += width - (len(line) - 2)
        line = "+" + "+".join("-" * w for w in widths) + "+"
    out = ["+" + "-" * width + "+", "|" + title.center(width) + "|", line]
    out.append("|" + "|".join(h.center(w) for h, w in zip(names, widths)) + "|")
    out.append(line)
    out += ["|" + "|".join(c.center(w) for c, w in zip(row, widths)) + "|" for row in cells]
    out.append(line)
    return "\n".join(out)


def format_table(title: str, rows: list[dict[str, Any]]) -> str:
    """An ASCII table of `estimate_rows`."""
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    cells = [
        [r["dtype"], _human(r["largest_layer"]), _human(r["total"]), _human(r["training"])]
        for r in rows
    ]
    return create_ascii_table(headers, cells, title)


def estimate_training_usage(
    bytes: int,  # noqa: A002 - Accelerate's parameter name
    mixed_precision: str,
    msamp_config: str | None = None,
) -> dict[str, int]:
    """Memory to train with Adam at batch size 1, by part, for a model of `bytes` in float32.

    Returns ``{"model", "optimizer", "gradients", "step"}`` in bytes (-1 where the dtype cannot
    be trained: int8/int4). float32: gradients = model, optimizer = 2x, step = 4x. float16,
    bfloat16 and fp8 without MS-AMP keep fp32 weights, 1.5x gradients and 2x optimizer states.

    Raises:
        ValueError: an MS-AMP `msamp_config` (hasten has no MS-AMP memory model), or an
            unknown `mixed_precision`.
    """
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    if msamp_config is not None:
        raise ValueError(
            f"msamp_config={msamp_config!r}: hasten estimates fp8 training without MS-AMP only; "
            "pass msamp_config=None."
        )
    fp32, half = int(bytes), int(bytes) // 2
    if mixed_precision == "float32":
        sizes.update(model=fp32, gradients=fp32, optimizer=2 * fp32, step=4 * fp32)
    elif mixed_precision in ("float16", "bfloat16", "fp8"):
        sizes.update(model=fp32, gradients=fp32 + half, optimizer=2 * fp32, step=2 * fp32)
    elif mixed_precision not in ("int8", "int4"):
        raise ValueError(
            f"Unknown mixed_precision {mixed_precision!r}: choose among "
            "float32, float16, bfloat16, fp8, int8, int4."
        )
    return sizes


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Build the model of `args` on meta; per dtype: [dtype, largest layer, total, training parts].

    The last item is `estimate_training_usage` of the float32 size (all -1 for int8/int4).
    """
    model = create_empty_model(
        args.model_name,
        library_name=getattr(args, "library_name", None),
        trust_remote_code=bool(getattr(args, "trust_remote_code", False)),
        access_token=getattr(args, "access_token", None),
    )
    dtypes = list(getattr(args, "dtypes", None) or _DEFAULT_DTYPES)
    rows = estimate_rows(model, ["float32", *dtypes])
    fp32_total = int(rows[0]["total"])
    return [
        [
            row["dtype"],
            row["largest_layer"],
            row["total"],
            estimate_training_usage(fp32_total, row["dtype"]),
        ]
        for row in rows[1:]
    ]


def estimate_command(args: argparse.Namespace) -> int:
    """Run ``hasten estimate-memory``: print the table; return the exit code."""
    model = create_empty_model(
        args.model_name,
        library_name=args.library_name,
        trust_remote_code=args.trust_remote_code,
        access_token=getattr(args, "access_token", None),
    )
    rows = estimate_rows(model, list(args.dtypes))
    print(format_table(f"Memory Usage for loading `{args.model_name}`", rows))
    return 0


def add_timm_hub_prefix(model_name: str) -> str:
    """Give a Hub repo id (``org/name``) timm's ``hf-hub:`` source prefix.

    Registry names (``resnet50``) and names with a source prefix (``hf-hub:``, ``local-dir:``)
    are returned unchanged.
    """
    if "/" not in model_name or ":" in model_name.split("/", 1)[0]:
        return model_name
    return f"hf-hub:{model_name}"


def check_has_model(error: BaseException) -> str:
    """Name the library whose "model not found" `error` this is: timm, transformers or unknown."""
    text = str(error.args[0]) if error.args else ""
    if isinstance(error, RuntimeError) and "Unknown model" in text:
        return "timm"
    if isinstance(error, OSError) and "does not appear to have a file named" in text:
        return "transformers"
    return "unknown"


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """Return the hub's model info for `repo`, ``"gated"`` or ``"repo"`` (not found).

    Offline (``HF_HUB_OFFLINE=1``) or unreachable hubs raise at once (10 s timeout).

    Raises:
        ConnectionError: the hub is offline or cannot be reached (the message says which).
        ImportError: huggingface_hub is not installed.
    """
    # optional: huggingface_hub
    hub = require("huggingface_hub", feature="verify_on_hub", extra="transformers")
    errors = importlib.import_module("huggingface_hub.utils")
    if envvars.read_flag("HF_HUB_OFFLINE"):
        raise ConnectionError(
            f"Cannot look {repo!r} up on the Hugging Face Hub: HF_HUB_OFFLINE is set. Unset it "
            "to go online, or use a local config folder (hasten estimate-memory never downloads)."
        )
    try:
        return hub.model_info(repo, token=token, timeout=10)
    except errors.GatedRepoError:
        return "gated"
    except errors.RepositoryNotFoundError:
        return "repo"
    except (OSError, errors.HfHubHTTPError) as err:
        raise ConnectionError(
            f"Cannot reach the Hugging Face Hub to look {repo!r} up ({err}). Check the network "
            "or HF_ENDPOINT, or use a local config folder."
        ) from err


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Build the ``estimate-memory`` parser (standalone, or under ``subparsers``)."""
    description = "Estimate the memory a model needs to load and train, per dtype (no download)."
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", help=description, description=description)
    else:
        parser = CustomArgumentParser("hasten estimate-memory", description=description)
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
        "--access_token",
        default=None,
        help="accepted for Accelerate's command line; unused (nothing is downloaded)",
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


def main() -> int:
    """Run ``hasten estimate-memory`` with the command line (``python -m hasten.commands.estimate``)."""
    return estimate_command(estimate_command_parser().parse_args())


if __name__ == "__main__":
    sys.exit(main())
