"""``hasten launch``: run a training script on one or many processes and machines.

The command only parses and plans; `hasten.launchers` does the work (one process runs the
script directly, several go through PyTorch's elastic agent).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

from hasten.commands.config.config_args import default_config_path, load_config_from_file
from hasten.commands.launch_help import CustomHelpFormatter, clean_option
from hasten.commands.utils import CustomArgumentParser
from hasten.config import envvars
from hasten.config.enums import DynamoBackend, PrecisionType, enum_value
from hasten.launchers.deepspeed import (
    add_deepspeed_launcher_flags,
    deepspeed_runner_command,
    uses_deepspeed_runner,
    write_deepspeed_env,
)
from hasten.launchers.elastic import choose_port, run, run_workers, script_command
from hasten.launchers.env import plugin_env, setup_fp8_env, worker_env
from hasten.launchers.options import add_option_flags, check_parallelism_sizes, option_env
from hasten.launchers.plan import RDZV_BACKENDS, SETTINGS, LaunchPlan, build_plan, resolve_settings
from hasten.launchers.rendezvous import check_min_processes, parse_nnodes, parse_rdzv_conf
from hasten.launchers.sagemaker import run_sagemaker
from hasten.launchers.slurm import slurm_topology
from hasten.launchers.xla_pod import pod_launch_command

__all__ = [
    "CustomHelpFormatter",
    "PRECEDENCE",
    "clean_option",
    "deepspeed_launcher",
    "launch_command",
    "launch_command_parser",
    "load_launch_config",
    "main",
    "multi_gpu_launcher",
    "plan_from_args",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_simple_launcher_cmd_env",
    "register",
    "run_launch",
    "sagemaker_launcher",
    "simple_launcher",
    "tpu_launcher",
    "tpu_pod_launcher",
]

PRECEDENCE = """\
Where each setting comes from, highest priority first:
  1. an argument written in the script (e.g. Accelerator(mixed_precision="bf16"))
  2. a flag of this command (e.g. --mixed_precision fp16)
  3. an environment variable (e.g. ACCELERATE_MIXED_PRECISION=fp16; inside a SLURM
     allocation started with srun, SLURM_NNODES / SLURM_NODEID / SLURM_JOB_NODELIST give
     --num_machines / --machine_rank / --main_process_ip)
  4. the config file (--config_file, else $HF_HOME/accelerate/default_config.yaml if present)
  5. the built-in default
