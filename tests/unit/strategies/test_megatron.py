"""Megatron-LM's pure parts on CPU: sizes, arguments, config parsers, data, train steps, losses."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.config.megatron import MegatronLMPlugin
from hasten.config.megatron_models import MODEL_CONFIGS_TO_MEGATRON_PARSERS
from hasten.core.imports import is_package_available
from hasten.strategies.megatron import MegatronStrategy
from hasten.strategies.megatron import args as margs
from hasten.strategies.megatron.data import (
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    rebatch_for_megatron,
)
from hasten.strategies.megatron.engine import (
    avg_losses_across_data_parallel_group,
    get_args,
    reduce_microbatch_losses,
    split_micro_batches,
)
from hasten.strategies.megatron.strategy import _configure_plugin, micro_batch_size_of
from hasten.strategies.megatron.train_step import (
    BertTrainStep,
    GPTTrainStep,
    T5TrainStep,
    causal_masks,
)


class TinyGPT2(nn.Module):
    """Stands for a transformers GPT-2: only ``config`` is read by the parser."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(
            model_type="gpt2", n_layer=2, n_embd=64, n_head=4, n_positions=128,
            vocab_size=1000, return_dict=True, eos_token_id=999, n_inner=None,
        )  # fmt: skip
        self.proj = nn.Linear(4, 4)


def gpt2_plugin(**kwargs: object) -> MegatronLMPlugin:
    plugin = MegatronLMPlugin(**kwargs)  # type: ignore[arg-type]
    plugin.set_training_args(micro_batch_size=2, dp_degree=1)
    plugin.set_network_size_args(TinyGPT2(), {"input_ids": torch.zeros(2, 32, dtype=torch.long)})
    plugin.set_optimizer_type(torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=3e-4))
    plugin.set_scheduler_args(
        MegatronLMDummyScheduler(None, total_num_steps=100, warmup_num_steps=10)
    )
    return plugin


# ---------------------------------------------------------------- sizes and engine choice


def test_parallel_sizes_give_the_data_parallel_size() -> None:
    sizes = margs.parallel_sizes(MegatronLMPlugin(tp_degree=2, pp_degree=2), world_size=8)
    assert sizes["tensor_model_parallel_size"] == 2
    assert sizes["pipeline_model_parallel_size"] == 2
    assert sizes["data_parallel_size"] == 2


def test_sizes_that_do_not_divide_the_world_are_refused() -> None:
    plugin = MegatronLMPlugin(tp_degree=3, pp_degree=1)
    with pytest.raises(
        ValueError,
        match=r"tp_degree=3 x pp_degree=1 x context_parallel_size=1 = 3 do not divide the 4",
    ):
        MegatronStrategy(plugin, world_size=4)


def test_sizes_are_checked_when_the_accelerator_is_built() -> None:
    with pytest.raises(ValueError, match=r"= 2 do not divide the 1 processes"):
        Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))


@pytest.mark.parametrize("other", ["fsdp", "deepspeed"])
def test_megatron_with_another_engine_is_refused(
    other: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"ACCELERATE_USE_{other.upper()}", "true")
    with pytest.raises(ValueError, match=r"Megatron-LM does its own data and model parallelism"):
        Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin())


def test_bf16_is_the_engines_own() -> None:
    strategy = MegatronStrategy(MegatronLMPlugin(), world_size=1)
    assert (
        strategy.select_precision("bf16", torch.device("cpu"), None, None).mixed_precision == "bf16"
    )
    assert strategy.plugin.megatron_lm_default_args["bf16"] is True


def test_megatron_owns_backward() -> None:
    strategy = MegatronStrategy(MegatronLMPlugin(), world_size=1)
    backward = strategy.backward_fn(1, None)
    assert backward is not None
    loss = nn.Linear(2, 1)(torch.ones(1, 2)).sum()
    backward(loss)  # the engine already ran backward: nothing happens
    assert loss.grad_fn is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_prepare_without_cuda_says_megatron_needs_gpus() -> None:
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin())
    with pytest.raises(RuntimeError, match="Megatron-LM needs CUDA GPUs"):
        accelerator.prepare(nn.Linear(2, 2))


