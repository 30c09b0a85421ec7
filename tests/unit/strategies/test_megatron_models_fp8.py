"""Megatron-LM's BERT / T5 models and fp8, on CPU: config mapping, megatron-core faked at its seam.

The builders in `strategies/megatron/models.py` are run against fake megatron-core modules
that record what they were given; fp8 is checked at Accelerator() (Transformer Engine, the
recipe's backend, the hardware) and mapped to TransformerConfig's fp8 fields.
"""

from __future__ import annotations

import sys
import types
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from hasten import Accelerator
from hasten.config.kwargs import AORecipeKwargs, TERecipeKwargs
from hasten.config.megatron import MegatronLMPlugin
from hasten.core.imports import is_package_available
from hasten.strategies.megatron import MegatronStrategy
from hasten.strategies.megatron import args as margs
from hasten.strategies.megatron import strategy as mstrategy


class MegatronBertForMaskedLM(nn.Module):
    """Stands for a transformers Megatron-BERT: only the class name and ``config`` are read."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(
            model_type="megatron-bert", num_hidden_layers=2, hidden_size=64,
            num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
            type_vocab_size=2, num_labels=2, vocab_size=300, return_dict=True, eos_token_id=None,
        )  # fmt: skip


class MegatronBertForPreTraining(MegatronBertForMaskedLM):
    pass


class MegatronBertForSequenceClassification(MegatronBertForMaskedLM):
    pass


class T5ForConditionalGeneration(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(
            model_type="t5", num_layers=2, num_decoder_layers=3, d_model=32, d_ff=96, d_kv=16,
            num_heads=4, vocab_size=100, decoder_start_token_id=0, return_dict=True,
            eos_token_id=1,
        )  # fmt: skip


def run_args(model: nn.Module, mixed_precision: str = "bf16", **plugin_kwargs: Any) -> Any:
    plugin = MegatronLMPlugin(train_iters=4, **plugin_kwargs)  # type: ignore[arg-type]
    plugin.set_training_args(micro_batch_size=2, dp_degree=1)
    batch = {"input_ids": torch.zeros(2, 12, dtype=torch.long)}
    if isinstance(model, T5ForConditionalGeneration):
        batch["labels"] = torch.zeros(2, 6, dtype=torch.long)
    plugin.set_network_size_args(model, batch)
    return margs.megatron_args(plugin, world_size=1, mixed_precision=mixed_precision)


# ---------------------------------------------------------------- BERT and T5 arguments


def test_bert_arguments_from_the_hf_config() -> None:
    args = run_args(MegatronBertForMaskedLM())
    assert (args.model_type_name, args.pretraining_flag, args.bert_binary_head) == (
        "bert",
        True,
        False,
    )
    assert (args.ffn_hidden_size, args.num_tokentypes, args.seq_length) == (128, 2, 12)
    kwargs = margs.bert_model_kwargs(args)
    assert kwargs["vocab_size"] == 384 and kwargs["max_sequence_length"] == 64
    assert kwargs["num_tokentypes"] == 2 and kwargs["add_binary_head"] is False
    assert kwargs["share_embeddings_and_output_weights"] is True
    # a pretraining model has the next-sentence head: Megatron's binary head
    assert margs.bert_model_kwargs(run_args(MegatronBertForPreTraining()))["add_binary_head"]
    # the user's choice beats the default
    explicit = run_args(
        MegatronBertForPreTraining(), other_megatron_args={"bert_binary_head": False}
    )
    assert margs.bert_model_kwargs(explicit)["add_binary_head"] is False


def test_bert_classification_has_no_megatron_core_model() -> None:
    args = run_args(MegatronBertForSequenceClassification())
    with pytest.raises(NotImplementedError, match=r"custom_model_provider_function"):
        margs.bert_model_kwargs(args)


def test_t5_arguments_from_the_hf_config() -> None:
    args = run_args(T5ForConditionalGeneration())
    assert margs.t5_layer_counts(args) == (2, 3)
    assert (args.encoder_seq_length, args.decoder_seq_length) == (12, 6)
    config = margs.transformer_config_kwargs(args)
    assert (config["ffn_hidden_size"], config["kv_channels"]) == (96, 16)
    kwargs = margs.t5_model_kwargs(args)
    assert kwargs["vocab_size"] == 128 and kwargs["position_embedding_type"] == "learned_absolute"
    assert kwargs["relative_attention_num_buckets"] == 32
    assert args.decoder_start_token_id == 0


# ---------------------------------------------------------------- builders against fake megatron-core


class Recorder:
    """A fake megatron-core class: keeps its arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


class FakeConfig(Recorder):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = kwargs["num_layers"]
        self.num_moe_experts = kwargs.get("num_moe_experts")
        self.normalization = kwargs.get("normalization")