`hasten env` prints every effective setting and where it came from.
"""


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(
            f"--env expects KEY=VALUE (e.g. --env NCCL_DEBUG=INFO), got {text!r}"
        )
    return name.strip(), value


def _add_topology_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Processes and machines")
    group.add_argument(
        "--cpu",
        dest="use_cpu",
        action="store_true",
        default=None,
        help="Run on CPU even if accelerators are present (gloo backend).",
    )
    group.add_argument(
        "--multi_gpu",
        action="store_true",
        default=None,
        help="Use every visible GPU when --num_processes is not given.",
    )
    group.add_argument("--num_processes", type=int, help="Total processes over all machines.")
    group.add_argument("--num_machines", type=int, help="Number of machines (nodes).")
    group.add_argument(
        "--nnodes",
        help="Machines as N, or MIN:MAX for an elastic job that goes on when machines are "
        "lost (c10d rendezvous; sets --num_machines MAX).",
    )
    group.add_argument(
        "--rdzv_conf",
        default="",
        help="Rendezvous settings KEY=VALUE,... passed to torch elastic (e.g. "
        "last_call_timeout=2,keep_alive_interval=1).",
    )
    group.add_argument("--machine_rank", type=int, help="Index of this machine (0 = main).")
    group.add_argument("--main_process_ip", help="Address of machine 0.")
    group.add_argument(
        "--main_process_port",
        type=int,
        help="Port of the rendezvous on machine 0 (default 29500; 0 = any free).",
    )
    group.add_argument(
        "--rdzv_backend",
        choices=RDZV_BACKENDS,
        help="Rendezvous: static (machine ranks given) or c10d (elastic).",
    )
    group.add_argument(
        "--same_network",
        action="store_true",
        default=None,
        help="All machines share one local network.",
    )
    group.add_argument("--gpu_ids", help="Comma-separated device ids to use (default all).")
    group.add_argument(
        "--num_cpu_threads_per_process",
        type=int,
        help="OMP_NUM_THREADS of each worker (default: cores / processes).",
    )
    group.add_argument(
        "--enable_cpu_affinity",
        action="store_true",
        default=None,
        help="Pin each worker to the cores of its NUMA node.",
    )
    group.add_argument(
        "--max_restarts",
        type=int,
        help="Restart the whole worker group this many times after a failure.",
    )
    group.add_argument(
        "--monitor_interval", type=float, help="Seconds between worker health checks (default 0.1)."
    )


def _add_training_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Training settings passed to the script")
    group.add_argument(
        "--mixed_precision",
        type=str.lower,
        choices=PrecisionType.list(),
        help="Mixed precision (sets ACCELERATE_MIXED_PRECISION).",
    )
    group.add_argument(
        "--gradient_accumulation_steps", type=int, help="Micro-batches per optimizer step."
    )
    group.add_argument(
        "--dynamo_backend",
        type=str.lower,
        choices=[value.lower() for value in DynamoBackend.list()],
        help="torch.compile backend (no = off).",
    )
    group.add_argument("--dynamo_mode", help="torch.compile mode (default, reduce-overhead, ...).")
    group.add_argument(
        "--dynamo_use_fullgraph",
        action="store_true",
        default=None,
        help="torch.compile(fullgraph=True).",
    )
    group.add_argument(
        "--dynamo_use_dynamic",
        action="store_true",
        default=None,
        help="torch.compile(dynamic=True).",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=None,
        help="Check collective shapes across processes (ACCELERATE_DEBUG_MODE).",
    )
    group.add_argument(
        "--env",
        action="append",
        type=_env_pair,
        default=[],
        metavar="KEY=VALUE",
        help="Set a variable in every worker (repeatable); applied last.",
    )


def _add_fp8_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "fp8 training (with --mixed_precision fp8)", "Each given flag sets its ACCELERATE_FP8_*."
    )
    group.add_argument(
        "--fp8_backend",
        type=str.lower,
        choices=["ao", "te", "msamp"],
        help="fp8 library: ao (torchao), te (TransformerEngine), msamp (MS-AMP).",
    )
    group.add_argument(
        "--fp8_use_autocast_during_eval",
        action="store_true",
        default=None,
        help="TE: keep fp8 autocast in evaluation.",
    )
    group.add_argument("--fp8_margin", type=int, help="TE: scaling-factor margin (default 0).")
    group.add_argument("--fp8_interval", type=int, help="TE: scaling update interval (default 1).")
    group.add_argument(
        "--fp8_format", type=str.upper, choices=["HYBRID", "E4M3", "E5M2"], help="TE fp8 format."
    )
    group.add_argument("--fp8_amax_history_len", type=int, help="TE: amax history (default 1024).")
    group.add_argument(
        "--fp8_amax_compute_algo",
        type=str.lower,
        choices=["max", "most_recent"],
        help="TE: how amax is taken from its history.",
    )
    group.add_argument(
        "--fp8_override_linear_precision",
        help="TE: fprop,dgrad,wgrad GEMMs kept in higher precision, e.g. false,false,true.",
    )
    group.add_argument(
        "--fp8_opt_level", type=str.upper, choices=["O1", "O2"], help="MS-AMP optimisation level."
    )


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten launch`` parser (added to `subparsers` when given)."""
    kwargs: dict[str, Any] = {
        "description": (
            "Launch a training script on one or many processes and machines. Flags may be "
            "written with dashes or underscores (--num-processes is --num_processes)."
        ),
        "epilog": PRECEDENCE,
        "formatter_class": CustomHelpFormatter,
        "allow_abbrev": False,
    }
    if subparsers is not None:
        parser = subparsers.add_parser("launch", help="Launch a training script.", **kwargs)
    else:
        parser = CustomArgumentParser("hasten launch", **kwargs)
    parser.add_argument("--config_file", help="Config file to use (YAML or JSON).")
    _add_topology_flags(parser)
    _add_training_flags(parser)
    _add_fp8_flags(parser)
    add_option_flags(parser)
    add_deepspeed_launcher_flags(parser)
    _add_platform_flags(parser)
    command = parser.add_argument_group("Command")
    command.add_argument(
        "-m", "--module", action="store_true", help="Run the script as a module (python -m script)."
    )
    command.add_argument(
        "--no_python", action="store_true", help="Run the script as an executable, without python."
    )
    parser.add_argument("training_script", help="The script (or module) to run.")
    parser.add_argument(
        "training_script_args", nargs=argparse.REMAINDER, help="Arguments of the script."
    )
    parser.set_defaults(func=_launch_from_cli)
    return parser