# ---------------------------------------------------------------- arguments


def test_gpt2_config_parser_fills_the_network_arguments() -> None:
    args = gpt2_plugin().megatron_lm_default_args
    assert args["model_type_name"] == "gpt"
    assert (args["num_layers"], args["hidden_size"], args["num_attention_heads"]) == (2, 64, 4)
    assert args["seq_length"] == 32  # from the batch
    assert args["orig_vocab_size"] == 1000 and args["eod_token_id"] == 999
    assert args["ffn_hidden_size"] == 256


def test_seq_length_precedence() -> None:
    plugin = MegatronLMPlugin(seq_length=16)
    plugin.set_network_size_args(TinyGPT2(), {"input_ids": torch.zeros(1, 32)})
    assert plugin.seq_length == 16  # the user's choice beats the batch
    plugin = MegatronLMPlugin(seq_length=16, decoder_seq_length=24)
    with pytest.warns(UserWarning, match="using decoder_seq_length"):
        plugin.set_network_size_args(TinyGPT2())
    assert plugin.seq_length == 24
    plugin = MegatronLMPlugin()
    plugin.set_network_size_args(TinyGPT2())
    assert plugin.seq_length == 128  # the model's maximum


def test_llama_and_bert_and_t5_parsers() -> None:
    assert {"megatron-bert", "gpt2", "t5", "llama", "glm4_moe"} <= set(
        MODEL_CONFIGS_TO_MEGATRON_PARSERS
    )
    llama = nn.Module()
    llama.config = SimpleNamespace(  # type: ignore[assignment]
        model_type="llama", num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
        num_key_value_heads=2, intermediate_size=172, max_position_embeddings=256,
        vocab_size=500, rms_norm_eps=1e-6, rope_theta=5e5, tie_word_embeddings=False,
    )  # fmt: skip
    plugin = MegatronLMPlugin()
    plugin.set_network_size_args(llama)
    args = plugin.megatron_lm_default_args
    assert args["num_query_groups"] == 2 and args["normalization"] == "RMSNorm"
    assert args["position_embedding_type"] == "rope" and args["swiglu"] is True
    t5 = nn.Module()
    t5.config = SimpleNamespace(  # type: ignore[assignment]
        model_type="t5", num_layers=2, d_model=32, num_heads=4, vocab_size=100
    )
    plugin = MegatronLMPlugin()
    plugin.set_network_size_args(t5, {"input_ids": torch.zeros(2, 12), "labels": torch.zeros(2, 5)})
    assert (plugin.encoder_seq_length, plugin.decoder_seq_length) == (12, 5)


def test_unknown_model_type_names_the_supported_ones() -> None:
    model = nn.Linear(2, 2)
    model.config = SimpleNamespace(model_type="mamba")  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"no model-config parser for model_type='mamba'.*'gpt2'"):
        MegatronLMPlugin().set_network_size_args(model)


def test_megatron_core_configs_from_the_plugin() -> None:
    args = margs.megatron_args(
        gpt2_plugin(recompute_activations=True), world_size=1, mixed_precision="bf16"
    )
    assert args.padded_vocab_size == 1024 and args.data_parallel_size == 1
    assert args.params_dtype is torch.bfloat16 and args.bf16 and not args.fp16
    config = margs.transformer_config_kwargs(args)
    assert config["recompute_granularity"] == "selective" and config["recompute_method"] is None
    assert config["ffn_hidden_size"] == 256 and config["bf16"]
    optimizer = margs.optimizer_config_kwargs(args)
    assert optimizer["optimizer"] == "adam" and optimizer["lr"] == 3e-4
    schedule = margs.scheduler_kwargs(args)
    # counted in samples: steps x global batch (2 x 1 micro-batch x 1 dp)
    assert (schedule["lr_warmup_steps"], schedule["lr_decay_steps"]) == (20, 200)
    assert schedule["max_lr"] == 3e-4
    model = margs.gpt_model_kwargs(args)
    assert model["vocab_size"] == 1024 and model["max_sequence_length"] == 128


