"""Device maps: memory budgets, planning (against a plain greedy reference), checking."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from hasten.big_modeling.device_map import (
    check_device_map,
    device_for,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    resolve_device_map,
    validate_device,
)
from hasten.big_modeling.sizes import compute_module_sizes
from hasten.big_modeling.tensors import find_tied_parameters
from unit.big_modeling.bm_models import Block, TinyLM

# ---- a straightforward greedy reference (quadratic, written from the documented rules) ----


def _items(prefix: str, module: nn.Module) -> list[tuple[str, Any]]:
    pre = f"{prefix}." if prefix else ""
    items: list[tuple[str, Any]] = [(pre + n, p) for n, p in module.named_parameters(recurse=False)]
    items += [(pre + n, m) for n, m in module.named_children()]
    items += [(pre + n, b) for n, b in module.named_buffers(recurse=False)]
    return items


def _splittable(obj: Any, no_split: tuple[str, ...]) -> bool:
    return (
        isinstance(obj, nn.Module)
        and bool(list(obj.children()))
        and type(obj).__name__ not in no_split
    )


def _max_layer(
    items: list[tuple[str, Any]], sizes: dict[str, int], no_split: tuple[str, ...]
) -> int:
    best = 0
    todo = [(n, m) for n, m in items if isinstance(m, nn.Module)]
    while todo:
        name, module = todo.pop()
        if _splittable(module, no_split):
            todo += [(f"{name}.{n}", c) for n, c in module.named_children()]
        else:
            best = max(best, sizes[name])
    return best


def _inside(name: str, tensor: str) -> bool:
    return tensor == name or tensor.startswith(name + ".")


def _clean(device_map: dict[str, Any], module: str = "") -> dict[str, Any]:
    prefix = f"{module}." if module else ""
    keys = [k for k in device_map if k.startswith(prefix) or module == ""]
    values = {device_map[k] for k in keys}
    if len(values) == 1 and len(keys) > 1:
        for k in keys:
            del device_map[k]
        device_map[module] = values.pop()
    depth = len(module.split(".")) + 1 if module else 1
    children = {
        ".".join(k.split(".")[:depth])
        for k in device_map
        if k.startswith(prefix) and len(k) > len(module)
    }
    for child in children:
        _clean(device_map, child)
    return device_map


def reference_map(
    model: nn.Module, max_memory: dict[Any, int], no_split: tuple[str, ...] = ()
) -> dict[str, Any]:
    sizes = compute_module_sizes(model)
    tied = find_tied_parameters(model)
    devices = [*max_memory, "disk"]
    accelerators = [d for d in devices if d not in ("cpu", "disk")]
    main = {accelerators[0], "cpu"} if accelerators else {"cpu"}
    items = _items("", model)
    placed: dict[str, Any] = {}
    used = dict.fromkeys(devices, 0)
    index = 0
    while items:
        name, obj = items.pop(0)
        device = devices[index]
        outside = [
            t
            for g in tied
            if any(_inside(name, t) for t in g) and not all(_inside(name, t) for t in g)
            for t in g
            if not _inside(name, t)
        ]
        holders: list[str] = []
        for t in outside:
            for n, _ in items:
                if _inside(n, t) and n not in holders:
                    holders.append(n)
                    break
        with_ties = (
            sizes[name] + sum(sizes[h] for h in holders) - sum(sizes.get(t, 0) for t in outside)
        )
        reserve = _max_layer(items, sizes, no_split) if device in main else 0
        limit = None if device == "disk" else max_memory[device] - reserve
        if limit is None or used[device] + with_ties <= limit:
            used[device] += with_ties
            placed[name] = device
            for h in holders:
                placed[h] = device
            items = [(n, o) for n, o in items if n not in holders]
            continue
        if holders and used[device] + sizes[name] <= limit:
            split = next((h for h in holders if _splittable(dict(items)[h], no_split)), None)
            if split is not None:
                pos = [n for n, _ in items].index(split)
                items = [
                    (name, obj),
                    *items[:pos],
                    *_items(split, dict(items)[split]),
                    *items[pos + 1 :],
                ]
                continue
        if used[device] + sizes[name] >= limit and _splittable(obj, no_split):
            items = _items(name, obj) + items
            continue
        index += 1
        items.insert(0, (name, obj))
    return _clean(placed)


# ---- random module trees ----


class Box(nn.Module):
    """A plain container."""


class Blk(nn.Module):
    """A container that must never be split."""


def _build(data: st.DataObject, depth: int) -> nn.Module:
    kind = data.draw(
        st.sampled_from(["linear", "linear", "box", "blk"] if depth < 3 else ["linear"])
    )
    if kind == "linear":
        return nn.Linear(
            data.draw(st.integers(1, 6)),
            data.draw(st.integers(1, 6)),
            bias=data.draw(st.booleans()),
        )
    module = Box() if kind == "box" else Blk()
    if data.draw(st.booleans()):
        module.own = nn.Parameter(torch.zeros(data.draw(st.integers(1, 20))))
    for i in range(data.draw(st.integers(1, 3))):
        setattr(module, f"c{i}", _build(data, depth + 1))
    if data.draw(st.integers(0, 4)) == 0:
        module.register_buffer("buf", torch.zeros(data.draw(st.integers(1, 8))))
    return module


def _random_model(data: st.DataObject) -> nn.Module:
    model = Box()
    for i in range(data.draw(st.integers(1, 4))):
        setattr(model, f"m{i}", _build(data, 1))
    if data.draw(st.booleans()):
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if len(linears) >= 2:
            a, b = data.draw(
                st.lists(st.sampled_from(range(len(linears))), min_size=2, max_size=2, unique=True)
            )
            if linears[a].weight.shape == linears[b].weight.shape:
                linears[b].weight = linears[a].weight
    return model


def _budget(data: st.DataObject, total: int) -> dict[Any, int]:
    budget: dict[Any, int] = {}
    for i in range(data.draw(st.integers(0, 2))):
        budget[i] = data.draw(st.integers(0, total))
    budget["cpu"] = data.draw(st.integers(0, total))
    return budget


def _placed_size(model: nn.Module, device_map: dict[str, Any], device: Any) -> int:
    sizes = compute_module_sizes(model)
    return sum(sizes[k] for k, v in device_map.items() if v == device)


@contextlib.contextmanager
def _captured(logger: logging.Logger) -> Iterator[list[logging.LogRecord]]:
    """The records ``logger`` emits inside the block (caplog cannot serve hypothesis examples)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@pytest.mark.filterwarnings("ignore:The offloaded layers keep")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_planner_matches_greedy_reference_and_respects_budgets(data: st.DataObject) -> None:
    model = _random_model(data)
    total = compute_module_sizes(model)[""]
    budget = _budget(data, total)
    no_split = data.draw(st.sampled_from([(), ("Blk",)]))
    want = reference_map(model, budget, no_split)
    main = 0 if 0 in budget else "cpu"
    offloaded = {"disk"} if main == "cpu" else {"cpu", "disk"}
    largest = _max_layer(_items("", model), compute_module_sizes(model), no_split)
    if offloaded & set(want.values()) and budget[main] < largest:
        # offloaded layers could never run: the main device cannot hold the largest one
        # offloaded layers may not run: the main device's budget is below the largest one
        logger = logging.getLogger("hasten.big_modeling.device_map")
        with _captured(logger) as records:
            got = infer_auto_device_map(
                model, max_memory=dict(budget), no_split_module_classes=list(no_split)
            )
        assert any(f"{largest} bytes" in r.getMessage() for r in records)
        assert got == want
        return
    got = infer_auto_device_map(
        model, max_memory=dict(budget), no_split_module_classes=list(no_split)
    )
    assert got == want
    check_device_map(model, got)  # every tensor placed exactly once
    for device, limit in budget.items():
        assert _placed_size(model, got, device) <= limit
    blocks = [n for n, m in model.named_modules() if isinstance(m, Blk) and n]
    if no_split:
        assert not [k for k in got for b in blocks if k.startswith(b + ".")]