def register(subparsers: Any) -> None:
    """Add ``hasten launch`` to the ``hasten`` command table."""
    launch_command_parser(subparsers)


def load_launch_config(config_file: str | None) -> dict[str, Any] | None:
    """Return the config file as a dict: `config_file`, else the default one if it exists."""
    if config_file is None:
        config_file = default_config_path()
        if not Path(config_file).is_file():
            return None
    return load_config_from_file(config_file).to_dict()


# Device nodes that exist on Linux when an NVIDIA/AMD/Intel/Ascend accelerator may be present.
_DEVICE_NODES = ("/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/dri", "/dev/davinci0")


def _count_devices() -> int:
    """Count accelerators, skipping the torch import (~1-2 s) on a Linux box that has none."""
    if sys.platform == "linux" and not any(Path(node).exists() for node in _DEVICE_NODES):
        return 0
    from hasten.platforms.registry import current_platform  # deferred: imports torch

    platform = current_platform()
    return 0 if platform.name == "cpu" else int(platform.device_count())


def plan_from_args(args: argparse.Namespace) -> tuple[LaunchPlan, dict[str, Any] | None]:
    """Resolve flags, environment, config file and defaults into a plan (and the config used)."""
    config = load_launch_config(args.config_file)
    flags = {spec.name: getattr(args, spec.name, None) for spec in SETTINGS}
    elastic_range = _nnodes(args, flags)
    environ = envvars.snapshot()
    resolved = resolve_settings(flags, config, environ)
    slurm_job = environ.get("SLURM_JOB_ID") if slurm_topology(environ) else None
    plan = build_plan(
        resolved,
        args.training_script,
        args.training_script_args,
        module=args.module,
        no_python=args.no_python,
        extra_env=dict(args.env),
        rdzv_id=slurm_job,
        count_devices=_count_devices,
    )
    rdzv_conf = tuple(parse_rdzv_conf(getattr(args, "rdzv_conf", "") or "").items())
    if elastic_range is not None or rdzv_conf:
        low = None if elastic_range is None else elastic_range[0]
        plan = dataclasses.replace(plan, min_machines=low, rdzv_conf=rdzv_conf)
    return plan, config


def _nnodes(args: argparse.Namespace, flags: dict[str, Any]) -> tuple[int, int] | None:
    """Apply ``--nnodes N|MIN:MAX`` to the flags (num_machines, c10d); return (MIN, MAX)."""
    text = getattr(args, "nnodes", None)
    if not text:
        return None
    low, high = parse_nnodes(str(text))
    if flags.get("num_machines") not in (None, high):
        raise ValueError(
            f"--nnodes {text} and --num_machines {flags['num_machines']} disagree; pass only "
            "--nnodes (it sets the number of machines to MAX)."
        )
    flags["num_machines"] = high
    if low < high and flags.get("rdzv_backend") is None:
        flags["rdzv_backend"] = "c10d"  # an elastic range only works with c10d
    return low, high


def launch_command(args: argparse.Namespace) -> int:
    """Run ``hasten launch`` with parsed `args` from Python; return the job's exit code (0).

    A SageMaker config (``compute_environment: AMAZON_SAGEMAKER``) starts a SageMaker training
    job; ``--tpu`` (or ``distributed_type: XLA``) starts the TPU cores, on every worker of a
    pod with ``--tpu_cluster``. Everything else runs in child processes (one, or several under
    torch elastic). As Accelerate's, a failed job raises; the ``hasten launch`` command instead
    replaces itself with a single process and exits with the job's code.

    Raises:
        subprocess.CalledProcessError: the job failed.
    """
    return _launch(args, replace_process=False)