def test_arguments_without_a_model_or_schedule_are_refused() -> None:
    with pytest.raises(ValueError, match=r"needs the network arguments"):
        margs.megatron_args(MegatronLMPlugin(), world_size=1, mixed_precision="no")
    plugin = MegatronLMPlugin()
    plugin.set_network_size_args(TinyGPT2())
    args = margs.megatron_args(plugin, world_size=1, mixed_precision="no")
    with pytest.raises(ValueError, match=r"needs the length of training.*MegatronLMDummyScheduler"):
        margs.scheduler_kwargs(args)


@pytest.mark.skipif(not is_package_available("megatron"), reason="megatron-core is not installed")
def test_megatron_core_accepts_the_configs() -> None:
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = margs.megatron_args(gpt2_plugin(), world_size=1, mixed_precision="bf16")
        config = TransformerConfig(**margs.transformer_config_kwargs(args))
        OptimizerConfig(**margs.optimizer_config_kwargs(args))
    assert config.num_layers == 2 and config.bf16


# ---------------------------------------------------------------- data


def loader(batch_size: int, n: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n)), batch_size=batch_size)


def test_micro_batch_size_from_the_loaders() -> None:
    plugin = MegatronLMPlugin()
    assert micro_batch_size_of(plugin, [loader(4), loader(2), nn.Linear(1, 1)]) == 2
    plugin.is_train_batch_min = False
    assert micro_batch_size_of(plugin, [loader(4), loader(2)]) == 4
    with pytest.raises(ValueError, match=r"pass the training \(and evaluation\) DataLoader"):
        micro_batch_size_of(plugin, [nn.Linear(1, 1)])


def test_a_torch_scheduler_is_refused() -> None:
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    with pytest.raises(ValueError, match=r"pass MegatronLMDummyScheduler.*instead of StepLR"):
        _configure_plugin(MegatronLMPlugin(), {"data_parallel_size": 1}, [loader(2), scheduler])


def test_dummy_scheduler_and_data_loader() -> None:
    scheduler = MegatronLMDummyScheduler("opt", total_num_steps=10, warmup_num_steps=2, extra=1)
    assert (scheduler.optimizer, scheduler.total_num_steps, scheduler.warmup_num_steps) == (
        "opt",
        10,
        2,
    )
    assert scheduler.kwargs == {"extra": 1}
    dummy = MegatronLMDummyDataLoader(data_path=["corpus"], seq_length=64, micro_batch_size=2)
    assert dummy.dataset_args["megatron_dataset_flag"] is True
    assert dummy.dataset_args["split"] == "969, 30, 1"
    namespace = SimpleNamespace()
    dummy.set_megatron_data_args(namespace)
    assert namespace.data_path == ["corpus"] and namespace.seq_length == 64
    # Explicit arguments win; the dummy's defaults only fill what the run lacks.
    run = SimpleNamespace(eval_iters=5, seq_length=32)
    MegatronLMDummyDataLoader(data_path="corpus").set_megatron_data_args(run)
    assert (run.eval_iters, run.seq_length, run.split) == (5, 32, "969, 30, 1")
    MegatronLMDummyDataLoader(eval_iters=7, seq_length=None).set_megatron_data_args(run)
    assert (run.eval_iters, run.seq_length) == (7, 32)


def test_rebatch_keeps_the_data_and_order() -> None:
    rebuilt = rebatch_for_megatron(loader(2, n=12), batch_size=4)
    assert [b[0].tolist() for b in rebuilt] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_get_args_before_initialisation() -> None:
    with pytest.raises(RuntimeError, match="Megatron-LM is not initialised yet"):
        get_args()


# ---------------------------------------------------------------- train steps and losses


def test_causal_masks() -> None:
    tokens = torch.tensor([[5, 6, 9, 7]])
    attention, loss_mask, positions = causal_masks(tokens, eod_token=9, eod_mask_loss=True)
    assert attention.shape == (1, 1, 4, 4)
    assert attention[0, 0].tolist()[1] == [False, False, True, True]  # True = hidden
    assert loss_mask.tolist() == [[1.0, 1.0, 0.0, 1.0]]
    assert positions.tolist() == [[0, 1, 2, 3]]


