"""DeepSpeed through the Accelerator on 2 CPU processes (gloo): ZeRO really shards, trains like DDP.

The reference is what data-parallel training computes: one optimizer step per accumulation
cycle on the mean loss of every micro-batch of both processes, clipped to the same global norm.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from _support.distributed import run_distributed

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.usefixtures("deepspeed_ops"),
    pytest.mark.timeout(600),  # the first DeepSpeed test of a fresh machine builds its op
]

SAMPLES, FEATURES, BATCH, STEPS_PER_UPDATE, LR, CLIP = 64, 8, 4, 2, 1e-2, 0.5


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
    )


def make_data() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    return torch.utils.data.TensorDataset(x, torch.randn(SAMPLES, 2, generator=generator) * 3)


def reference_weights(world_size: int) -> dict[str, torch.Tensor]:
    """Plain data parallelism, computed on one process: the mean loss of each update's batches."""
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = make_data().tensors
    per_update = BATCH * world_size * STEPS_PER_UPDATE
    for start in range(0, SAMPLES, per_update):
        xs, ys = x[start : start + per_update], y[start : start + per_update]
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _plugin(stage: int, **config: Any) -> Any:
    from hasten.utils import DeepSpeedPlugin

    return DeepSpeedPlugin(
        hf_ds_config={
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": CLIP,
            "zero_optimization": {"stage": stage},
            **config,
        }
    )


def _sharding(engine: Any, stage: int) -> tuple[int, int]:
    """(elements this process holds, elements of the whole model) for what ZeRO shards."""
    params = list(engine.module.parameters())
    if stage == 3:
        return sum(p.ds_tensor.numel() for p in params), sum(p.ds_numel for p in params)
    inner = engine.optimizer.optimizer  # the client AdamW over this process's flat partition
    held = sum(s["exp_avg"].numel() for s in inner.state.values())
    return held, sum(p.numel() for p in params)


def _train(stage: int, bf16: bool = False, config: dict[str, Any] | None = None) -> dict[str, Any]:
    from hasten import Accelerator

    plugin = _plugin(stage, **({"bf16": {"enabled": True}} if bf16 else {}), **(config or {}))
    accelerator = Accelerator(gradient_accumulation_steps=STEPS_PER_UPDATE, deepspeed_plugin=plugin)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(make_data(), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    norms = []
    for x, y in loader:
        with accelerator.accumulate(model):
            out = model(x.to(torch.bfloat16) if bf16 else x)
            accelerator.backward(torch.nn.functional.mse_loss(out.float(), y))
            if accelerator.sync_gradients:
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), CLIP)))
            optimizer.step()
            optimizer.zero_grad()
    with pytest.raises(ValueError, match="gradient_clipping=0.5"):
        accelerator.clip_grad_norm_(model.parameters(), 2.0)
    held, total = _sharding(model, stage)
    weights = accelerator.get_state_dict(model)
    steps = model.global_steps
    devices = [
        getattr(c, "device", None)
        for c in (model.zero_offload_optimizer(), model.zero_offload_param())
    ]
    offload = tuple(str(getattr(d, "value", d)) for d in devices)  # an enum or a plain string
    client_optimizer = type(model.optimizer.optimizer).__name__
    accelerator.end_training()  # engines are destroyed before the process group
    assert accelerator.strategy.engines == []  # type: ignore[attr-defined]
    return {
        "held": held,
        "total": total,
        "norms": norms,
        # plain numpy: tensors would travel through shared file descriptors of a finished worker
        "weights": {k: v.float().numpy() for k, v in weights.items()},
        "dtype": str(next(accelerator.unwrap_model(model).parameters()).dtype),
        "mixed_precision": accelerator.mixed_precision,
        "scaler": accelerator.scaler,
        "steps": steps,
        "offload": offload,
        "client_optimizer": client_optimizer,
    }


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_shards_and_trains_like_data_parallel(stage: int) -> None:
    results = run_distributed(_train, stage, world_size=2, timeout=180)
    expected = reference_weights(world_size=2)
    for rank, result in enumerate(results):
        # ZeRO-2 partitions the optimizer state, ZeRO-3 the parameters too: ~1/2 per process
        assert result["total"] / 2 <= result["held"] <= result["total"] / 2 + 64, rank
        assert result["steps"] == SAMPLES // (BATCH * 2 * STEPS_PER_UPDATE)
        assert max(result["norms"]) > CLIP  # clipping really happened
    assert results[0]["held"] + results[1]["held"] >= results[0]["total"]
    weights = {k: torch.from_numpy(v) for k, v in results[0]["weights"].items()}  # gathered
    assert weights.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-5)
    if stage == 3:
        assert results[1]["weights"] == {}
    else:
        for key, value in results[1]["weights"].items():
            torch.testing.assert_close(torch.from_numpy(value), weights[key])


def test_bf16_trains_in_bf16_close_to_fp32() -> None:
    results = run_distributed(_train, 2, True, world_size=2, timeout=180)
    main = results[0]
    assert main["dtype"] == "torch.bfloat16"
    assert main["mixed_precision"] == "bf16"
    assert main["scaler"] is None  # DeepSpeed owns precision: no torch GradScaler
    expected = reference_weights(world_size=2)
    for key, value in expected.items():
        torch.testing.assert_close(torch.from_numpy(main["weights"][key]), value, rtol=0, atol=3e-2)