def _launch_from_cli(args: argparse.Namespace) -> int:
    """``hasten launch``: a single process replaces the launcher; the job's exit code is ours."""
    return _launch(args, replace_process=True)


def _launch(args: argparse.Namespace, *, replace_process: bool) -> int:
    special = _platform_launch(args)
    if special is not None:
        return special
    plan, _ = plan_from_args(args)
    if args.use_deepspeed and uses_deepspeed_runner(plan, args.deepspeed_multinode_launcher):
        code = deepspeed_launcher(args)
    else:
        code = run_launch(args, replace_process=replace_process)
    if code != 0 and not replace_process:
        raise subprocess.CalledProcessError(code, [plan.script, *plan.script_args])
    return code


def run_launch(args: argparse.Namespace, *, replace_process: bool = True) -> int:
    """Run the plan of `args` on this machine; one process replaces this one unless told not to."""
    plan, env = _plan_and_env(args)
    return run(plan, env, replace_process=replace_process)


def _plan_and_env(args: argparse.Namespace) -> tuple[LaunchPlan, dict[str, str]]:
    """The plan of `args` and the variables every worker gets on top of this environment."""
    plan, config = plan_from_args(args)
    env = worker_env(plan, plugin_values=plugin_env(config or {}))
    # --fp8_* flags beat fp8_config (flags > environment > config file); --env still wins.
    setup_fp8_env(args, env)
    env.update(option_env(args))  # --use_fsdp / --fsdp_* flags (one table: launchers/options.py)
    env.update(dict(plan.extra_env))
    check_parallelism_sizes(env, plan.num_processes)
    if plan.is_elastic:
        check_min_processes(env, plan.min_nodes, plan.nproc_per_node)
    return plan, env


def _add_platform_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of the TPU and SageMaker launchers (listed in help when selected)."""
    tpu = parser.add_argument_group("TPU")
    tpu.add_argument(
        "--tpu", action="store_true", default=None, help="Run on this host's TPU cores (XLA)."
    )
    tpu.add_argument(
        "--tpu_cluster",
        dest="tpu_use_cluster",
        action="store_true",
        default=None,
        help="Run on every worker of a TPU pod (through gcloud ssh).",
    )
    tpu.add_argument(
        "--no_tpu_cluster",
        dest="tpu_use_cluster",
        action="store_false",
        help="Run only on this TPU host (the default).",
    )
    tpu.add_argument("--tpu_name", help="Name of the TPU pod (default: config tpu_name).")
    tpu.add_argument("--tpu_zone", help="Zone of the TPU pod (default: config tpu_zone).")
    tpu.add_argument(
        "--tpu_use_sudo", action="store_true", default=None, help="Run the pod command with sudo."
    )
    tpu.add_argument(
        "--vm",
        dest="tpu_vm",
        action="append",
        help="A pod worker to run on (repeatable; default all workers).",
    )
    tpu.add_argument(
        "--main_training_function",
        help="Function of the script to start on each TPU core (default main).",
    )
    tpu.add_argument(
        "--downcast_bf16",
        action="store_true",
        default=None,
        help="With bf16 on TPU: float32 as bfloat16 and float64 as float32 (XLA_DOWNCAST_BF16).",
    )
    aws = parser.add_argument_group("AWS (SageMaker)")
    aws.add_argument("--aws_access_key_id", help="AWS key id (else the config's profile).")
    aws.add_argument("--aws_secret_access_key", help="AWS secret key (else the config's profile).")


def main() -> int:
    """Run ``hasten launch`` with the command line (``python -m hasten.commands.launch ...``)."""
    return _launch_from_cli(launch_command_parser().parse_args())


def _config_path(args: argparse.Namespace) -> str | None:
    path = getattr(args, "config_file", None) or default_config_path()
    return path if Path(path).is_file() else None


# Config keys the TPU launchers take when the flag is not given.
_TPU_KEYS = ("tpu_use_cluster", "tpu_name", "tpu_zone", "tpu_use_sudo", "tpu_vm")


def _platform_launch(args: argparse.Namespace) -> int | None:
    """Run SageMaker or TPU launches; None for a launch on this machine's CPUs/GPUs."""
    path = _config_path(args)
    config = load_config_from_file(path) if path is not None else None
    if config is not None and enum_value(config.compute_environment) == "AMAZON_SAGEMAKER":
        sagemaker_launcher(config, args)
        return 0
    values = config.to_dict() if config is not None else {}
    if not (getattr(args, "tpu", None) or values.get("distributed_type") == "XLA"):
        return None
    for key in (*_TPU_KEYS, "main_training_function", "downcast_bf16"):
        if getattr(args, key, None) is None:
            setattr(args, key, values.get(key))
    if args.tpu_use_cluster:
        tpu_pod_launcher(args)
    else:
        tpu_launcher(args)
    return 0


