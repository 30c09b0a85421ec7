"""Launch on Amazon SageMaker: a config + launch flags -> the SDK's ``HuggingFace`` estimator.

The training script runs on SageMaker's instances with the ``ACCELERATE_*`` variables of the
launch, so `PartialState` sees the same settings there (``ACCELERATE_USE_SAGEMAKER=true``).
The ``sagemaker`` SDK is optional (``pip install 'hasten[sagemaker]'``) and imported only here.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from hasten.config import envvars
from hasten.config.enums import (
    DynamoBackend,
    SageMakerDistributedType,
    enum_value,
    parse_mixed_precision,
)

__all__ = [
    "SAGEMAKER_PARALLEL_EC2_INSTANCES",
    "SAGEMAKER_PYTHON_VERSION",
    "SAGEMAKER_PYTORCH_VERSION",
    "SAGEMAKER_TRANSFORMERS_VERSION",
    "SageMakerSettings",
    "convert_nargs_to_dict",
    "prepare_sagemager_args_inputs",
    "read_tsv_pairs",
    "run_sagemaker",
]

# Defaults of a SageMaker config (the Hugging Face DLC versions Accelerate's config writes).
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
# Instance types that support SageMaker's data-parallel library.
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]


class SageMakerSettings(Protocol):
    """The fields of ``commands.config.config_args.SageMakerConfig`` the launch reads."""

    distributed_type: Any
    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None
    profile: str | None
    region: str
    num_machines: int
    base_job_name: str
    pytorch_version: str
    transformers_version: str
    py_version: str
    sagemaker_inputs_file: str | None
    sagemaker_metrics_file: str | None
    additional_args: dict[str, Any] | None


def _parse_value(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return text


def convert_nargs_to_dict(nargs: Sequence[str]) -> dict[str, Any]:
    """Turn script arguments into SageMaker hyperparameters.

    ``["--lr", "0.1", "--name=x", "--fp16", "True"]`` -> ``{"lr": 0.1, "name": "x", "fp16": True}``:
    numbers and true/false are typed. Every argument needs a value: SageMaker hands each
    hyperparameter back to the script as ``--name value``, which a ``store_true`` flag rejects.

    Raises:
        ValueError: an argument is not ``--name value`` or ``--name=value``.
    """
    result: dict[str, Any] = {}
    items = list(nargs)
    index = 0
    while index < len(items):
        item = items[index]
        if not item.startswith("-"):
            raise ValueError(
                f"Script argument {item!r} has no --name before it. SageMaker passes script "
                "arguments as hyperparameters, so write them as --name value or --name=value."
            )
        name, sep, value = item.lstrip("-").partition("=")
        if sep:
            result[name] = _parse_value(value)
        elif index + 1 < len(items) and not items[index + 1].startswith("-"):
            index += 1
            result[name] = _parse_value(items[index])
        else:
            raise ValueError(
                "SageMaker doesn't support argparse actions for `store_true` or `store_false`. "
                f"Please define explicit types. (hasten: {item!r} has no value; SageMaker "
                f"passes it back to the script as `{item} <value>`, so give one, e.g. "
                f"`{item} True`, and parse it with an explicit type in the script.)"
            )
        index += 1
    return result


def read_tsv_pairs(path: str) -> list[tuple[str, str]]:
    """Return (first column, second column) of each line of a tab-separated file after its header.

    Raises:
        ValueError: a line has fewer than two tab-separated columns.
    """
    pairs = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) < 2:
            raise ValueError(
                f"{path}:{number}: expected two tab-separated columns (name<TAB>value), got "
                f"{line!r}."
            )
        pairs.append((columns[0], columns[1].strip()))
    return pairs


def _credentials(config: SageMakerSettings, args: argparse.Namespace) -> None:
    envvars.write("AWS_DEFAULT_REGION", config.region)
    key_id = getattr(args, "aws_access_key_id", None)
    secret = getattr(args, "aws_secret_access_key", None)
    if config.profile is not None:
        envvars.write("AWS_PROFILE", config.profile)
    elif key_id is not None and secret is not None:
        envvars.write("AWS_ACCESS_KEY_ID", key_id)
        envvars.write("AWS_SECRET_ACCESS_KEY", secret)
    else:
        raise OSError(
            "No AWS credentials: set 'profile' in the SageMaker config (hasten config), or pass "
            "--aws_access_key_id and --aws_secret_access_key to hasten launch."
        )


def _training_env(config: SageMakerSettings, args: argparse.Namespace) -> dict[str, str]:
    precision = parse_mixed_precision(
        getattr(args, "mixed_precision", None) or "no",
        "--mixed_precision",
        "pass one of them (or set mixed_precision in the config file)",
    )
    backend = str(getattr(args, "dynamo_backend", None) or "no").upper()
    if backend not in DynamoBackend.list():
        raise ValueError(
            f"Unknown dynamo_backend {backend.lower()!r}. Choose one of "
            f"{[value.lower() for value in DynamoBackend.list()]}."
        )
    kind = SageMakerDistributedType(enum_value(config.distributed_type))
    return {
        "ACCELERATE_USE_SAGEMAKER": "true",
        "ACCELERATE_MIXED_PRECISION": precision,
        "ACCELERATE_DYNAMO_BACKEND": backend,
        "ACCELERATE_DYNAMO_MODE": str(getattr(args, "dynamo_mode", None) or "default"),
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": str(bool(getattr(args, "dynamo_use_fullgraph", False))),
        "ACCELERATE_DYNAMO_USE_DYNAMIC": str(bool(getattr(args, "dynamo_use_dynamic", False))),
        "ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE": kind.value,
    }


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return `base` updated with `override`, merging nested dicts."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def prepare_sagemager_args_inputs(
    sagemaker_config: SageMakerSettings, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """Return the ``HuggingFace`` estimator's keyword arguments and the ``fit`` inputs.

    Sets ``AWS_DEFAULT_REGION`` and the credentials (``AWS_PROFILE`` from the config, else the
    ``--aws_access_key_id``/``--aws_secret_access_key`` flags) for the SDK. (The name keeps
    Accelerate's spelling.)

    Raises:
        OSError: no AWS credentials.
        ValueError: the script is not a ``.py`` file, or a setting has an unknown value.
    """
    if getattr(args, "module", False) or getattr(args, "no_python", False):
        raise ValueError(
            "SageMaker runs a Python script file: --module and --no_python cannot be used."
        )
    _credentials(sagemaker_config, args)
    script = Path(args.training_script)
    if script.suffix != ".py":
        raise ValueError(
            f"The SageMaker training script must be a Python file (.py), got {script.name!r}."
        )
    kind = SageMakerDistributedType(enum_value(sagemaker_config.distributed_type))
    distribution = None
    if kind.value == "DATA_PARALLEL":
        distribution = {"smdistributed": {"dataparallel": {"enabled": True}}}
    inputs = None
    if sagemaker_config.sagemaker_inputs_file is not None:
        inputs = dict(read_tsv_pairs(sagemaker_config.sagemaker_inputs_file))
    metrics = None
    if sagemaker_config.sagemaker_metrics_file is not None:
        pairs = read_tsv_pairs(sagemaker_config.sagemaker_metrics_file)
        metrics = [{"Name": name, "Regex": regex} for name, regex in pairs]
    estimator_args: dict[str, Any] = {
        "image_uri": sagemaker_config.image_uri,
        "entry_point": script.name,
        "source_dir": str(script.parent) if str(script.parent) else ".",
        "role": sagemaker_config.iam_role_name,
        "transformers_version": sagemaker_config.transformers_version,
        "pytorch_version": sagemaker_config.pytorch_version,
        "py_version": sagemaker_config.py_version,
        "base_job_name": sagemaker_config.base_job_name,
        "instance_count": sagemaker_config.num_machines,
        "instance_type": sagemaker_config.ec2_instance_type,
        "debugger_hook_config": False,
        "distribution": distribution,
        "hyperparameters": convert_nargs_to_dict(getattr(args, "training_script_args", [])),
        "environment": _training_env(sagemaker_config, args),
        "metric_definitions": metrics,
    }
    if sagemaker_config.additional_args:
        estimator_args = _merge(sagemaker_config.additional_args, estimator_args)
    return estimator_args, inputs


def _huggingface_estimator() -> Callable[..., Any]:
    # deferred: core.imports reads package metadata, which only a SageMaker launch needs
    from hasten.core.imports import require

    # optional: sagemaker
    require("sagemaker", feature="hasten launch on Amazon SageMaker", extra="sagemaker")
    try:
        module = importlib.import_module("sagemaker.huggingface")
    except ImportError as err:
        raise ImportError(
            f"The installed sagemaker SDK has no sagemaker.huggingface.HuggingFace estimator "
            f"({err}). Install a release that has it: pip install 'sagemaker<3'."
        ) from err
    return module.HuggingFace


def run_sagemaker(sagemaker_config: SageMakerSettings, args: argparse.Namespace) -> Any:
    """Start the training job with the SDK's ``HuggingFace`` estimator; return the estimator."""
    estimator_cls = _huggingface_estimator()
    estimator_args, inputs = prepare_sagemager_args_inputs(sagemaker_config, args)
    estimator = estimator_cls(**estimator_args)
    estimator.fit(inputs=inputs)
    print(f"You can find your model data at: {estimator.model_data}")
    return estimator