def test_gpt_train_step_shifts_labels_and_averages_the_masked_loss() -> None:
    args = SimpleNamespace(eod_token_id=0, eod_mask_loss=False, model_return_dict=False)
    step = GPTTrainStep(None, args)
    batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 8]])}
    tokens, labels, loss_mask, attention, positions = step.get_batch(iter([batch]))
    assert tokens.tolist() == [[3, 4, 5], [6, 7, 8]]
    assert labels.tolist() == [[4, 5, 0], [7, 8, 0]]
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    loss, report = step.loss_func(loss_mask, per_token)
    assert loss.item() == pytest.approx(3.5)
    assert report["lm loss"].item() == pytest.approx(3.5)
    seen = {}

    def model(tokens, position_ids, attention_mask, labels):  # type: ignore[no-untyped-def]
        seen.update(tokens=tokens, labels=labels)
        return torch.ones_like(labels, dtype=torch.float)

    output, bound_loss = step.forward_step(iter([batch]), model)
    assert bound_loss(output)[0].item() == pytest.approx(1.0)
    assert seen["labels"].tolist() == [[4, 5, 0], [7, 8, 0]]


def test_bert_and_t5_train_steps() -> None:
    bert = BertTrainStep(None, SimpleNamespace(pretraining_flag=True))
    batch = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[-100, 2, -100]])}
    tokens, types, order, loss_mask, labels, padding = bert.get_batch(iter([batch]))
    assert loss_mask.tolist() == [[0.0, 1.0, 0.0]] and types.tolist() == [[0, 0, 0]]
    assert labels.tolist() == [[0, 2, 0]]  # valid ids for megatron-core's cross entropy
    loss, report = bert.loss_func(loss_mask, None, (torch.tensor([[9.0, 2.0, 9.0]]), None))
    assert loss.item() == pytest.approx(2.0)
    t5 = T5TrainStep(None, SimpleNamespace(decoder_start_token_id=0))
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 1]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0]]),
        "labels": torch.tensor([[8, 9, -100]]),
    }
    enc, dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask = t5.get_batch(iter([batch]))
    assert dec.tolist() == [[0, 8, 9]] and loss_mask.tolist() == [[1.0, 1.0, 0.0]]
    assert enc_mask.shape == (1, 1, 4, 4) and bool(enc_mask[0, 0, 0, 3])
    assert enc_dec_mask.shape == (1, 1, 3, 4) and dec_mask.shape == (1, 3, 3)
    batch["decoder_input_ids"] = torch.tensor([[2, 8, 9]])  # Megatron's T5 samples carry them
    assert t5.get_batch(iter([batch]))[1].tolist() == [[2, 8, 9]]


def test_micro_batches_and_their_losses() -> None:
    batch = {"input_ids": torch.arange(8).view(4, 2)}
    chunks = split_micro_batches(batch, micro_batch_size=2, num_micro_batches=2)
    assert [c["input_ids"][:, 0].tolist() for c in chunks] == [[0, 2], [4, 6]]
    with pytest.raises(ValueError, match=r"holds 4 samples but Megatron-LM needs .* = 6"):
        split_micro_batches(batch, micro_batch_size=3, num_micro_batches=2)
    reduced = reduce_microbatch_losses(
        [{"lm loss": torch.tensor(1.0)}, {"lm loss": torch.tensor(3.0)}]
    )
    assert reduced["lm loss"].item() == pytest.approx(2.0)
    assert reduce_microbatch_losses([]) == {}


def test_loss_averaging_on_one_process() -> None:
    averaged = avg_losses_across_data_parallel_group([torch.tensor(2.0), torch.tensor(4.0)])
    assert averaged.tolist() == [2.0, 4.0]


# ---------------------------------------------------------------- the prepare flow, engine faked


class FakeMegatronOptimizer:
    """What megatron-core's optimizer answers: step() -> (success, grad norm, zeros)."""

    def __init__(self) -> None:
        self.steps = 0
        self.zeroed = 0
        self.state: dict = {}
        self.param_groups: list = []

    def step(self) -> tuple[bool, float, int]:
        self.steps += 1
        return True, 1.0, 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zeroed += 1

    def state_dict(self) -> dict:
        return {"steps": self.steps}