def _full_env(args: argparse.Namespace) -> tuple[LaunchPlan, dict[str, str]]:
    plan, env = _plan_and_env(args)
    return plan, {**envvars.snapshot(), **env}


def _with_defaults(args: argparse.Namespace, script: str = "") -> argparse.Namespace:
    """`args` with the attributes `plan_from_args` reads filled in (for hand-made namespaces).

    `script` stands in when `args` names no training script (for helpers that need none).
    """
    script = getattr(args, "training_script", None) or script
    defaults = vars(launch_command_parser().parse_args([script]))
    return argparse.Namespace(**{**defaults, **vars(args)})


# Config-file sections whose keys are launch flags, and the engine each belongs to (None: always).
_CONFIG_SECTIONS = {
    "dynamo_config": None,
    "fsdp_config": "use_fsdp",
    "deepspeed_config": "use_deepspeed",
    "megatron_lm_config": "use_megatron_lm",
    "parallelism_config": "use_parallelism_config",
}
_ENGINE_TYPES = {"FSDP": "use_fsdp", "DEEPSPEED": "use_deepspeed", "MEGATRON_LM": "use_megatron_lm"}


def _validate_launch_command(
    args: argparse.Namespace,
) -> tuple[argparse.Namespace, dict[str, Any] | None, bool]:
    """Fill, in place, each flag that was not given from the config file (Accelerate's name).

    Returns ``(args, the config file as a dict or None, whether mixed_precision came from the
    config file)``. ``hasten launch`` resolves the same precedence itself (`plan_from_args`);
    this is for code that reads a launch's effective flags. A section's keys (``fsdp_config``,
    ``deepspeed_config``, ...) are taken only when that engine is on, since an ``--fsdp_*`` flag
    switches FSDP on in hasten.
    """
    for name, value in vars(_with_defaults(args)).items():
        if not hasattr(args, name):
            setattr(args, name, value)
    config = load_launch_config(args.config_file)
    if config is None:
        return args, None, False
    engine = _ENGINE_TYPES.get(str(enum_value(config.get("distributed_type", "NO"))).upper())
    values = {k: v for k, v in config.items() if not isinstance(v, dict)}
    for section, switch in _CONFIG_SECTIONS.items():
        if switch is None or switch == engine or getattr(args, switch, None):
            values.update(config.get(section) or {})
    mixed_precision_from_config = False
    for name, value in values.items():
        if value is not None and hasattr(args, name) and getattr(args, name) is None:
            setattr(args, name, value)
            mixed_precision_from_config |= name == "mixed_precision"
    if engine is not None and getattr(args, engine) is None:
        setattr(args, engine, True)
    return args, config, mixed_precision_from_config


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Return the command and the full environment ``hasten launch`` runs one process with."""
    plan, env = _full_env(_with_defaults(args))
    return script_command(plan), env


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """Return the environment ``hasten launch`` gives its elastic workers (before their ranks).

    torch's agent adds ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT`` to it
    for each worker. As Accelerate's, it records the rendezvous port in ``args.master_port``
    (a free one when ``main_process_port`` is 0 or taken on a single machine); `args` needs no
    training script.
    """
    plan, env = _full_env(_with_defaults(args, script="<training script>"))
    args.master_port = str(choose_port(plan))
    return env


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The ``deepspeed`` runner command for a multi-node launch, and the workers' environment.

    With one machine or ``--deepspeed_multinode_launcher standard`` the command is the one
    ``hasten launch`` runs itself (each worker through torch elastic).
    """
    plan, env = _full_env(_with_defaults(args))
    if not uses_deepspeed_runner(plan, getattr(args, "deepspeed_multinode_launcher", None)):
        return script_command(plan), env
    cmd = deepspeed_runner_command(
        plan,
        launcher=args.deepspeed_multinode_launcher,
        hostfile=args.deepspeed_hostfile,
        exclusion_filter=args.deepspeed_exclusion_filter,
        inclusion_filter=args.deepspeed_inclusion_filter,
    )
    return cmd, env


