"""What a launch will do, decided once from flags, environment, config file and defaults.

Precedence, highest first: a launch flag, then an environment variable (``ACCELERATE_*``, or
SLURM's variables for the machine topology), then the config file, then the default. (An
argument written in the script itself, such as ``Accelerator(mixed_precision="bf16")``, beats
all of these; the state applies that rule in the worker.) Every resolved value remembers where
it came from, so `hasten env` can show it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hasten.config import envvars
from hasten.config.enums import DynamoBackend, parse_mixed_precision
from hasten.launchers.slurm import slurm_topology

__all__ = [
    "LaunchPlan",
    "RDZV_BACKENDS",
    "Resolved",
    "SETTINGS",
    "SettingSpec",
    "build_plan",
    "resolve_settings",
]

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class SettingSpec:
    """One launch setting: its default and where else it may come from."""

    name: str
    default: Any
    env: str | None = None
    config_key: str | None = None
    slurm: bool = False
    flag: str | None = None


@dataclass(frozen=True)
class Resolved:
    """A setting's effective value and its source (flag, environment, config file, default)."""

    value: Any
    source: str


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("num_processes", None, config_key="num_processes"),
    SettingSpec("num_machines", 1, config_key="num_machines", slurm=True),
    SettingSpec("machine_rank", 0, config_key="machine_rank", slurm=True),
    SettingSpec("main_process_ip", None, config_key="main_process_ip", slurm=True),
    SettingSpec("main_process_port", DEFAULT_PORT, config_key="main_process_port"),
    SettingSpec("rdzv_backend", "static", config_key="rdzv_backend"),
    SettingSpec("same_network", False, config_key="same_network"),
    SettingSpec("use_cpu", False, "ACCELERATE_USE_CPU", "use_cpu", flag="cpu"),
    SettingSpec("mixed_precision", "no", "ACCELERATE_MIXED_PRECISION", "mixed_precision"),
    SettingSpec(
        "gradient_accumulation_steps",
        1,
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
        "deepspeed_config.gradient_accumulation_steps",
    ),
    SettingSpec(
        "dynamo_backend", "no", "ACCELERATE_DYNAMO_BACKEND", "dynamo_config.dynamo_backend"
    ),
    SettingSpec("dynamo_mode", "default", "ACCELERATE_DYNAMO_MODE", "dynamo_config.dynamo_mode"),
    SettingSpec(
        "dynamo_use_fullgraph",
        False,
        "ACCELERATE_DYNAMO_USE_FULLGRAPH",
        "dynamo_config.dynamo_use_fullgraph",
    ),
    SettingSpec(
        "dynamo_use_dynamic",
        False,
        "ACCELERATE_DYNAMO_USE_DYNAMIC",
        "dynamo_config.dynamo_use_dynamic",
    ),
    SettingSpec("debug", False, "ACCELERATE_DEBUG_MODE", "debug"),
    SettingSpec("enable_cpu_affinity", False, "ACCELERATE_CPU_AFFINITY", "enable_cpu_affinity"),
    SettingSpec("downcast_bf16", False, "ACCELERATE_DOWNCAST_BF16", "downcast_bf16"),
    SettingSpec("num_cpu_threads_per_process", None, "OMP_NUM_THREADS"),
    SettingSpec("gpu_ids", "all", config_key="gpu_ids"),
    SettingSpec("max_restarts", 0),
    SettingSpec("monitor_interval", 0.1),
)


def _from_config(config: Mapping[str, Any], dotted: str) -> Any:
    """Return the value at ``a.b`` in a config dict, or None when any part is missing."""
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def resolve_settings(
    flags: Mapping[str, Any],
    config: Mapping[str, Any] | None,
    environ: Mapping[str, str],
) -> dict[str, Resolved]:
    """Resolve every setting of `SETTINGS` by precedence: flag > environment > config > default.

    Args:
        flags: launch flags the user gave (a value of None means "not given").
        config: the config file as a dict (`ClusterConfig.to_dict()`), or None without one.
        environ: the launcher's environment (``ACCELERATE_*``, ``OMP_NUM_THREADS``, SLURM).
    """
    slurm = slurm_topology(environ)
    resolved: dict[str, Resolved] = {}
    for spec in SETTINGS:
        resolved[spec.name] = _resolve_one(spec, flags, config or {}, environ, slurm)
    return resolved