class FakeScheduler:
    def __init__(self) -> None:
        self.increments: list[int] = []

    def step(self, increment: int) -> None:
        self.increments.append(increment)

    def state_dict(self) -> dict:
        return {}


class Chunk(nn.Linear):
    def zero_grad_buffer(self) -> None:
        self.zeroed = True


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> dict:
    """megatron-core replaced at its seam: initialise, build, and the pipeline schedule."""
    from hasten.strategies.megatron import engine

    made: dict = {}

    def initialize(accelerator, extra_args_provider=None, args_defaults=None):  # type: ignore[no-untyped-def]
        plugin = accelerator.state.megatron_lm_plugin
        args = margs.megatron_args(plugin, accelerator.num_processes, accelerator.mixed_precision)
        monkeypatch.setitem(engine._STATE, "args", args)
        made["args"] = args
        return args

    def build(accelerator):  # type: ignore[no-untyped-def]
        made.update(optimizer=FakeMegatronOptimizer(), scheduler=FakeScheduler())
        return [Chunk(2, 2)], made["optimizer"], made["scheduler"]

    def run(self, batch, forward_only):  # type: ignore[no-untyped-def]
        made.setdefault("batches", []).append((next(iter(batch.values())).shape, forward_only))
        return [{"lm loss": torch.tensor(2.0)}, {"lm loss": torch.tensor(4.0)}]

    monkeypatch.setattr(MegatronStrategy, "check_usable", lambda self: None)
    monkeypatch.setattr(engine, "initialize", initialize)
    monkeypatch.setattr(engine, "prepare_model_optimizer_scheduler", build)
    monkeypatch.setattr(engine.MegatronEngine, "_run", run)
    return made


def token_loader(batch_size: int, n: int = 16) -> DataLoader:
    rows = [{"input_ids": torch.arange(8) + i} for i in range(n)]
    return DataLoader(rows, batch_size=batch_size)


def test_prepare_builds_the_engine_and_the_step_runs_inside_the_model(fake_engine: dict) -> None:
    from hasten.strategies.megatron.engine import (
        MegatronEngine,
        MegatronLMOptimizerWrapper,
        MegatronLMSchedulerWrapper,
    )

    plugin = MegatronLMPlugin(num_micro_batches=2)
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=plugin)
    assert isinstance(accelerator.strategy, MegatronStrategy)
    model = TinyGPT2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=1)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, token_loader(2), token_loader(4), scheduler
    )
    assert isinstance(model, MegatronEngine)
    assert isinstance(optimizer, MegatronLMOptimizerWrapper)
    assert isinstance(scheduler, MegatronLMSchedulerWrapper)
    args = fake_engine["args"]
    assert (args.micro_batch_size, args.num_micro_batches, args.global_batch_size) == (2, 2, 4)
    assert (args.num_layers, args.seq_length, args.train_iters) == (2, 8, 10)
    assert plugin.global_batch_size == 4
    # one batch = one global step (micro x num_micro samples) for this single data-parallel rank
    assert [len(b["input_ids"]) for b in train] == [4, 4, 4, 4]
    model.train()
    batch = next(iter(train))
    loss = model(**batch).loss  # transformers' output type, as for the HF model
    assert loss.item() == pytest.approx(3.0)  # micro-batch losses averaged
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    megatron_optimizer = fake_engine["optimizer"]
    assert megatron_optimizer.steps == 1  # only the engine stepped, once
    assert fake_engine["scheduler"].increments == [4]
    assert not optimizer.step_was_skipped
    model.eval()
    model(**batch)
    assert fake_engine["batches"][-1] == (torch.Size([4, 8]), True)
    assert megatron_optimizer.steps == 1
    assert accelerator._models == [model]


def test_a_second_model_is_refused(fake_engine: dict) -> None:
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin())
    with pytest.raises(ValueError, match="one model per Accelerator"):
        accelerator.prepare(TinyGPT2(), TinyGPT2(), token_loader(2))


