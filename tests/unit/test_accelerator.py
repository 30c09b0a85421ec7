"""Single-process behaviour of `Accelerator` (CPU): construction, prepare, the step, helpers."""

from __future__ import annotations

import copy
import json
import pickle
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.config.kwargs import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    ProfileKwargs,
)
from hasten.config.project import DataLoaderConfiguration, GradientAccumulationPlugin
from hasten.strategies import SingleDeviceStrategy
from hasten.strategies.unwrap import is_compiled_module


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def dataset(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g))


# ---------------------------------------------------------------- construction


def test_defaults_single_cpu_process() -> None:
    acc = Accelerator(cpu=True)
    assert acc.device == torch.device("cpu")
    assert acc.num_processes == 1
    assert acc.process_index == 0
    assert acc.is_main_process
    assert acc.is_local_main_process
    assert acc.is_last_process
    assert not acc.use_distributed
    assert acc.mixed_precision == "no"
    assert isinstance(acc.strategy, SingleDeviceStrategy)
    assert acc.gradient_accumulation_steps == 1
    assert acc.sync_gradients
    assert not acc.split_batches
    assert acc.even_batches
    assert "SingleDeviceStrategy" in repr(acc)


def test_unknown_mixed_precision_is_rejected() -> None:
    with pytest.raises(
        ValueError,
        match=r"'fp12' \(from Accelerator\(mixed_precision=...\)\). Choose one of.*or None to use",
    ):
        Accelerator(cpu=True, mixed_precision="fp12")


@pytest.mark.parametrize("steps", [0, -2])
def test_non_positive_accumulation_is_rejected(steps: int) -> None:
    with pytest.raises(ValueError, match=rf"gradient_accumulation_steps={steps} is invalid"):
        Accelerator(cpu=True, gradient_accumulation_steps=steps)


def test_non_positive_accumulation_from_the_launcher_is_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 0 from the environment used to fall back to 1 silently (falsy value).
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "0")
    with pytest.raises(ValueError, match="ACCELERATE_GRADIENT_ACCUMULATION_STEPS=0 is invalid"):
        Accelerator(cpu=True)


def test_accumulation_steps_must_be_int() -> None:
    with pytest.raises(TypeError, match="gradient_accumulation_steps must be an int"):
        Accelerator(cpu=True, gradient_accumulation_steps=2.5)  # type: ignore[arg-type]


def test_steps_and_plugin_together_are_rejected() -> None:
    with pytest.raises(ValueError, match="pass only one"):
        Accelerator(
            cpu=True,
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )


def test_accumulation_plugin_is_used() -> None:
    plugin = GradientAccumulationPlugin(num_steps=3, sync_each_batch=True)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    assert acc.gradient_accumulation_steps == 3
    assert acc.gradient_state.plugin_kwargs["sync_each_batch"] is True


def test_env_supplies_defaults_and_explicit_arguments_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "3")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    acc = Accelerator(cpu=True)
    assert acc.gradient_accumulation_steps == 3
    assert acc.mixed_precision == "bf16"
    from hasten.state._shared import reset_state

    reset_state()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2, mixed_precision="no")
    assert acc.gradient_accumulation_steps == 2
    assert acc.mixed_precision == "no"


def test_conflicting_pairs_are_rejected() -> None:
    from hasten.config.dynamo import TorchDynamoPlugin

    with pytest.raises(ValueError, match="dynamo_backend='eager' and dynamo_plugin"):
        Accelerator(cpu=True, dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin())
    with pytest.raises(ValueError, match="deepspeed_plugin and deepspeed_plugins"):
        Accelerator(cpu=True, deepspeed_plugin=object(), deepspeed_plugins={"a": object()})


