"""The interactive ``hasten config`` questionnaire: ask, validate each answer, build a config.

Questions read plain lines from stdin (`input`), so scripts and tests can answer by piping
text; an empty answer takes the default shown in brackets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hasten.commands.config.config_args import ClusterConfig
from hasten.commands.config.config_utils import DYNAMO_BACKENDS
from hasten.config.enums import DistributedType, PrecisionType

__all__ = ["ask", "ask_choice", "ask_yes_no", "get_cluster_input"]

T = TypeVar("T")

# Menu of machine types: (label, distributed_type written to the file).
_MACHINES: tuple[tuple[str, str], ...] = (
    ("No distributed training", DistributedType.NO.value),
    ("multi-CPU", DistributedType.MULTI_CPU.value),
    ("multi-GPU", DistributedType.MULTI_GPU.value),
    ("multi-XPU", DistributedType.MULTI_XPU.value),
    ("multi-NPU", DistributedType.MULTI_NPU.value),
    ("TPU", DistributedType.XLA.value),
)
_MAX_TRIES = 5
# Machine types whose processes each drive one accelerator.
_ACCELERATED = (
    DistributedType.MULTI_GPU.value,
    DistributedType.MULTI_XPU.value,
    DistributedType.MULTI_NPU.value,
)


def _read(prompt: str) -> str:
    try:
        return input(prompt).strip()
    except EOFError:
        raise ValueError(
            f"No answer on stdin for {prompt.strip()!r}. Run `hasten config` in a terminal, "
            "or use `hasten config default` for a non-interactive config."
        ) from None


def ask(prompt: str, convert: Callable[[str], T], default: T, shown: str | None = None) -> T:
    """Ask `prompt` until `convert` accepts the answer; empty means `default`.

    Args:
        prompt: the question.
        convert: turns the answer into a value; raises ValueError to ask again.
        default: the value of an empty answer.
        shown: how the default is displayed (default: ``str(default)``).

    Raises:
        ValueError: stdin ended, or five answers in a row were invalid.
    """
    for _ in range(_MAX_TRIES):
        answer = _read(f"{prompt} [{default if shown is None else shown}]: ")
        if not answer:
            return default
        try:
            return convert(answer)
        except ValueError as err:
            print(f"  Invalid answer {answer!r}: {err}")
    raise ValueError(f"Too many invalid answers to {prompt!r}; run `hasten config` again.")


def _to_bool(answer: str) -> bool:
    lowered = answer.lower()
    if lowered in ("y", "yes", "true", "1"):
        return True
    if lowered in ("n", "no", "false", "0"):
        return False
    raise ValueError("answer yes or no")


def ask_yes_no(prompt: str, default: bool = False) -> bool:
    """Ask a yes/no question."""
    return ask(f"{prompt} (yes/no)", _to_bool, default, "yes" if default else "no")


def ask_choice(prompt: str, choices: Sequence[str], default: int = 0) -> int:
    """Show numbered `choices`; return the index picked by number or by name."""
    print(prompt)
    for index, label in enumerate(choices):
        print(f"  [{index}] {label}")
    lowered = [choice.lower() for choice in choices]

    def convert(answer: str) -> int:
        if answer.isdigit() and int(answer) < len(choices):
            return int(answer)
        if answer.lower() in lowered:
            return lowered.index(answer.lower())
        raise ValueError(f"pick a number in 0..{len(choices) - 1} or one of {list(choices)}")

    return ask("Your choice", convert, default)


def _positive_int(answer: str) -> int:
    value = int(answer)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _port(answer: str) -> int:
    value = int(answer)
    if not 0 <= value <= 65535:
        raise ValueError("must be in 0..65535")
    return value


def _ask_machines(config: dict[str, Any]) -> None:
    """Ask the multi-machine questions (only asked for distributed machine types)."""
    config["num_machines"] = ask("How many machines will you use?", _positive_int, 1)
    if config["num_machines"] == 1:
        return
    count = config["num_machines"]

    def rank(answer: str) -> int:
        value = int(answer)
        if not 0 <= value < count:
            raise ValueError(f"must be in 0..{count - 1}")
        return value

    config["machine_rank"] = ask("What is the rank of this machine?", rank, 0)
    config["main_process_ip"] = ask("What is the IP address of machine 0?", str, "127.0.0.1")
    config["main_process_port"] = ask("What port will machine 0 listen on?", _port, 29500)
    config["same_network"] = ask_yes_no("Are all machines on the same local network?", True)
    backends = ["static", "c10d"]
    config["rdzv_backend"] = backends[ask_choice("Which rendezvous backend?", backends)]


def _ask_dynamo(config: dict[str, Any]) -> None:
    if not ask_yes_no("Do you wish to optimize your script with torch.compile?"):
        return
    backends = DYNAMO_BACKENDS
    default = backends.index("INDUCTOR")
    backend = backends[ask_choice("Which torch.compile backend?", backends, default)]
    config["dynamo_config"] = {
        "dynamo_backend": backend,
        "dynamo_mode": ask("Which compile mode?", str, "default"),
        "dynamo_use_fullgraph": ask_yes_no("Compile the whole model as one graph (fullgraph)?"),
        "dynamo_use_dynamic": ask_yes_no("Enable dynamic shapes?"),
    }


def _ask_deepspeed(config: dict[str, Any]) -> None:
    """Ask the DeepSpeed questions; the answers become ``deepspeed_config``."""
    config["distributed_type"] = DistributedType.DEEPSPEED.value
    stages = ["0", "1", "2", "3"]
    stage = int(stages[ask_choice("Which ZeRO stage?", stages, default=2)])
    devices = ["none", "cpu", "nvme"]
    section: dict[str, Any] = {
        "zero_stage": stage,
        "offload_optimizer_device": devices[ask_choice("Offload optimizer states to?", devices)],
        "gradient_accumulation_steps": ask(
            "How many gradient accumulation steps?", _positive_int, 1
        ),
    }
    if stage == 3:
        section["offload_param_device"] = devices[ask_choice("Offload parameters to?", devices)]
        section["zero3_init_flag"] = ask_yes_no("Build the model already sharded (zero3_init)?")
        section["zero3_save_16bit_model"] = ask_yes_no("Save a gathered 16-bit model?")
    config["deepspeed_config"] = section


def _ask_fsdp(config: dict[str, Any]) -> None:
    """Ask the FSDP questions; the answers become ``fsdp_config``."""
    config["distributed_type"] = DistributedType.FSDP.value
    version = 2 if ask_choice("Which FSDP version?", ["1", "2"], default=1) == 1 else 1
    policies = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
    section: dict[str, Any] = {"fsdp_version": version}
    if version == 2:
        section["fsdp_reshard_after_forward"] = ask_yes_no(
            "Reshard parameters after forward (like FULL_SHARD; no: like SHARD_GRAD_OP)?", True
        )
    else:
        strategies = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
        section["fsdp_reshard_after_forward"] = strategies[
            ask_choice("Which sharding strategy?", strategies)
        ]
    section["fsdp_offload_params"] = ask_yes_no("Offload parameters to CPU?")
    section["fsdp_auto_wrap_policy"] = policies[ask_choice("Which auto-wrap policy?", policies)]
    if section["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP":
        section["fsdp_transformer_layer_cls_to_wrap"] = ask(
            "Which layer classes to wrap (comma-separated; empty = the model's _no_split_modules)?",
            str,
            "",
        )
    elif section["fsdp_auto_wrap_policy"] == "SIZE_BASED_WRAP":
        section["fsdp_min_num_params"] = ask(
            "Minimum parameters of a wrapped module?", _positive_int, 100_000_000
        )
    section["fsdp_cpu_ram_efficient_loading"] = ask_yes_no(
        "Load the weights on the main process only (cpu_ram_efficient_loading)?"
    )
    kinds = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
    section["fsdp_state_dict_type"] = kinds[ask_choice("Which state dict type?", kinds)]
    section["fsdp_activation_checkpointing"] = ask_yes_no("Use activation checkpointing?")
    config["fsdp_config"] = {k: v for k, v in section.items() if v != ""}


def _ask_engine(config: dict[str, Any]) -> None:
    """On accelerators, offer DeepSpeed or FSDP instead of plain data parallelism."""
    if ask_yes_no("Do you want to use DeepSpeed?"):
        _ask_deepspeed(config)
    elif ask_yes_no("Do you want to use FullyShardedDataParallel (FSDP)?"):
        _ask_fsdp(config)


def _tpu_config() -> ClusterConfig:
    """Ask the TPU questions: the function to start, bf16, and the pod (name, zone, setup)."""
    config: dict[str, Any] = {
        "main_training_function": ask(
            "Which function of your script should each TPU core run?", str, "main"
        )
    }
    if ask_yes_no("Are you using a TPU pod (several TPU VMs)?"):
        config["tpu_use_cluster"] = True
        config["tpu_name"] = ask("What is the name of the TPU?", str, "")
        config["tpu_zone"] = ask("What is the zone of the TPU?", str, "")
        config["tpu_use_sudo"] = ask_yes_no("Run the commands on the pod with sudo?")
        commands = ask(
            "Commands to run on each worker first (separated by ';', empty = none)", str, ""
        )
        parts = [part.strip() for part in commands.split(";") if part.strip()]
        if parts:
            config["commands"] = parts
    precision = ["no", "bf16"][ask_choice("Mixed precision?", ["no", "bf16"])]
    if precision == "bf16":
        config["downcast_bf16"] = ask_yes_no("Also store float32 as bf16 (XLA_DOWNCAST_BF16)?")
    return ClusterConfig(
        compute_environment="LOCAL_MACHINE",
        distributed_type=DistributedType.XLA.value,
        mixed_precision=precision,
        use_cpu=False,
        debug=False,
        num_processes=8,
        **config,
    )


def get_cluster_input() -> ClusterConfig:
    """Ask the questionnaire on stdin and return the validated config."""
    labels = [label for label, _ in _MACHINES]
    machine = _MACHINES[ask_choice("Which type of machine are you using?", labels)][1]
    if machine == DistributedType.XLA.value:
        return _tpu_config()
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": machine,
    }
    distributed = machine != DistributedType.NO.value
    if distributed:
        _ask_machines(config)
        config["debug"] = ask_yes_no("Check distributed operations for errors (debug mode)?")
    config["use_cpu"] = machine == DistributedType.MULTI_CPU.value or (
        not distributed and ask_yes_no("Run on CPU only, even if a GPU is available?")
    )
    _ask_dynamo(config)
    if machine in _ACCELERATED:
        _ask_engine(config)
    default_processes = 2 if distributed else 1
    config["num_processes"] = ask(
        "How many processes in total (over all machines)?", _positive_int, default_processes
    )
    if machine in _ACCELERATED:
        config["gpu_ids"] = ask("Which device ids should be used (comma-separated)?", str, "all")
    precisions = PrecisionType.list()
    config["mixed_precision"] = precisions[ask_choice("Mixed precision?", precisions)]
    if config["mixed_precision"] == "fp8":
        backends = ["AO", "TE", "MSAMP"]
        label = "Which fp8 backend (AO: torchao, TE: TransformerEngine, MSAMP: MS-AMP)?"
        config["fp8_config"] = {"backend": backends[ask_choice(label, backends)]}
    return ClusterConfig(
        compute_environment=config.pop("compute_environment"),
        distributed_type=config.pop("distributed_type"),
        mixed_precision=config.pop("mixed_precision"),
        use_cpu=config.pop("use_cpu"),
        debug=config.pop("debug", False),
        **config,
    )