def test_split_models_cannot_be_saved_whole() -> None:
    strategy = MegatronStrategy(MegatronLMPlugin(tp_degree=2), world_size=4)
    with pytest.raises(NotImplementedError, match=r"split over 2 processes"):
        strategy.model_state_dict(nn.Linear(2, 2))
    whole = MegatronStrategy(MegatronLMPlugin(), world_size=4)
    assert set(whole.model_state_dict(nn.Linear(2, 2))) == {"weight", "bias"}


# ---------------------------------------------------------------- Megatron's datasets, faked builder


def gpt_samples(n: int) -> list[dict]:
    """What megatron-core's GPTDataset yields: tokens and labels (shifted by one)."""
    return [
        {"tokens": torch.tensor([i, i + 1]), "labels": torch.tensor([i + 1, i + 2])}
        for i in range(n)
    ]


def test_prepare_with_a_dummy_loader_builds_megatrons_datasets(
    fake_engine: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hasten.strategies.megatron import datasets

    built: dict = {}

    def build(args, data, sizes):  # type: ignore[no-untyped-def]
        built.update(sizes=sizes, data=data, flag=args.megatron_dataset_flag)
        return [gpt_samples(40), gpt_samples(8), None]

    monkeypatch.setattr(datasets, "build_datasets", build)
    plugin = MegatronLMPlugin(num_micro_batches=2, eval_iters=1, eval_interval=5)
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=plugin)
    model = TinyGPT2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=10)
    dummy = MegatronLMDummyDataLoader(data_path="corpus", seq_length=2, micro_batch_size=2)
    model, optimizer, scheduler, train, valid, test = accelerator.prepare(
        model, optimizer, scheduler, dummy, dummy, dummy
    )
    args = fake_engine["args"]
    assert args.megatron_dataset_flag and (args.seq_length, args.micro_batch_size) == (2, 2)
    # 10 steps x global batch 4; valid (10 // 5 + 1) x 1 eval iteration; test 1 iteration
    assert built["sizes"] == [40, 12, 4] and built["flag"]
    assert test is None  # an empty split
    batches = list(train)
    assert len(batches) == 10 and len(valid) == 2
    # Megatron's "text": the sequence plus the next token, one global step per batch
    assert batches[1]["text"].tolist() == [[4, 5, 6], [5, 6, 7], [6, 7, 8], [7, 8, 9]]
    model.train()
    assert model(**batches[0]).loss.item() == pytest.approx(3.0)
    assert model.train_step_handler.get_batch(iter(batches))[0].tolist()[0] == [0, 1]
    # Accelerate's building blocks: a resumed loader over one dataset, the accelerator's device
    resumed = dummy.build_pretraining_data_loader(gpt_samples(40), consumed_samples=8)
    assert next(iter(resumed))["text"][:, 0].tolist() == [8, 9, 10, 11]


def test_dummy_loader_inputs_are_checked(fake_engine: dict) -> None:
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin())
    with pytest.raises(ValueError, match=r"micro_batch_size=None.*pass an int >= 1"):
        accelerator.prepare(TinyGPT2(), MegatronLMDummyDataLoader(data_path="corpus"))
    dummy = MegatronLMDummyDataLoader(data_path="corpus", micro_batch_size=1)
    with pytest.raises(ValueError, match=r"got 4 MegatronLMDummyDataLoader objects.*at most 3"):
        accelerator.prepare(TinyGPT2(), dummy, dummy, dummy, dummy)


def test_a_custom_datasets_provider_replaces_megatron_core(fake_engine: dict) -> None:
    asked: list = []

    def provider(sizes):  # type: ignore[no-untyped-def]
        asked.append(sizes)
        return gpt_samples(8), None, None

    plugin = MegatronLMPlugin(custom_megatron_datasets_provider_function=provider, train_iters=2)
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=plugin)
    dummy = MegatronLMDummyDataLoader(micro_batch_size=4, eval_iters=1)
    _, train = accelerator.prepare(TinyGPT2(), dummy)
    assert asked == [[8, 4, 4]]
    assert [len(batch["text"]) for batch in train] == [4, 4]