def test_kwargs_handlers_are_sorted_and_checked() -> None:
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    acc = Accelerator(cpu=True, kwargs_handlers=[ddp, AutocastKwargs(enabled=True)])
    assert acc.ddp_handler is ddp
    assert acc.autocast_handler is not None
    assert acc.scaler_handler is None
    with pytest.raises(TypeError, match="Unsupported kwargs handler"):
        Accelerator(cpu=True, kwargs_handlers=[object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="Two DistributedDataParallelKwargs"):
        Accelerator(cpu=True, kwargs_handlers=[ddp, DistributedDataParallelKwargs()])


def test_split_batches_argument_and_type() -> None:
    acc = Accelerator(cpu=True, split_batches=True)
    assert acc.split_batches
    assert acc.dataloader_config.split_batches
    assert Accelerator(cpu=True, split_batches="yes").split_batches  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="split_batches must be a bool: invalid truth value 'sure'"):
        Accelerator(cpu=True, split_batches="sure")  # type: ignore[arg-type]


def test_dataloader_config_views() -> None:
    config = DataLoaderConfiguration(
        even_batches=False, use_seedable_sampler=True, non_blocking=True
    )
    acc = Accelerator(cpu=True, dataloader_config=config)
    assert not acc.even_batches
    assert acc.use_seedable_sampler
    assert acc.non_blocking
    assert not acc.use_stateful_dataloader
    assert acc.dispatch_batches is None
    acc.even_batches = True
    assert config.even_batches


def test_megatron_without_cuda_is_accepted_then_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.platforms import checks
    from hasten.strategies.megatron import MegatronStrategy

    monkeypatch.setattr(checks, "is_cuda_available", lambda: False)
    monkeypatch.setattr("hasten.strategies.megatron.strategy.is_cuda_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_USE_MEGATRON_LM", "true")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    acc = Accelerator(cpu=True)
    assert isinstance(acc.strategy, MegatronStrategy)  # refused at prepare, never ignored
    assert acc.state.engine.requested == ("megatron_lm",)
    with pytest.raises(RuntimeError, match="Megatron-LM needs CUDA GPUs"):
        acc.prepare(mlp())


def test_fsdp_on_one_process_trains_plainly() -> None:
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    with pytest.warns(UserWarning, match="nothing is sharded and the plugin is not used"):
        acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    assert isinstance(acc.strategy, SingleDeviceStrategy) and not acc.is_fsdp2
    assert acc.state.fsdp_plugin is None


# ---------------------------------------------------------------- prepare


def test_prepare_returns_objects_in_order_and_wraps() -> None:
    acc = Accelerator(cpu=True)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    loader = DataLoader(dataset(), batch_size=8)
    marker = {"not": "prepared"}
    out = acc.prepare(sched, marker, loader, opt, model)
    assert len(out) == 5
    p_sched, p_marker, p_loader, p_opt, p_model = out
    assert p_marker is marker
    assert p_model is model
    assert p_opt.optimizer is opt
    assert p_sched.scheduler is sched
    assert isinstance(p_loader, DataLoader)
    assert len(list(p_loader)) == 8
    assert acc._models == [p_model]
    assert acc._optimizers == [p_opt]
    assert acc._schedulers == [p_sched]
    assert acc._dataloaders == [p_loader]
    assert acc.prepare(mlp()) is not None  # a single object comes back bare, not in a tuple


def test_prepared_objects_come_back_unchanged() -> None:
    # Accelerate's test_prepare_model_twice_does_not_double_wrap, and the same for each kind.
    acc = Accelerator(cpu=True)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    loader = DataLoader(dataset(8), batch_size=4)
    p_model, p_opt, p_sched, p_loader = acc.prepare(model, opt, sched, loader)
    assert acc.prepare_model(p_model) is p_model
    assert acc.prepare(p_opt) is p_opt
    assert acc.prepare_scheduler(p_sched) is p_sched
    assert acc.prepare_data_loader(p_loader) is p_loader
    again = acc.prepare(p_model, p_opt, p_sched, p_loader)
    assert all(a is b for a, b in zip(again, (p_model, p_opt, p_sched, p_loader)))
    assert acc._models == [p_model] and acc._optimizers == [p_opt]
    assert acc._schedulers == [p_sched] and acc._dataloaders == [p_loader]
    # After free_memory the lists are empty; a prepared object passed again is listed again.
    acc.free_memory()
    assert acc.prepare(p_model, p_opt) == (p_model, p_opt)
    assert acc._models == [p_model] and acc._optimizers == [p_opt]
    # Mixed in one call with new objects: only the new ones are prepared.
    new_loader = DataLoader(dataset(8), batch_size=2)
    back_model, new_prepared = acc.prepare(p_model, new_loader)
    assert back_model is p_model and new_prepared is not new_loader
    assert acc._dataloaders == [new_prepared]