def _student_and_teacher() -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.utils import DeepSpeedPlugin

    plugins = {
        "student": DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0),
        "teacher": DeepSpeedPlugin(zero_stage=3),
    }
    accelerator = Accelerator(deepspeed_plugins=plugins)
    student, teacher = make_model(), make_model()
    optimizer = torch.optim.AdamW(student.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(make_data(), batch_size=BATCH)
    student, optimizer, loader = accelerator.prepare(student, optimizer, loader)
    accelerator.state.select_deepspeed_plugin("teacher")
    teacher = accelerator.prepare(teacher)  # an inference engine with its own (ZeRO-3) config
    teacher.eval()
    first = None
    for x, _ in loader:
        with torch.no_grad():
            target = teacher(x)
        loss = torch.nn.functional.mse_loss(student(x), target + 1)
        accelerator.backward(loss)
        optimizer.step()
        first = loss.item() if first is None else first
    return {
        "stages": (student.zero_optimization_stage(), teacher.zero_optimization_stage()),
        "teacher_sharding": _sharding(teacher, 3),
        "improved": loss.item() < first,
    }


def test_two_models_with_two_named_configs() -> None:
    for result in run_distributed(_student_and_teacher, world_size=2, timeout=240):
        assert result["stages"] == (2, 3)
        held, total = result["teacher_sharding"]  # ZeRO-3: this process's partition only
        assert total / 2 <= held <= total / 2 + 64
        assert result["improved"]


#: ZeRO-3 with parameters and optimizer state offloaded to the host, stepped by the client AdamW.
OFFLOAD = {
    "zero_optimization": {
        "stage": 3,
        "offload_param": {"device": "cpu"},
        "offload_optimizer": {"device": "cpu"},
    },
    "zero_force_ds_cpu_optimizer": False,
}


def test_zero3_offload_of_parameters_and_optimizer_trains_like_data_parallel() -> None:
    results = run_distributed(_train, 3, False, OFFLOAD, world_size=2, timeout=240)
    expected = reference_weights(world_size=2)
    for result in results:
        assert result["offload"] == ("cpu", "cpu")
        assert result["client_optimizer"] == "AdamW"  # not DeepSpeedCPUAdam (no op build)
        assert result["total"] / 2 <= result["held"] <= result["total"] / 2 + 64
        assert result["steps"] == SAMPLES // (BATCH * 2 * STEPS_PER_UPDATE)
    weights = results[0]["weights"]
    for key, value in expected.items():
        torch.testing.assert_close(torch.from_numpy(weights[key]), value, rtol=1e-4, atol=1e-5)


def _fp16_refused() -> str:
    from hasten import Accelerator

    accelerator = Accelerator(mixed_precision="fp16", deepspeed_plugin=_plugin(2))
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(make_data(), batch_size=BATCH)
    with pytest.raises(ValueError) as caught:
        accelerator.prepare(model, optimizer, loader)
    return str(caught.value)


def test_fp16_on_deepspeeds_cpu_accelerator_is_refused_naming_bf16() -> None:
    # DeepSpeed's CPU accelerator has no fp16 (no loss scaler to run); bf16 is tested above.
    # One process is enough: the check comes before deepspeed.initialize.
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().is_fp16_supported():  # mkldnn has fp16 on CPUs with AVX512-FP16/AMX
        pytest.skip("this CPU's DeepSpeed accelerator supports fp16: there is nothing to refuse")
    for message in run_distributed(_fp16_refused, world_size=1, timeout=180):
        assert "'cpu' accelerator does not support fp16" in message
        assert "mixed_precision='bf16'" in message


def _tiny_gpt2() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16)
    return AutoModelForCausalLM.from_config(config)


def _built_under_zero_init() -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    with plugin.zero3_init_context_manager(enable=False):
        whole = _tiny_gpt2()  # built whole, as Accelerate documents for this context
    torch.manual_seed(0)
    model = _tiny_gpt2()  # transformers builds it inside zero.Init: partitioned at construction
    params = list(model.parameters())
    partitioned = all(hasattr(p, "ds_id") and p.numel() == 0 for p in params)
    held = sum(p.ds_tensor.numel() for p in params)
    total = sum(p.ds_numel for p in params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for (batch,) in loader:
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    weights = accelerator.get_state_dict(model)
    accelerator.end_training()
    return {
        "whole": not any(hasattr(p, "ds_id") for p in whole.parameters()),
        "whole_numel": sum(p.numel() for p in whole.parameters()),
        "partitioned": partitioned,
        "held": held,
        "total": total,
        "losses": losses,
        "shapes": {k: tuple(v.shape) for k, v in weights.items()},
    }


def test_zero3_init_flag_builds_transformers_models_partitioned() -> None:
    pytest.importorskip("transformers", reason="zero3_init_flag acts through transformers")
    results = run_distributed(_built_under_zero_init, world_size=2, timeout=300)
    for result in results:
        assert result["whole"]
        assert result["partitioned"]
        assert result["total"] == result["whole_numel"]
        assert result["total"] / 2 <= result["held"] <= result["total"] / 2 + 64
        assert all(math.isfinite(loss) for loss in result["losses"])
    shapes = results[0]["shapes"]  # gathered whole on the main process
    assert shapes["transformer.wte.weight"] == (64, 16)
    assert results[1]["shapes"] == {}
