"""config.megatron: MegatronLMPlugin env defaults, validation and Megatron argument building."""

from __future__ import annotations

import pytest
import torch

from hasten.config.envvars import read_prefixed
from hasten.config.megatron import MegatronLMPlugin


@pytest.fixture(autouse=True)
def _no_megatron_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in read_prefixed("MEGATRON_LM_"):
        monkeypatch.delenv(name)


def test_defaults() -> None:
    plugin = MegatronLMPlugin()
    assert (plugin.tp_degree, plugin.pp_degree, plugin.num_micro_batches) == (1, 1, 1)
    assert plugin.gradient_clipping == 1.0
    assert (plugin.recompute_granularity, plugin.recompute_method) == ("full", "uniform")
    assert plugin.attention_softmax_in_fp32 is True
    assert plugin.context_parallel_size == 1
    assert plugin.DDP_impl == "torch"
    args = plugin.megatron_lm_default_args
    assert args["tensor_model_parallel_size"] == 1
    assert args["clip_grad"] == 1.0
    assert args["eval_iters"] == 100


def test_env_defaults_and_local_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGATRON_LM_TP_DEGREE", "2")
    monkeypatch.setenv("MEGATRON_LM_PP_DEGREE", "4")
    monkeypatch.setenv("MEGATRON_LM_SEQUENCE_PARALLELISM", "true")
    monkeypatch.setenv("MEGATRON_LM_GRADIENT_CLIPPING", "0.5")
    plugin = MegatronLMPlugin()
    assert (plugin.tp_degree, plugin.pp_degree, plugin.sequence_parallelism) == (2, 4, True)
    assert plugin.DDP_impl == "local"
    assert plugin.megatron_lm_default_args["sequence_parallel"] is True
    assert plugin.megatron_lm_default_args["clip_grad"] == 0.5


def test_consumed_samples_padded_and_other_args_merged() -> None:
    plugin = MegatronLMPlugin(
        consumed_samples=[5], other_megatron_args={"seed": 7}, recompute_activations=True
    )
    assert plugin.consumed_samples == [5, 0, 0]
    assert plugin.megatron_lm_default_args["seed"] == 7
    assert plugin.megatron_lm_default_args["recompute_granularity"] == "selective"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"tp_degree": 0}, r"tp_degree=0\) must be an int >= 1"),
        ({"num_micro_batches": 1.5}, r"num_micro_batches=1.5\) must be an int >= 1"),
        (
            {"lr_decay_style": "step"},
            r"lr_decay_style='step'\) must be one of \['constant', 'linear', 'cosine'\]",
        ),
        ({"weight_decay_incr_style": "exp"}, r"weight_decay_incr_style='exp'\)"),
        (
            {"recompute_granularity": "some"},
            r"recompute_granularity='some'\) must be one of \['full', 'selective'\]",
        ),
        ({"recompute_method": "random"}, r"recompute_method='random'\)"),
        ({"hidden_dropout": 1.5}, r"hidden_dropout=1.5\) must be in \[0, 1\]"),
        ({"consumed_samples": [1, 2, 3, 4]}, r"at most 3"),
    ],
)
def test_validation(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MegatronLMPlugin(**options)


def test_set_mixed_precision() -> None:
    plugin = MegatronLMPlugin()
    plugin.set_mixed_precision("fp16")
    assert plugin.megatron_lm_default_args["fp16"] is True
    plugin.set_mixed_precision("bf16")
    assert plugin.megatron_lm_default_args["bf16"] is True
    assert plugin.megatron_lm_default_args["DDP_impl"] == "local"


def test_set_training_args() -> None:
    plugin = MegatronLMPlugin(num_micro_batches=4)
    plugin.set_training_args(micro_batch_size=2, dp_degree=3)
    assert plugin.global_batch_size == 24
    assert plugin.megatron_lm_default_args["global_batch_size"] == 24


def test_set_optimizer_type() -> None:
    params = [torch.nn.Parameter(torch.zeros(1))]
    plugin = MegatronLMPlugin()
    plugin.set_optimizer_type(torch.optim.AdamW(params, lr=0.01, betas=(0.8, 0.9), eps=1e-6))
    args = plugin.megatron_lm_default_args
    assert (args["optimizer"], args["adam_beta1"], args["adam_eps"], args["lr"]) == (
        "adam",
        0.8,
        1e-6,
        0.01,
    )
    plugin.set_optimizer_type(torch.optim.SGD(params, lr=0.1, momentum=0.5))
    assert (args["optimizer"], args["sgd_momentum"]) == ("sgd", 0.5)
    with pytest.raises(ValueError, match="got Adagrad; use torch.optim.AdamW"):
        plugin.set_optimizer_type(torch.optim.Adagrad(params))


def test_set_scheduler_args() -> None:
    class Scheduler:
        total_num_steps = 100
        warmup_num_steps = 10

    plugin = MegatronLMPlugin(train_samples=50)
    plugin.set_training_args(micro_batch_size=1, dp_degree=2)
    with pytest.warns(UserWarning, match="train_samples is ignored"):
        plugin.set_scheduler_args(Scheduler())
    args = plugin.megatron_lm_default_args
    assert (args["train_iters"], args["lr_warmup_iters"], args["train_samples"]) == (50, 5, None)
    assert args["lr_decay_style"] == "linear"


def test_launcher_round_trip_through_environment_variables() -> None:
    from hasten.core.environment import patch_environment

    plugin = MegatronLMPlugin(
        tp_degree=2,
        pp_degree=2,
        sequence_parallelism=True,
        recompute_method="block",
        hidden_dropout=0.1,
    )
    written = {  # what `hasten launch --megatron_lm_tp_degree 2 ...` gives the workers
        "MEGATRON_LM_TP_DEGREE": "2",
        "MEGATRON_LM_PP_DEGREE": "2",
        "MEGATRON_LM_SEQUENCE_PARALLELISM": "true",
        "MEGATRON_LM_RECOMPUTE_METHOD": "block",
        "MEGATRON_LM_HIDDEN_DROPOUT": "0.1",
    }
    with patch_environment(**written):
        again = MegatronLMPlugin()
    assert again.megatron_lm_default_args == plugin.megatron_lm_default_args