def test_an_object_replaced_by_a_wrapper_is_refused_when_passed_again() -> None:
    acc = Accelerator(cpu=True)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acc.prepare(model, opt)
    with pytest.raises(RuntimeError, match="already passed to Accelerator.prepare.*wrapper"):
        acc.prepare(opt)  # the raw optimizer: prepare returned an AcceleratedOptimizer for it
    other = mlp()
    with pytest.raises(RuntimeError, match="passed twice to one prepare"):
        acc.prepare(other, other)


def test_a_model_prepared_for_evaluation_is_wrapped_for_training_later() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    model = mlp()
    evaluated = acc.prepare_model(model, evaluation_mode=True)
    assert acc.prepare_model(evaluated, evaluation_mode=True) is evaluated
    acc.free_memory()  # Trainer frees memory before training a model it evaluated
    trained = acc.prepare(evaluated)
    assert trained is model and acc._models == [model]
    assert acc.prepare(trained) is trained  # now prepared for training: handed back
    with torch.no_grad():
        out = trained(torch.randn(2, 8))
    assert out.dtype == torch.float32  # one autocast wrapper, outputs converted once


def test_device_placement_list_must_match() -> None:
    acc = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="device_placement has 1 entries but 2 objects"):
        acc.prepare(mlp(), mlp(1), device_placement=[True])


def test_optimizer_without_its_model_is_rejected() -> None:
    acc = Accelerator(cpu=True)
    with torch.device("meta"):
        stray = nn.Linear(2, 2)
    opt = torch.optim.SGD(stray.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="'meta' but the Accelerator trains on 'cpu'.*prepare"):
        acc.prepare(opt)


def test_optimizer_follows_parameters_replaced_by_the_move() -> None:
    acc = Accelerator(cpu=True)
    model = mlp().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = list(model.parameters())
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        # Moving to float32 with overwrite on creates new Parameter objects.
        from hasten.strategies import parallelize

        place = parallelize.apply_placement
        with mock.patch.object(
            parallelize, "apply_placement", lambda m, d, **kw: place(m.float(), d, **kw)
        ):
            p_model, p_opt = acc.prepare(model, opt)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    after = list(p_model.parameters())
    assert all(a is not b for a, b in zip(after, before))
    held = [p for group in p_opt.param_groups for p in group["params"]]
    assert all(h is a for h, a in zip(held, after))


# ---------------------------------------------------------------- the step


def train_weights(acc: Accelerator, batch: int, steps: int, accumulate: bool) -> list[torch.Tensor]:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(dataset(steps * 16), batch_size=batch)
    model, opt, loader = acc.prepare(model, opt, loader)
    for x, y in loader:
        with acc.accumulate(model) if accumulate else torch.enable_grad():
            loss = F.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in acc.unwrap_model(model).parameters()]


def test_accumulation_equals_the_full_batch() -> None:
    from hasten.state._shared import reset_state

    full = train_weights(Accelerator(cpu=True), batch=16, steps=4, accumulate=False)
    reset_state()
    micro = train_weights(
        Accelerator(cpu=True, gradient_accumulation_steps=4), batch=4, steps=4, accumulate=True
    )
    for a, b in zip(full, micro):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_accumulate_flags_sync_and_last_batch() -> None:
    acc = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = mlp()
    loader = acc.prepare(DataLoader(dataset(40), batch_size=8))  # 5 batches
    model = acc.prepare(model)
    flags = []
    for _x, _y in loader:
        with acc.accumulate(model):
            flags.append(acc.sync_gradients)
    assert flags == [False, False, True, False, True]