def fake_megatron(monkeypatch: pytest.MonkeyPatch, modules: dict[str, dict[str, Any]]) -> None:
    """Put fake megatron-core modules (and their parent packages) into sys.modules."""
    for name, attributes in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            path = ".".join(parts[:i])
            if path not in sys.modules or not getattr(sys.modules[path], "_fake", False):
                module = types.ModuleType(path)
                module._fake = True  # type: ignore[attr-defined]
                monkeypatch.setitem(sys.modules, path, module)
            if i > 1:
                monkeypatch.setattr(
                    sys.modules[".".join(parts[: i - 1])],
                    parts[i - 1],
                    sys.modules[path],
                    raising=False,
                )
        for key, value in attributes.items():
            setattr(sys.modules[name], key, value)


@pytest.fixture
def fake_mcore(monkeypatch: pytest.MonkeyPatch) -> dict:
    block = lambda kind: lambda n: SimpleNamespace(kind=kind, layers=n, layer_norm=None)  # noqa: E731
    specs = {
        "get_t5_encoder_with_local_block_spec": block("local encoder"),
        "get_t5_decoder_with_local_block_spec": block("local decoder"),
        "get_t5_encoder_with_transformer_engine_block_spec": block("te encoder"),
        "get_t5_decoder_with_transformer_engine_block_spec": block("te decoder"),
        "LNImpl": "torch norm",
    }
    fake_megatron(
        monkeypatch,
        {
            "megatron.core.transformer.transformer_config": {"TransformerConfig": FakeConfig},
            "megatron.core.models.T5.t5_model": {"T5Model": Recorder},
            "megatron.core.models.T5.t5_spec": specs,
            "megatron.core.models.bert.bert_model": {"BertModel": Recorder},
            "megatron.core.models.bert.bert_layer_specs": {
                "bert_layer_local_spec": "bert local",
                "get_bert_layer_with_transformer_engine_spec": lambda: "bert te",
            },
        },
    )
    return specs


def test_t5_builder_gives_megatron_core_two_configs(fake_mcore: dict) -> None:
    from hasten.strategies.megatron.models import MODEL_BUILDERS

    args = run_args(T5ForConditionalGeneration())
    model = MODEL_BUILDERS["t5"](args, pre_process=True, post_process=False, add_decoder=False)
    kwargs = model.kwargs
    assert kwargs["config"].num_layers == 3 and kwargs["encoder_config"].num_layers == 2
    assert kwargs["transformer_encoder_layer_spec"].kind == "local encoder"
    # the local block specs lack a final norm without Transformer Engine: a torch one is set
    assert kwargs["transformer_decoder_layer_spec"].layer_norm == "torch norm"
    assert (kwargs["post_process"], kwargs["add_decoder"], kwargs["vocab_size"]) == (
        False,
        False,
        128,
    )


def test_bert_builder_and_fp8_layers(fake_mcore: dict) -> None:
    from hasten.strategies.megatron.models import MODEL_BUILDERS

    model = MODEL_BUILDERS["bert"](run_args(MegatronBertForMaskedLM()), True, True)
    assert model.kwargs["transformer_layer_spec"] == "bert local"
    assert model.kwargs["num_tokentypes"] == 2 and model.kwargs["config"].kwargs["bf16"]
    args = run_args(MegatronBertForMaskedLM())
    args.fp8 = "hybrid"  # fp8 runs in Transformer Engine layers
    assert MODEL_BUILDERS["bert"](args, True, True).kwargs["transformer_layer_spec"] == "bert te"
    args = run_args(T5ForConditionalGeneration())
    args.fp8 = "e4m3"
    t5 = MODEL_BUILDERS["t5"](args, True, True).kwargs
    assert t5["transformer_encoder_layer_spec"].kind == "te encoder"
    assert t5["config"].kwargs["fp8"] == "e4m3"


def test_model_provider_picks_the_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.strategies.megatron import engine, models

    monkeypatch.setattr(engine, "_mcore", lambda: None)
    monkeypatch.setitem(models.MODEL_BUILDERS, "bert", lambda args, **kw: ("bert", kw))
    monkeypatch.setitem(engine._STATE, "args", SimpleNamespace(model_type_name="bert"))
    name, kwargs = engine.model_provider_func(pre_process=False)  # type: ignore[misc]
    assert name == "bert" and kwargs["pre_process"] is False and kwargs["add_encoder"] is True
    monkeypatch.setitem(engine._STATE, "args", SimpleNamespace(model_type_name="mamba"))
    with pytest.raises(ValueError, match=r"model_type_name='mamba' pass.*custom_model_provider"):
        engine.model_provider_func()