@pytest.mark.parametrize("cpu", [3000, 6000, 9000, 12000, 20000])
def test_tied_weights_land_on_one_device(cpu: int) -> None:
    model = TinyLM()
    got = infer_auto_device_map(model, max_memory={0: 5000, 1: 6000, "cpu": cpu})
    assert device_for("wte.weight", got) == device_for("lm_head.weight", got)
    assert got == reference_map(model, {0: 5000, 1: 6000, "cpu": cpu})


def test_reserves_room_for_the_largest_offloaded_layer() -> None:
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10), nn.Linear(10, 10))
    layer = 440
    # two layers fit on accelerator 0 by size, but one slot must stay free for the cpu layers
    got = infer_auto_device_map(model, max_memory={0: 2 * layer, "cpu": 10 * layer})
    assert got == {"0": 0, "1": "cpu", "2": "cpu"}
    got = infer_auto_device_map(model, max_memory={0: 3 * layer, "cpu": 10 * layer})
    assert got == {"": 0}


def test_disk_gets_what_cpu_cannot_hold_and_offload_buffers() -> None:
    model = TinyLM()
    got = infer_auto_device_map(model, max_memory={"cpu": 20000})
    assert "disk" in got.values() and "cpu" in got.values()
    assert _placed_size(model, got, "cpu") <= 20000
    buffered = nn.Sequential(*[nn.BatchNorm1d(2000) for _ in range(3)])
    with pytest.warns(UserWarning, match="bytes of buffers"):
        loud = infer_auto_device_map(buffered, max_memory={0: 33000, "cpu": 10**6})
    quiet = infer_auto_device_map(
        buffered, max_memory={0: 33000, "cpu": 10**6}, offload_buffers=True
    )
    assert quiet == loud == {"": "cpu"}