def _resolve_one(
    spec: SettingSpec,
    flags: Mapping[str, Any],
    config: Mapping[str, Any],
    environ: Mapping[str, str],
    slurm: Mapping[str, Any],
) -> Resolved:
    """Resolve one setting; see `resolve_settings`."""
    if flags.get(spec.name) is not None:
        return Resolved(flags[spec.name], f"flag --{spec.flag or spec.name}")
    if spec.env is not None and environ.get(spec.env, "") != "":
        return Resolved(envvars.setting(spec.env, environ), f"environment {spec.env}")
    if spec.slurm and spec.name in slurm:
        return Resolved(slurm[spec.name], "SLURM")
    if spec.config_key is not None:
        value = _from_config(config, spec.config_key)
        # -1 processes in a config file means "decide at launch time" (Accelerate's convention).
        if value is not None and not (spec.name == "num_processes" and value == -1):
            return Resolved(value, "config file")
    return Resolved(spec.default, "default")


@dataclass(frozen=True)
class LaunchPlan:
    """Everything `hasten launch` needs, validated: the command, topology and worker settings."""

    script: str
    script_args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    num_processes: int = 1
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = "127.0.0.1"
    main_process_port: int = DEFAULT_PORT
    rdzv_backend: str = "static"
    rdzv_id: str = "none"
    same_network: bool = False
    use_cpu: bool = False
    mixed_precision: str = "no"
    gradient_accumulation_steps: int = 1
    dynamo_backend: str = "NO"
    dynamo_mode: str = "default"
    dynamo_use_fullgraph: bool = False
    dynamo_use_dynamic: bool = False
    debug: bool = False
    enable_cpu_affinity: bool = False
    downcast_bf16: bool = False
    num_cpu_threads_per_process: int | None = None
    gpu_ids: str = "all"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    min_machines: int | None = None
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self._check_command()
        self._check_topology()
        self._check_choices()

    def _check_command(self) -> None:
        if not self.script:
            raise ValueError(
                "No training script given. Usage: hasten launch [flags] script.py [script args]."
            )
        if self.module and self.no_python:
            raise ValueError(
                "--module and --no_python cannot be used together: --module runs "
                "`python -m SCRIPT`, --no_python runs SCRIPT as an executable. Pick one."
            )

    def _check_topology(self) -> None:
        if self.num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {self.num_processes!r}.")
        if self.num_machines < 1:
            raise ValueError(f"num_machines must be >= 1, got {self.num_machines!r}.")
        if self.num_processes % self.num_machines:
            raise ValueError(
                f"num_processes={self.num_processes} (the total over all machines) must be a "
                f"multiple of num_machines={self.num_machines}. Pass --num_processes "
                f"{self.num_machines * max(1, self.num_processes // self.num_machines)}."
            )
        if not 0 <= self.machine_rank < self.num_machines:
            raise ValueError(
                f"machine_rank must be in [0, num_machines={self.num_machines}), got "
                f"{self.machine_rank!r}. Number machines 0..{self.num_machines - 1}."
            )
        if not 0 <= self.main_process_port <= 65535:
            raise ValueError(
                f"main_process_port must be in [0, 65535], got {self.main_process_port!r}."
            )
        self._check_elastic()
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts!r}.")
        if self.monitor_interval <= 0:
            raise ValueError(
                f"monitor_interval must be > 0 seconds, got {self.monitor_interval!r}."
            )
        threads = self.num_cpu_threads_per_process
        if threads is not None and threads < 1:
            raise ValueError(f"num_cpu_threads_per_process must be >= 1, got {threads!r}.")
        if self.gradient_accumulation_steps < 1:
            raise ValueError(
                "gradient_accumulation_steps must be >= 1, got "
                f"{self.gradient_accumulation_steps!r}."
            )

    def _check_elastic(self) -> None:
        if self.min_machines is None:
            return
        if not 1 <= self.min_machines <= self.num_machines:
            raise ValueError(
                f"min_machines must be in [1, num_machines={self.num_machines}], got "
                f"{self.min_machines!r}. Pass --nnodes MIN:MAX with 1 <= MIN <= MAX."
            )
        if self.is_elastic and self.rdzv_backend != "c10d":
            raise ValueError(
                f"--nnodes {self.min_machines}:{self.num_machines} is an elastic range, which "
                f"needs the c10d rendezvous; rdzv_backend is {self.rdzv_backend!r}. Pass "
                "--rdzv_backend c10d (or a fixed --nnodes N)."
            )

    def _check_choices(self) -> None:
        mode = parse_mixed_precision(self.mixed_precision, "LaunchPlan(mixed_precision=...)")
        object.__setattr__(self, "mixed_precision", mode)  # frozen: normalised once, here
        if self.dynamo_backend not in DynamoBackend.list():
            raise ValueError(
                f"Unknown dynamo_backend {self.dynamo_backend!r}. Choose one of "
                f"{[value.lower() for value in DynamoBackend.list()]}."
            )
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise ValueError(
                f"Unknown rdzv_backend {self.rdzv_backend!r}. Choose one of {list(RDZV_BACKENDS)}."
            )

    @property
    def nproc_per_node(self) -> int:
        """Number of worker processes this machine starts."""
        return self.num_processes // self.num_machines

    @property
    def min_nodes(self) -> int:
        """Fewest machines the job runs on: MIN of ``--nnodes MIN:MAX``, else all of them."""
        return self.num_machines if self.min_machines is None else self.min_machines

    @property
    def is_elastic(self) -> bool:
        """True when the job may continue on fewer machines than ``num_machines``."""
        return self.min_nodes < self.num_machines

    @property
    def is_single_process(self) -> bool:
        """True when the script can run directly: one process, one machine, no restarts."""
        return self.num_processes == 1 and self.num_machines == 1 and self.max_restarts == 0

    @property
    def rdzv_endpoint(self) -> str:
        """``host:port`` of the rendezvous store (the main process of machine 0)."""
        return f"{self.main_process_ip}:{self.main_process_port}"


