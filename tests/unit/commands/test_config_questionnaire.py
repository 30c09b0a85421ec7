from __future__ import annotations

import io
from pathlib import Path

import pytest

from hasten.commands.config.questionnaire import ask, ask_choice, ask_yes_no, get_cluster_input


def _answers(monkeypatch: pytest.MonkeyPatch, *lines: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines)))


def test_single_cpu_config_from_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # machine type, cpu only, torch.compile, processes, precision
    _answers(monkeypatch, "0", "yes", "no", "", "bf16")
    config = get_cluster_input()
    assert config.distributed_type == "NO"
    assert config.use_cpu is True
    assert config.num_processes == 1
    assert config.mixed_precision == "bf16"
    assert config.dynamo_config == {}


def test_multi_machine_gpu_config(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(
        monkeypatch,
        "multi-GPU",  # machine type by name
        "2",
        "1",
        "10.0.0.5",
        "29600",
        "yes",
        "c10d",  # machines, rank, ip, port, network, rdzv
        "yes",  # debug
        "yes",
        "",
        "",
        "no",
        "yes",  # torch.compile: yes, INDUCTOR, default mode, fullgraph, dynamic
        "no",
        "no",  # neither DeepSpeed nor FSDP
        "8",
        "0,1,2,3",  # processes, gpu ids
        "2",  # precision fp16
    )
    config = get_cluster_input()
    assert config.distributed_type == "MULTI_GPU"
    assert (config.num_machines, config.machine_rank) == (2, 1)
    assert (config.main_process_ip, config.main_process_port) == ("10.0.0.5", 29600)
    assert config.rdzv_backend == "c10d"
    assert config.debug is True
    assert config.use_cpu is False
    assert config.dynamo_config == {
        "dynamo_backend": "INDUCTOR",
        "dynamo_mode": "default",
        "dynamo_use_fullgraph": False,
        "dynamo_use_dynamic": True,
    }
    assert (config.num_processes, config.gpu_ids, config.mixed_precision) == (8, "0,1,2,3", "fp16")


def test_invalid_answers_are_asked_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _answers(monkeypatch, "zero", "-1", "3")
    assert ask("How many?", lambda s: int(s) if int(s) > 0 else int("x"), 1) == 3
    assert capsys.readouterr().out.count("Invalid answer") == 2


def test_too_many_invalid_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, *["maybe"] * 5)
    with pytest.raises(ValueError, match="Too many invalid answers"):
        ask_yes_no("Sure?")


def test_closed_stdin_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch)
    with pytest.raises(ValueError, match="No answer on stdin"):
        ask_choice("Pick", ["a", "b"])


def test_choice_by_number_or_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, "B", "0", "")
    assert ask_choice("Pick", ["a", "b"]) == 1
    assert ask_choice("Pick", ["a", "b"]) == 0
    assert ask_choice("Pick", ["a", "b"], default=1) == 1


def test_deepspeed_answers_fill_its_section(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(
        monkeypatch,
        "multi-GPU",
        "1",
        "no",  # machine type, one machine, no debug
        "no",  # torch.compile
        "yes",
        "3",
        "cpu",
        "4",
        "none",
        "yes",
        "no",  # DeepSpeed ZeRO-3 answers
        "2",
        "",
        "bf16",  # processes, gpu ids, precision
    )
    config = get_cluster_input()
    assert config.distributed_type == "DEEPSPEED"
    assert config.deepspeed_config == {
        "zero_stage": 3,
        "offload_optimizer_device": "cpu",
        "gradient_accumulation_steps": 4,
        "offload_param_device": "none",
        "zero3_init_flag": True,
        "zero3_save_16bit_model": False,
    }


def test_fsdp_answers_fill_its_section(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(
        monkeypatch,
        "multi-GPU",
        "1",
        "no",
        "no",
        "no",
        "yes",  # not DeepSpeed, FSDP
        "",  # version 2
        "",  # reshard after forward: yes
        "yes",
        "",
        "Block,Head",
        "",  # cpu_ram_efficient_loading: no
        "FULL_STATE_DICT",
        "no",
        "2",
        "",
        "no",
    )
    config = get_cluster_input()
    assert config.distributed_type == "FSDP"
    assert config.fsdp_config == {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": True,
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_offload_params": True,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "Block,Head",
        "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_activation_checkpointing": False,
    }


def test_fsdp1_size_based_wrap_asks_the_strategy_and_minimum_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hasten.launchers.env import plugin_env

    fsdp1 = ("0", "SHARD_GRAD_OP", "no", "SIZE_BASED_WRAP", "1000", "no", "", "no")
    _answers(monkeypatch, "multi-GPU", "1", "no", "no", "no", "yes", *fsdp1, "2", "", "no")
    config = get_cluster_input()
    assert config.fsdp_config == {
        "fsdp_version": 1,
        "fsdp_reshard_after_forward": "SHARD_GRAD_OP",
        "fsdp_offload_params": False,
        "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
        "fsdp_min_num_params": 1000,
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_activation_checkpointing": False,
    }
    env = plugin_env({"distributed_type": "FSDP", "fsdp_config": config.fsdp_config})
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == "SHARD_GRAD_OP"
    assert env["FSDP_MIN_NUM_PARAMS"] == "1000"


def test_tpu_pod_questions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # TPU; function train; a pod named p in zone z, sudo, two setup commands; bf16, downcast.
    answers = "5\ntrain\nyes\np\nz\nyes\npip install x; echo ok\n1\nyes\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(answers))
    config = get_cluster_input()
    assert config.distributed_type == "XLA" and config.mixed_precision == "bf16"
    assert (config.main_training_function, config.tpu_name, config.tpu_zone) == ("train", "p", "z")
    assert config.tpu_use_cluster and config.tpu_use_sudo and config.downcast_bf16
    assert config.commands == ["pip install x", "echo ok"]
    from hasten.commands import tpu

    path = tmp_path / "tpu.yaml"
    config.save(str(path))
    args = tpu.tpu_command_parser().parse_args(["--config_file", str(path), "--debug"])
    assert tpu.remote_command(tpu._fill_from_config(args) or args) == (
        "cd /usr/share; pip install x; echo ok"
    )


def test_fp8_asks_for_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # machine type, cpu only, torch.compile, processes, precision, fp8 backend
    _answers(monkeypatch, "0", "yes", "no", "", "fp8", "TE")
    config = get_cluster_input()
    assert config.mixed_precision == "fp8"
    assert config.fp8_config == {"backend": "TE"}