@pytest.mark.skipif(not is_package_available("megatron"), reason="megatron-core is not installed")
def test_megatron_core_has_the_bert_and_t5_pieces() -> None:
    from megatron.core.models.bert import bert_layer_specs
    from megatron.core.models.T5 import t5_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    assert bert_layer_specs.bert_layer_local_spec is not None and t5_spec.LNImpl is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = run_args(T5ForConditionalGeneration())
        config = TransformerConfig(**margs.transformer_config_kwargs(args))
    assert config.kv_channels == 16


# ---------------------------------------------------------------- fp8 through Transformer Engine


@pytest.fixture
def te_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mstrategy, "is_transformer_engine_available", lambda: True)


def test_fp8_without_transformer_engine_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mstrategy, "is_transformer_engine_available", lambda: False)
    with pytest.raises(
        ImportError, match=r"needs Transformer Engine.*hasten\[transformer_engine\]"
    ):
        Accelerator(cpu=True, mixed_precision="fp8", megatron_lm_plugin=MegatronLMPlugin())


def test_fp8_on_a_device_without_fp8_matmuls(te_present: None) -> None:
    strategy = MegatronStrategy(MegatronLMPlugin(), world_size=1)
    with pytest.raises(ValueError, match=r"compute capability 8\.9\+.*mixed_precision='bf16'"):
        strategy.select_precision("fp8", torch.device("cpu"), None, None)


def test_fp8_recipe_becomes_megatron_cores_fp8_fields(
    te_present: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mstrategy, "check_fp8_hardware", lambda device, backend: None)
    strategy = MegatronStrategy(MegatronLMPlugin(), world_size=1)
    recipe = TERecipeKwargs(
        fp8_format="E4M3", margin=2, interval=1, amax_history_len=16, amax_compute_algo="max",
        override_linear_precision=(False, False, True),
    )  # fmt: skip
    precision = strategy.select_precision(
        "fp8", torch.device("cuda"), None, None, fp8_recipe=recipe
    )
    assert precision.mixed_precision == "fp8" and precision.backend.value == "TE"  # type: ignore[attr-defined]
    defaults = strategy.plugin.megatron_lm_default_args
    assert defaults["bf16"] is True  # weights and optimizer in bf16, matmuls in fp8
    strategy.plugin.set_network_size_args(MegatronBertForMaskedLM())
    args = margs.megatron_args(strategy.plugin, world_size=1, mixed_precision="fp8")
    assert args.bf16 and args.params_dtype is torch.bfloat16
    config = margs.transformer_config_kwargs(args)
    assert (config["fp8"], config["fp8_recipe"], config["fp8_margin"]) == ("e4m3", "delayed", 2)
    assert (config["fp8_amax_history_len"], config["fp8_amax_compute_algo"]) == (16, "max")
    assert config["fp8_wgrad"] is False and margs.uses_transformer_engine(args)
    # no recipe: Transformer Engine's defaults (the ACCELERATE_FP8_* rows)
    fresh = MegatronStrategy(MegatronLMPlugin(), world_size=1)
    fresh.select_precision("fp8", torch.device("cuda"), None, None)
    assert fresh.plugin.megatron_lm_default_args["fp8"] == "hybrid"
    assert fresh.plugin.megatron_lm_default_args["fp8_amax_history_len"] == 1024
    mx = margs.fp8_args(TERecipeKwargs(use_mxfp8_block_scaling=True))
    assert mx["fp8_recipe"] == "mxfp8"


def test_fp8_recipes_megatron_cannot_use(te_present: None, monkeypatch: pytest.MonkeyPatch) -> None:
    strategy = MegatronStrategy(MegatronLMPlugin(), world_size=1)
    cpu = torch.device("cpu")
    with pytest.raises(
        ValueError, match=r"through Transformer Engine.*AORecipeKwargs was selected"
    ):
        strategy.select_precision("fp8", cpu, None, None, fp8_recipe=AORecipeKwargs())
    with pytest.raises(ValueError, match=r"fp8_format='E5M2'.*'HYBRID'"):
        strategy.select_precision(
            "fp8", cpu, None, None, fp8_recipe=TERecipeKwargs(fp8_format="E5M2")
        )
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "AO")
    with pytest.raises(ValueError, match=r"the fp8 backend AO was selected.*--fp8_backend te"):
        strategy.select_precision("fp8", cpu, None, None)


@pytest.mark.skipif(not is_package_available("megatron"), reason="megatron-core is not installed")
def test_megatron_core_accepts_the_fp8_fields() -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig

    plugin = MegatronLMPlugin()
    plugin.set_network_size_args(MegatronBertForMaskedLM())
    plugin.megatron_lm_default_args.update(margs.fp8_args(TERecipeKwargs()))
    args = margs.megatron_args(plugin, world_size=1, mixed_precision="fp8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(**margs.transformer_config_kwargs(args))
    assert config.fp8 == "hybrid" and config.fp8_amax_history_len == 1024 and config.bf16