def test_step_counts_micro_steps_and_restarts_at_end_of_loader() -> None:
    # Accelerate's `accelerator.step`: +1 per accumulate() entry, 0 after the loader's last batch.
    acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = acc.prepare(mlp())
    loader = acc.prepare(DataLoader(dataset(48), batch_size=8))  # 6 batches
    steps = []
    for _epoch in range(2):
        for _x, _y in loader:
            with acc.accumulate(model):
                steps.append(acc.step)
    assert steps == [1, 2, 3, 4, 5, 0] * 2
    acc.step = 3
    assert acc._accumulator.step == 3


def test_gradient_accumulation_steps_setter_rescales_backward() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(mlp())
    x = torch.ones(2, 8)
    acc.backward(model(x).sum())
    one = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    acc.gradient_accumulation_steps = 2
    assert acc.gradient_accumulation_steps == 2
    acc.backward(model(x).sum())
    for a, b in zip(one, model.parameters()):
        torch.testing.assert_close(b.grad, a / 2)


def test_clip_helpers() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(mlp())
    acc.backward(model(torch.ones(4, 8)).sum() * 100)
    norm = acc.clip_grad_norm_(model.parameters(), 0.5)
    assert float(norm) > 0.5
    total = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    assert float(total) == pytest.approx(0.5, rel=1e-4)
    acc.clip_grad_value_(model.parameters(), 1e-3)
    assert max(float(p.grad.abs().max()) for p in model.parameters()) == pytest.approx(1e-3)


def test_no_sync_and_trigger_are_harmless_on_one_process() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(mlp())
    with acc.no_sync(model), Accelerator.trigger_sync_in_backward(model):
        acc.backward(model(torch.ones(1, 8)).sum())
    assert all(p.grad is not None for p in model.parameters())


# ---------------------------------------------------------------- precision


def test_bf16_forward_returns_fp32_and_unwraps() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    model = mlp()
    prepared = acc.prepare(model)
    x = torch.randn(4, 8)
    assert prepared(x).dtype == torch.float32
    with acc.autocast():
        assert model[0](x).dtype == torch.bfloat16
    restored = pickle.loads(pickle.dumps(prepared))
    assert restored(x).dtype == torch.float32
    plain = acc.unwrap_model(prepared, keep_fp32_wrapper=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert plain(x).dtype == torch.bfloat16


def test_fp16_where_unsupported_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    import hasten.precision.select as select

    monkeypatch.setattr(select, "FP16_DEVICE_TYPES", ("cuda",))
    with pytest.raises(
        ValueError, match="mixed_precision='fp16' is not supported on device type 'cpu'"
    ):
        Accelerator(cpu=True, mixed_precision="fp16")


def test_fp16_backward_before_any_optimizer_is_rejected() -> None:
    acc = Accelerator(cpu=True, mixed_precision="fp16")
    model = acc.prepare(mlp())
    with pytest.raises(RuntimeError, match="no optimizer was prepared"):
        acc.backward(model(torch.ones(1, 8)).sum())


def test_fp16_overflow_skips_step_and_scheduler() -> None:
    acc = Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=2.0**10)]
    )
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    model, opt, sched = acc.prepare(model, opt, sched)
    before = copy.deepcopy(acc.unwrap_model(model).state_dict())
    loss = model(torch.ones(2, 8)).sum() * torch.tensor(float("inf"))
    acc.backward(loss)
    opt.step()
    sched.step()
    opt.zero_grad()
    assert acc.optimizer_step_was_skipped
    assert sched.get_last_lr() == [0.1]
    for name, value in acc.unwrap_model(model).state_dict().items():
        torch.testing.assert_close(value, before[name])
    acc.backward(model(torch.ones(2, 8)).sum())
    opt.step()
    sched.step()
    assert not acc.optimizer_step_was_skipped
    assert sched.get_last_lr() == [pytest.approx(0.05)]


def test_unscale_gradients_without_scaler_is_noop() -> None:
    acc = Accelerator(cpu=True)
    model = mlp()
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    acc.backward(model(torch.ones(1, 8)).sum())
    grads = [p.grad.clone() for p in model.parameters()]
    acc.unscale_gradients()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g)