def test_main_device_below_the_largest_layer_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = TinyLM()
    with caplog.at_level(logging.INFO, logger="hasten.big_modeling.device_map"):
        assert set(infer_auto_device_map(model, max_memory={"cpu": 4000}).values()) == {"disk"}
    assert re.search(
        r"gives 'cpu' 4000 bytes.*largest layer \('h.0.mlp.0', 4352 bytes\)", caplog.text
    )
    # Accelerate's sentence (its tests look for "insufficient memory")
    assert (
        "no modules could be assigned to the following devices due to insufficient memory"
        in caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hasten.big_modeling.device_map"):
        infer_auto_device_map(model, max_memory={0: 100, "cpu": 10**6})
    assert "gives 0 100 bytes" in caplog.text
    assert infer_auto_device_map(model, max_memory={0: 10**6}) == {"": 0}


def test_no_split_class_stays_whole() -> None:
    model = TinyLM()
    got = infer_auto_device_map(
        model, max_memory={0: 14000, 1: 14000, "cpu": 10**6}, no_split_module_classes=["Block"]
    )
    assert not [k for k in got if k.startswith("h.") and k.count(".") > 1]
    assert got == reference_map(model, {0: 14000, 1: 14000, "cpu": 10**6}, ("Block",))


def test_clean_result_false_lists_every_placed_item(capsys: pytest.CaptureFixture[str]) -> None:
    model = TinyLM()
    raw = infer_auto_device_map(model, max_memory={"cpu": 10**6}, clean_result=False, verbose=True)
    assert set(raw.values()) == {"cpu"} and "h" in raw and "wte" in raw and "" not in raw
    assert "Putting" in capsys.readouterr().out
    assert infer_auto_device_map(model, max_memory={"cpu": 10**6}) == {"": "cpu"}


def test_integer_accelerator_keys_plan_without_accelerators() -> None:
    model = TinyLM()
    got = infer_auto_device_map(model, max_memory={0: "10KB", 1: "10KB", "cpu": "1GB"})
    assert {0, 1} <= set(got.values())


def test_dtype_halves_the_planned_size() -> None:
    model = nn.Sequential(*[nn.Linear(10, 10) for _ in range(4)])
    full = infer_auto_device_map(model, max_memory={0: 1400, "cpu": 10**5})
    half = infer_auto_device_map(model, max_memory={0: 1400, "cpu": 10**5}, dtype=torch.float16)
    assert "cpu" in full.values()
    assert half == {"": 0}


def test_fallback_allocation_fills_an_otherwise_empty_device() -> None:
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(30, 30), nn.Linear(2, 2))
    budget = {0: 4000, "cpu": 10**5}
    assert infer_auto_device_map(model, max_memory=budget) == {"": "cpu"}
    fallback = infer_auto_device_map(model, max_memory=budget, fallback_allocation=True)
    assert fallback == {"0": "cpu", "1": "cpu", "2": 0}


def test_get_max_memory_parses_sizes_orders_devices_and_rejects_unknown() -> None:
    got = get_max_memory({"cpu": "1GiB", 1: "2GB", "disk": 5, 0: 100})
    assert list(got) == [0, 1, "cpu", "disk"]
    assert got[1] == 2 * 10**9 and got["cpu"] == 2**30
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        get_max_memory({"gpu": "1GB"})
    with pytest.raises(ValueError, match="not in a valid format"):
        get_max_memory({"cpu": "lots"})
    with pytest.raises(TypeError, match="dict"):
        get_max_memory(["cpu"])  # type: ignore[arg-type]


