"""The cluster config file: Accelerate's YAML/JSON keys, loaded, validated and saved.

A config file describes the machine(s) a job runs on (how many processes, which precision,
where the main process listens). `hasten launch` reads it; flags, environment variables and the
script itself can override it (see `hasten launch --help`). The default location is
``$HF_HOME/accelerate/default_config.yaml`` (``HF_HOME`` defaults to ``~/.cache/huggingface``).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, cast

from hasten.config import envvars
from hasten.config.enums import (
    ComputeEnvironment,
    DistributedType,
    DynamoBackend,
    SageMakerDistributedType,
    enum_value,
    parse_mixed_precision,
)
from hasten.launchers.sagemaker import (
    SAGEMAKER_PYTHON_VERSION,
    SAGEMAKER_PYTORCH_VERSION,
    SAGEMAKER_TRANSFORMERS_VERSION,
)

__all__ = [
    "BaseConfig",
    "ClusterConfig",
    "RDZV_BACKENDS",
    "SageMakerConfig",
    "cache_dir",
    "default_config_file",
    "default_config_path",
    "default_json_config_file",
    "default_yaml_config_file",
    "hf_cache_home",
    "load_config_from_file",
]

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")


def _hf_cache_home() -> str:
    """Return ``$HF_HOME``, or ``$XDG_CACHE_HOME/huggingface`` (``~/.cache/huggingface``)."""
    home = envvars.read("HF_HOME")
    if home is None:
        home = str(Path(envvars.read("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return str(Path(home).expanduser())


def default_config_path() -> str:
    """Return the default config file location, computed from the environment now."""
    return str(Path(_hf_cache_home()) / "accelerate" / "default_config.yaml")


hf_cache_home = _hf_cache_home()
cache_dir = str(Path(hf_cache_home) / "accelerate")
default_yaml_config_file = str(Path(cache_dir) / "default_config.yaml")
# Accelerate keeps a separate name for the JSON default; both point at the same file today.
default_json_config_file = default_yaml_config_file
default_config_file = default_yaml_config_file

_INT_KEYS = ("num_processes", "machine_rank", "num_machines", "main_process_port")
_BOOL_KEYS = (
    "use_cpu",
    "debug",
    "same_network",
    "enable_cpu_affinity",
    "downcast_bf16",
    "tpu_use_cluster",
    "tpu_use_sudo",
)
_DICT_KEYS = (
    "fp8_config",
    "deepspeed_config",
    "fsdp_config",
    "parallelism_config",
    "megatron_lm_config",
    "mpirun_config",
    "dynamo_config",
)
_LIST_KEYS = ("commands", "tpu_vm", "tpu_env")
_STR_KEYS = (
    "mixed_precision",
    "main_process_ip",
    "rdzv_backend",
    "main_training_function",
    "tpu_name",
    "tpu_zone",
    "command_file",
)


@dataclass
class BaseConfig:
    """The keys every config file has: where it runs, how processes are organised, precision."""

    compute_environment: ComputeEnvironment | str
    distributed_type: DistributedType | str
    mixed_precision: str | None
    use_cpu: bool
    debug: bool

    def to_dict(self) -> dict[str, Any]:
        """Return the config as plain data (enums as strings), leaving out unset and empty keys."""
        result: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, Enum):
                value = value.value
            if value is None or (isinstance(value, dict | list) and not value):
                continue
            result[key] = value
        return result

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """Fill the keys a file may omit and translate legacy keys (``fp16``, ``dynamo_backend``)."""
        config = dict(config_dict)
        config.setdefault("compute_environment", ComputeEnvironment.LOCAL_MACHINE.value)
        if "distributed_type" not in config:
            raise ValueError(
                "The config file has no 'distributed_type' key. Add one, e.g. "
                f"'distributed_type: NO'; allowed values: {DistributedType.list()}."
            )
        local = enum_value(config["compute_environment"]) == ComputeEnvironment.LOCAL_MACHINE.value
        if (
            local
            and "num_processes" not in config
            and enum_value(config["distributed_type"]).upper() == "NO"
        ):
            config["num_processes"] = 1
        legacy_fp16 = config.pop("fp16", None)
        if "mixed_precision" not in config:
            config["mixed_precision"] = "fp16" if legacy_fp16 else None
        if "dynamo_backend" in config:
            backend = config.pop("dynamo_backend")
            config["dynamo_config"] = (
                {} if enum_value(backend).upper() == "NO" else {"dynamo_backend": backend}
            )
        for key in ("use_cpu", "debug", "enable_cpu_affinity"):
            config.setdefault(key, False)
        return config

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], source: str = "<dict>") -> BaseConfig:
        """Build a validated config from plain data, naming `source` in every error."""
        if not isinstance(config_dict, dict):
            raise TypeError(
                f"The config file {source!r} must hold a mapping of keys to values, got "
                f"{type(config_dict).__name__}. Write it as 'key: value' lines (YAML) or an object (JSON)."
            )
        config = cls.process_config(config_dict)
        allowed = sorted(f.name for f in fields(cls))
        unknown = sorted(set(config) - set(allowed))
        if unknown:
            raise ValueError(
                f"Unknown key(s) {unknown} in config file {source!r}. Allowed keys: {allowed}. "
                "Remove or rename them (`hasten config` writes a valid file)."
            )
        required = [
            f.name
            for f in fields(cls)
            if f.default is MISSING and f.default_factory is MISSING and f.name not in config
        ]
        if required:
            raise ValueError(
                f"The config file {source!r} lacks the required key(s) {required} of a "
                f"{cls.__name__}. Add them (`hasten config` asks for them)."
            )
        return cls(**config)

    @classmethod
    def from_json_file(cls, json_file: str | None = None) -> BaseConfig:
        """Load and validate a JSON config file (the default location when `json_file` is None)."""
        path = default_json_config_file if json_file is None else str(json_file)
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return cls.from_dict(data, source=path)

    @classmethod
    def from_yaml_file(cls, yaml_file: str | None = None) -> BaseConfig:
        """Load and validate a YAML config file (the default location when `yaml_file` is None)."""
        import yaml  # deferred: only commands that read a file pay for it

        path = default_yaml_config_file if yaml_file is None else str(yaml_file)
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
        return cls.from_dict(data if data is not None else {}, source=path)

    def to_json_file(self, json_file: str) -> None:
        """Write the config as sorted, indented JSON."""
        Path(json_file).parent.mkdir(parents=True, exist_ok=True)
        content = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        Path(json_file).write_text(content, encoding="utf-8")

    def to_yaml_file(self, yaml_file: str) -> None:
        """Write the config as YAML."""
        import yaml  # deferred: only commands that write a file pay for it

        Path(yaml_file).parent.mkdir(parents=True, exist_ok=True)
        with open(yaml_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle)

    def save(self, path: str) -> str:
        """Write the config to `path` as JSON (``.json``) or YAML (anything else); return `path`."""
        if str(path).endswith(".json"):
            self.to_json_file(path)
        else:
            self.to_yaml_file(path)
        return str(path)

    # The compute environment this class describes, and the enum of its distributed_type.
    _environment = ComputeEnvironment.LOCAL_MACHINE
    _distributed_enum: ClassVar[type[Enum]] = DistributedType

    def __post_init__(self) -> None:
        self.compute_environment = _choice(
            "compute_environment", self.compute_environment, ComputeEnvironment
        )
        if self.compute_environment != self._environment:
            other = (
                "SageMakerConfig" if self._environment.value == "LOCAL_MACHINE" else "ClusterConfig"
            )
            raise ValueError(
                f"compute_environment={enum_value(self.compute_environment)!r} does not fit a "
                f"{type(self).__name__} (it needs {self._environment.value!r}); use {other}, "
                "or `load_config_from_file`, which picks the class from the file."
            )
        self.distributed_type = _choice(
            "distributed_type", self.distributed_type, self._distributed_enum
        )
        if self.mixed_precision is not None:
            self.mixed_precision = parse_mixed_precision(
                self.mixed_precision,
                "config key 'mixed_precision'",
                "edit the config file (or rerun `hasten config`)",
            )


def _choice(key: str, value: Any, enum_cls: type[Enum]) -> Any:
    """Return `value` as a member of `enum_cls`, or raise naming the key and the allowed values."""
    try:
        return enum_cls(value)
    except ValueError:
        allowed = [str(member.value) for member in enum_cls]
        raise ValueError(
            f"Invalid value {value!r} for config key {key!r}. Allowed values: {allowed}."
        ) from None


@dataclass
class ClusterConfig(BaseConfig):
    """A config for a local machine or a cluster of them (Accelerate's ``ClusterConfig`` keys)."""

    num_processes: int = -1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict[str, Any] | None = None
    deepspeed_config: dict[str, Any] | None = None
    fsdp_config: dict[str, Any] | None = None
    parallelism_config: dict[str, Any] | None = None
    megatron_lm_config: dict[str, Any] | None = None
    mpirun_config: dict[str, Any] | None = None
    downcast_bf16: bool = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict[str, Any] | None = field(default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_types()
        for key in _DICT_KEYS:
            if getattr(self, key) is None:
                setattr(self, key, {})
        self._check_values()

    def _check_types(self) -> None:
        """Raise TypeError naming the first key whose value has the wrong type."""
        if isinstance(self.gpu_ids, int) and not isinstance(self.gpu_ids, bool):
            self.gpu_ids = str(self.gpu_ids)  # YAML reads `gpu_ids: 0` as an int
        checks: list[tuple[tuple[str, ...], type | tuple[type, ...], str]] = [
            (_INT_KEYS, int, "an integer"),
            (_BOOL_KEYS, bool, "true or false"),
            (_DICT_KEYS, dict, "a mapping"),
            (_LIST_KEYS, list, "a list"),
            ((*_STR_KEYS, "gpu_ids"), str, "a string"),
        ]
        for keys, expected, words in checks:
            for key in keys:
                value = getattr(self, key)
                wrong_bool = expected is int and isinstance(value, bool)
                if value is not None and (wrong_bool or not isinstance(value, expected)):
                    raise TypeError(
                        f"Config key {key!r} must be {words}, got {value!r} "
                        f"({type(value).__name__}). Fix that line of the config file."
                    )

    def _check_values(self) -> None:
        """Raise ValueError naming the first key whose value is out of range (or is unknown)."""
        from hasten.launchers.env import check_section_keys  # deferred: only files with sections

        check_section_keys(
            {"fsdp_config": self.fsdp_config, "deepspeed_config": self.deepspeed_config}
        )
        if self.num_machines < 1:
            raise ValueError(f"Config key 'num_machines' must be >= 1, got {self.num_machines!r}.")
        if not 0 <= self.machine_rank < self.num_machines:
            raise ValueError(
                f"Config key 'machine_rank' must be in [0, num_machines={self.num_machines}), "
                f"got {self.machine_rank!r}."
            )
        if self.num_processes == 0 or self.num_processes < -1:
            raise ValueError(
                f"Config key 'num_processes' must be >= 1 (or -1 for 'decide at launch'), "
                f"got {self.num_processes!r}."
            )
        port = self.main_process_port
        if port is not None and not 0 <= port <= 65535:
            raise ValueError(f"Config key 'main_process_port' must be in [0, 65535], got {port!r}.")
        if self.rdzv_backend is not None and self.rdzv_backend not in RDZV_BACKENDS:
            raise ValueError(
                f"Invalid value {self.rdzv_backend!r} for config key 'rdzv_backend'. "
                f"Allowed values: {list(RDZV_BACKENDS)}."
            )
        backend = (self.dynamo_config or {}).get("dynamo_backend")
        if backend is not None:
            self.dynamo_config = dict(self.dynamo_config or {})
            self.dynamo_config["dynamo_backend"] = _choice(
                "dynamo_config.dynamo_backend", enum_value(backend).upper(), DynamoBackend
            ).value
        if self.gpu_ids not in (None, "all"):
            parts = [part.strip() for part in str(self.gpu_ids).split(",")]
            if not all(part.isdigit() for part in parts):
                raise ValueError(
                    f"Config key 'gpu_ids' must be 'all' or comma-separated device indices like "
                    f"'0,1', got {self.gpu_ids!r}."
                )


@dataclass
class SageMakerConfig(BaseConfig):
    """A config for training jobs on Amazon SageMaker (``compute_environment: AMAZON_SAGEMAKER``)."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = f"accelerate-sagemaker-{num_machines}"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict[str, Any] | None = None
    dynamo_config: dict[str, Any] | None = None
    enable_cpu_affinity: bool = False

    _environment = ComputeEnvironment.AMAZON_SAGEMAKER
    _distributed_enum = SageMakerDistributedType

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("ec2_instance_type", "iam_role_name", "region", "base_job_name"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise TypeError(
                    f"Config key {key!r} must be a non-empty string, got {value!r}. "
                    "Fix that line of the SageMaker config (or rerun `hasten config`)."
                )
        if isinstance(self.num_machines, bool) or not isinstance(self.num_machines, int):
            raise TypeError(
                f"Config key 'num_machines' must be an integer, got {self.num_machines!r}."
            )
        if self.num_machines < 1:
            raise ValueError(f"Config key 'num_machines' must be >= 1, got {self.num_machines!r}.")
        for key in ("additional_args", "dynamo_config"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"Config key {key!r} must be a mapping, got {value!r}.")


def _config_class(data: Any) -> type[BaseConfig]:
    """The config class a file's data describes (by its ``compute_environment``)."""
    sagemaker = ComputeEnvironment.AMAZON_SAGEMAKER.value
    if isinstance(data, dict) and str(data.get("compute_environment", "")) == sagemaker:
        return SageMakerConfig
    return ClusterConfig


def load_config_from_file(config_file: str | None) -> ClusterConfig:
    """Load the config at `config_file` (or the default location): JSON by suffix, else YAML.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError / TypeError: a key is unknown or has an invalid value (the message names it).
    """
    path = default_config_path() if config_file is None else str(config_file)
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"Config file {path!r} does not exist. Pass an existing file with --config_file, "
            "or create the default one with `hasten config` or `hasten config default`."
        )
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    else:
        import yaml  # deferred: only commands that read a file pay for it

        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
        data = {} if data is None else data
    # A SageMaker file gives a SageMakerConfig (as in Accelerate); callers that launch locally
    # check for it.
    return cast(ClusterConfig, _config_class(data).from_dict(data, source=path))