def deepspeed_launcher(args: argparse.Namespace) -> int:
    """Start a multi-node DeepSpeed job through DeepSpeed's runner; return its exit code.

    The hasten settings reach every host through ``.deepspeed_env`` in the working directory.
    """
    plan, own = _plan_and_env(args)
    if not uses_deepspeed_runner(plan, args.deepspeed_multinode_launcher):
        return run_launch(args)
    cmd, env = prepare_deepspeed_cmd_env(args)
    write_deepspeed_env(env, sorted(own), Path.cwd())
    return subprocess.run(cmd, env=env, check=False).returncode


def simple_launcher(args: argparse.Namespace) -> None:
    """Run the script once, as a child process, with the launch's environment.

    Raises:
        subprocess.CalledProcessError: the script exited with a non-zero code.
    """
    command, env = prepare_simple_launcher_cmd_env(args)
    process = subprocess.run(command, env=env, check=False)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(returncode=process.returncode, cmd=command)


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """Run the launch's workers under torch's elastic agent (even a single one).

    Raises:
        subprocess.CalledProcessError: a worker failed (the failure report is printed above).
    """
    plan, env = _plan_and_env(_with_defaults(args))
    code = run_workers(plan, env)
    if code != 0:
        raise subprocess.CalledProcessError(returncode=code, cmd=[plan.script, *plan.script_args])


def tpu_launcher(args: argparse.Namespace) -> None:
    """Start ``args.main_training_function`` of the script on this host's TPU cores.

    Raises:
        ValueError: ``--no_python`` (the TPU launcher imports the script), or no such function.
        ImportError: torch_xla is not installed.
    """
    from hasten.launchers import xla  # deferred: imports torch

    if getattr(args, "no_python", False):
        raise ValueError("--no_python cannot be used with --tpu: the TPU launcher imports it.")
    _, env = xla.prepare_tpu(args, {})
    function = xla.load_training_function(
        args.training_script,
        getattr(args, "main_training_function", None) or "main",
        module=bool(getattr(args, "module", False)),
    )
    sys.argv = [args.training_script, *args.training_script_args]
    xla.run_on_tpu_host(function, getattr(args, "num_processes", None), env)


def tpu_pod_launcher(args: argparse.Namespace) -> None:
    """Run this ``hasten launch`` on every worker of the TPU pod ``args.tpu_name`` via gcloud.

    Raises:
        ValueError: no pod name or zone.
        subprocess.CalledProcessError: gcloud failed.
    """
    from hasten.launchers import xla  # deferred: imports torch

    args, env = xla.prepare_tpu(args, {}, pod=True)
    command = pod_launch_command(args, env)
    if getattr(args, "debug", False):
        print(f"Running {' '.join(command)}")
    subprocess.run(command, check=True)


def sagemaker_launcher(sagemaker_config: Any, args: argparse.Namespace) -> None:
    """Start the script as an Amazon SageMaker training job (needs the ``sagemaker`` SDK).

    Raises:
        ImportError: the SDK is not installed (``pip install 'hasten[sagemaker]'``).
        ValueError / OSError: see `hasten.launchers.sagemaker.prepare_sagemager_args_inputs`.
    """
    run_sagemaker(sagemaker_config, args)


if __name__ == "__main__":
    sys.exit(main())