# ---------------------------------------------------------------- collectives & helpers


def test_single_process_collectives_are_identities() -> None:
    acc = Accelerator(cpu=True)
    t = torch.arange(6.0).reshape(3, 2)
    torch.testing.assert_close(acc.gather(t), t)
    torch.testing.assert_close(acc.reduce(t), t)
    torch.testing.assert_close(acc.pad_across_processes(t), t)
    assert acc.gather_for_metrics(["a", "b"]) == ["a", "b"]
    torch.testing.assert_close(acc.gather_for_metrics({"x": t})["x"], t)
    with acc.split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]
    acc.wait_for_everyone()


def test_gather_for_metrics_returns_the_dataset_exactly() -> None:
    acc = Accelerator(cpu=True)
    data = TensorDataset(torch.arange(10.0))
    loader = acc.prepare(DataLoader(data, batch_size=4))
    seen = [acc.gather_for_metrics(batch) for (batch,) in loader]
    torch.testing.assert_close(torch.cat(seen), torch.arange(10.0))


def test_trigger_round_trip() -> None:
    acc = Accelerator(cpu=True)
    assert not acc.check_trigger()
    acc.set_trigger()
    assert acc.check_trigger()
    assert not acc.check_trigger()


def test_process_decorators_and_print(capsys: pytest.CaptureFixture[str]) -> None:
    acc = Accelerator(cpu=True)
    calls: list[str] = []
    acc.on_main_process(lambda: calls.append("main"))()
    acc.on_local_main_process(lambda: calls.append("local"))()
    acc.on_last_process(lambda: calls.append("last"))()
    acc.on_process(lambda: calls.append("p0"), process_index=0)()
    acc.on_process(process_index=1)(lambda: calls.append("p1"))()
    acc.on_local_process(lambda: calls.append("l0"), local_process_index=0)()
    assert calls == ["main", "local", "last", "p0", "l0"]
    with pytest.raises(TypeError, match="decorates a function"):
        acc.on_main_process(3)  # type: ignore[arg-type]
    with acc.main_process_first(), acc.local_main_process_first():
        acc.print("hello", 1)
    assert "hello 1" in capsys.readouterr().out


def test_free_memory_drops_references() -> None:
    acc = Accelerator(cpu=True)
    model = mlp()
    acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    released = acc.clear(model)
    assert released == [None]
    assert acc._models == []
    assert acc._optimizers == []
    acc.prepare(model)  # its registrations were forgotten too


def test_skip_first_batches() -> None:
    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(12.0)), batch_size=3))
    skipped = acc.skip_first_batches(loader, 2)
    torch.testing.assert_close(torch.cat([b for (b,) in skipped]), torch.arange(6.0, 12.0))


# ---------------------------------------------------------------- compile, profile, trackers


def test_dynamo_backend_compiles_whole_or_regional() -> None:
    from hasten.config.dynamo import TorchDynamoPlugin

    torch._dynamo.reset()
    acc = Accelerator(cpu=True, dynamo_backend="eager")
    model = acc.prepare(mlp())
    assert is_compiled_module(model)
    assert model(torch.ones(1, 8)).shape == (1, 1)
    assert acc.unwrap_model(model, keep_torch_compile=False) is model._orig_mod
    from hasten.state._shared import reset_state

    reset_state()
    tower = nn.Sequential(*(nn.Linear(8, 8) for _ in range(3)))
    acc = Accelerator(
        cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    )
    out = acc.prepare(tower)
    assert not is_compiled_module(out)
    assert all(block._compiled_call_impl is not None for block in out)


def test_profile_writes_a_trace(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path))])
    with acc.profile() as prof:
        torch.ones(4).sum()
    assert prof is not None
    trace = tmp_path / "profile_0.json"
    assert json.loads(trace.read_text())["traceEvents"]