def test_get_max_memory_accepts_what_accelerate_accepts(caplog: pytest.LogCaptureFixture) -> None:
    # transformers multiplies the free CPU memory by 0.9 and passes the float back (trl's
    # default from_pretrained(device_map="auto") path): numbers pass through unchanged.
    given: dict[int | str, Any] = {"cpu": 21351215923.2, 0: "1GiB", "disk": np.int64(7)}
    got = get_max_memory(given)
    assert got == {0: 2**30, "cpu": 21351215923.2, "disk": 7}
    assert type(got["cpu"]) is float
    # Strings are converted in the caller's dict too: transformers' get_max_memory reads the
    # user's max_memory back after calling Accelerate's and compares it with numbers.
    assert given[0] == 2**30
    with caplog.at_level(logging.WARNING):
        assert get_max_memory({-1: "1GB"}) == {-1: 10**9}  # kept, with a warning
    assert "not an accelerator index" in caplog.text
    frozen = MappingProxyType({"cpu": "1KB"})
    assert get_max_memory(frozen) == {"cpu": 1000}  # read-only mapping: only the result


def test_planning_refuses_a_size_that_is_not_a_number() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"max_memory\['cpu'\] is None; a size is a number"):
        infer_auto_device_map(model, max_memory={"cpu": None})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"max_memory\[0\] is \[1\]"):
        get_balanced_memory(model, max_memory={0: [1]})  # type: ignore[dict-item]
    plan = infer_auto_device_map(model, max_memory={"cpu": 1e6})  # a float budget plans
    assert plan == {"0": "cpu"}


def test_get_max_memory_reads_free_memory_by_default() -> None:
    got = get_max_memory()
    assert got["cpu"] > 0


def test_get_balanced_memory_spreads_over_accelerators() -> None:
    model = TinyLM(layers=8)
    total = compute_module_sizes(model)[""]
    budget = {0: total, 1: total, "cpu": total}
    balanced = get_balanced_memory(
        model, max_memory=dict(budget), no_split_module_classes=["Block"]
    )
    assert balanced[0] < total and balanced[1] == total
    low = get_balanced_memory(
        model, max_memory=dict(budget), no_split_module_classes=["Block"], low_zero=True
    )
    assert low[0] < balanced[0]
    assert get_balanced_memory(model, max_memory={"cpu": 100}) == {"cpu": 100}
    spread = infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=["Block"])
    assert {0, 1} <= set(spread.values())


def test_check_device_map_errors() -> None:
    model = TinyLM()
    with pytest.raises(ValueError, match="no device for these tensors: .*ln_f.weight"):
        check_device_map(model, {"wte": "cpu", "h": "cpu", "lm_head": "cpu", "scale": "cpu"})
    with pytest.raises(ValueError, match="lists 'h.0' inside 'h'"):
        check_device_map(model, {"h": "cpu", "h.0": 0, "wte": 0})
    with pytest.raises(ValueError, match="whole model"):
        check_device_map(model, {"": "cpu", "h": 0})
    with pytest.warns(UserWarning, match=r"^The following device_map keys do not match any "):
        with pytest.raises(ValueError, match="no device for these tensors"):
            check_device_map(model, {"h.9": 0, "wte": 0})
    everything = {"wte": 0, "h": 0, "ln_f": 0, "lm_head": 0, "scale": 0}  # covers all
    with pytest.warns(UserWarning, match=r"submodules in the model: \['ghost', 'phantom'\]"):
        check_device_map(model, {**everything, "ghost": 1, "phantom": 1})  # then ignored
    with pytest.raises(ValueError, match="'gpu7' is not a device"):
        check_device_map(model, {"": "gpu7"})
    with pytest.raises(TypeError, match="dict"):
        check_device_map(model, "auto")  # type: ignore[arg-type]
    check_device_map(model, {"": "cpu"})
    check_device_map(
        model,
        {"wte": 0, "h": "disk", "ln_f": "cpu", "lm_head.weight": 0, "scale": torch.device("cpu")},
    )


def test_validate_device_and_resolve_device_map() -> None:
    assert validate_device("cuda:1", "x") == "cuda:1"
    assert validate_device(3, "x") == 3
    with pytest.raises(ValueError, match="is not a device"):
        validate_device(-1, "x")
    with pytest.raises(ValueError, match="is not a device"):
        validate_device(True, "x")
    model = TinyLM()
    with pytest.raises(ValueError, match="'fastest' is not supported"):
        resolve_device_map(model, "fastest")
    assert resolve_device_map(model, None) is None
    assert resolve_device_map(model, "sequential", max_memory={"cpu": 10**6}) == {"": "cpu"}
    assert resolve_device_map(model, "balanced", max_memory={"cpu": 10**6}) == {"": "cpu"}


def test_block_fixture_is_used() -> None:
    assert isinstance(TinyLM().h[0], Block)