def _choice(value: Any, normalise: Callable[[str], str]) -> str:
    return normalise(str(value.value if hasattr(value, "value") else value))


def _check_devices(values: Mapping[str, Any], sources: Mapping[str, str], devices: int) -> None:
    """More processes per machine than visible accelerators would share one: refuse, naming both."""
    if devices == 0:  # CPU (asked for with --cpu, or no accelerator): any number of processes
        return
    gpu_ids = values["gpu_ids"]
    if gpu_ids not in (None, "all"):
        devices = min(devices, len([part for part in str(gpu_ids).split(",") if part.strip()]))
    per_machine = int(values["num_processes"]) // max(1, int(values["num_machines"]))
    if per_machine > devices:
        raise ValueError(
            f"num_processes={values['num_processes']} (from {sources['num_processes']}) starts "
            f"{per_machine} processes on this machine, but only {devices} accelerator(s) are "
            "visible: processes would share a device (and NCCL refuses that). Pass "
            f"--num_processes {devices * max(1, int(values['num_machines']))} (one per device), "
            "or --cpu to run every process on the CPU."
        )


def build_plan(
    resolved: Mapping[str, Resolved],
    script: str,
    script_args: tuple[str, ...] | list[str] = (),
    *,
    module: bool = False,
    no_python: bool = False,
    extra_env: Mapping[str, str] | None = None,
    rdzv_id: str | None = None,
    count_devices: Callable[[], int] | None = None,
) -> LaunchPlan:
    """Turn resolved settings into a validated `LaunchPlan`.

    Args:
        resolved: output of `resolve_settings`.
        script: the training script (or module with `module=True`, executable with `no_python`).
        script_args: arguments passed to the script unchanged.
        module: run `script` as ``python -m script``.
        no_python: run `script` directly, without the Python interpreter.
        extra_env: variables given with ``--env KEY=VALUE``; set in every worker, last.
        rdzv_id: rendezvous run id shared by all machines (default ``"none"``).
        count_devices: returns the number of accelerators, used only when no source gives
            ``num_processes`` (one process per device, or 1 on CPU).
    """
    values = {name: item.value for name, item in resolved.items()}
    sources = {name: item.source for name, item in resolved.items()}
    use_cpu = bool(values["use_cpu"])
    devices = 0 if use_cpu or count_devices is None else count_devices()
    if values["num_processes"] is None:
        values["num_processes"] = max(1, devices) * int(values["num_machines"])
        sources["num_processes"] = f"default ({'CPU' if devices == 0 else f'{devices} devices'})"
    _check_devices(values, sources, devices)
    if values["main_process_ip"] is None:
        if int(values["num_machines"]) > 1:
            raise ValueError(
                f"num_machines={values['num_machines']} needs the address of machine 0: pass "
                "--main_process_ip (or set main_process_ip in the config file)."
            )
        values["main_process_ip"] = "127.0.0.1"
    if values["main_process_port"] is None:
        values["main_process_port"] = DEFAULT_PORT
    source = sources["mixed_precision"]
    values["mixed_precision"] = parse_mixed_precision(
        values["mixed_precision"], source, f"change the {source}"
    )
    values["dynamo_backend"] = _choice(values["dynamo_backend"], str.upper)
    values["gpu_ids"] = str(values["gpu_ids"] if values["gpu_ids"] is not None else "all")
    known = {f.name for f in dataclasses.fields(LaunchPlan)}
    kwargs = {name: value for name, value in values.items() if name in known}
    return LaunchPlan(
        script=script,
        script_args=tuple(script_args),
        module=module,
        no_python=no_python,
        extra_env=tuple((extra_env or {}).items()),
        rdzv_id=rdzv_id or "none",
        sources=sources,
        **kwargs,
    )