def test_trackers_delegate_to_the_manager(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, log_with="jsonl", project_dir=str(tmp_path))
    assert acc.project_dir == str(tmp_path)
    acc.init_trackers("demo", config={"lr": 0.1})
    assert [t.name for t in acc.trackers] == ["jsonl"]
    assert acc.get_tracker("jsonl").name == "jsonl"
    acc.log({"loss": 1.5}, step=3)
    acc.end_training()
    written = "".join(p.read_text() for p in tmp_path.rglob("*.jsonl"))
    assert "1.5" in written


def test_dispatched_model_is_not_moved() -> None:
    acc = Accelerator(cpu=True)
    model = mlp()
    assert not acc.verify_device_map(model)
    model.hf_device_map = {"0": "cpu", "2": "disk"}
    assert acc.verify_device_map(model)
    moved: list[object] = []
    original = acc.strategy.parallel_plan
    acc.strategy.parallel_plan = lambda m, c, i: moved.append(c.device_of(i)) or original(m, c, i)  # type: ignore[method-assign]
    acc.prepare(model)
    assert moved == [None]


def test_dispatched_model_cannot_train_with_ddp() -> None:
    from hasten.strategies import DDPStrategy

    acc = Accelerator(cpu=True)
    acc.strategy = DDPStrategy()
    model = mlp()
    model.hf_device_map = {"0": "cpu", "2": "cpu"}
    with pytest.raises(ValueError, match="dispatched over several devices.*'ddp'"):
        acc.prepare_model(model)


def test_changing_accumulation_keeps_fp16_backward_usable() -> None:
    acc = Accelerator(cpu=True, mixed_precision="fp16")
    model = mlp()
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    acc.gradient_accumulation_steps = 2
    acc.backward(model(torch.ones(1, 8)).sum())
    assert all(p.grad is not None for p in model.parameters())


def test_save_model_of_an_offloaded_model_onloads_its_weights(tmp_path: Path) -> None:
    # Accelerate's test_save_model_offload: save, dispatch with disk offload, save again, reload
    from hasten.big_modeling import load_checkpoint_and_dispatch

    acc = Accelerator(cpu=True)
    model = mlp()
    inputs = torch.randn(3, 8)
    expected = model(inputs)
    acc.save_model(model, str(tmp_path))
    device_map = {"0": "cpu", "1": "cpu", "2": "disk"}
    load_checkpoint_and_dispatch(
        model, str(tmp_path), device_map=device_map, offload_folder=str(tmp_path / "off")
    )
    assert model[2].weight.device.type == "meta"
    acc.save_model(model, str(tmp_path / "again"))
    fresh = mlp(seed=5)
    load_checkpoint_and_dispatch(fresh, str(tmp_path / "again"))
    assert torch.allclose(fresh(inputs), expected, atol=1e-6)
    with torch.device("meta"):
        empty = mlp()
    with pytest.raises(
        RuntimeError, match="^You can't save the model since some parameters are on the meta device"
    ):
        acc.save_model(empty, str(tmp_path / "empty"))


def test_load_state_takes_accelerates_map_location(tmp_path: Path) -> None:
    # Accelerate's test_map_location (2 processes): cpu, on_device, and a refused value
    acc = Accelerator(cpu=True)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    acc.backward(model(torch.randn(4, 8)).sum())
    opt.step()
    acc.save_state(str(tmp_path / "ckpt"))
    for where in ("cpu", "on_device", None):
        acc.load_state(str(tmp_path / "ckpt"), map_location=where)
        state = opt.state_dict()["state"][0]["exp_avg"]
        assert state.device.type == acc.device.type == "cpu"
    with pytest.raises(TypeError, match="^Unsupported optimizer map location passed"):
        acc.load_state(str(tmp_path / "ckpt"), map_location="invalid")


def test_join_uneven_inputs_says_when_the_engine_cannot_join(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acc = Accelerator(cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with acc.join_uneven_inputs([]):  # one process: nothing to say
            pass
    monkeypatch.setattr(Accelerator, "num_processes", property(lambda self: 2))
    assert not acc.strategy.joins_uneven_inputs  # not DDP (FSDP, DeepSpeed, ...)
    with pytest.warns(UserWarning, match="^Joining uneven inputs is only supported for multi-GPU"):
        with acc.join_uneven_inputs([]):
            pass
