"""Every collective in hasten.ops on 2 real gloo processes (forked, joined on loopback)."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

import pytest
import torch

from _support.distributed import run_distributed

pytestmark = [pytest.mark.distributed]

Pair = namedtuple("Pair", ["a", "b"])


def _state() -> Any:
    from hasten.state import PartialState

    return PartialState()


def _tensor_collectives() -> dict[str, Any]:
    from hasten.ops.collectives import broadcast, gather, reduce
    from hasten.ops.comm import TorchComm, current_comm

    rank = _state().process_index
    data = {
        "p": Pair(torch.full((2, 2), float(rank)), torch.tensor(rank)),
        "o": OrderedDict(
            i=torch.arange(3) + 10 * rank, h=torch.ones(1, dtype=torch.float16) * rank
        ),
    }
    gathered = gather(data)
    summed = reduce(data, reduction="sum")
    mean = reduce({"x": torch.tensor([2.0 * rank, 4.0])})
    biggest = reduce(torch.tensor([rank, 5 - rank]), reduction="max")
    mine = [torch.full((2,), float(rank)), torch.full((3, 2), float(rank)).t()]
    returned = broadcast(mine, from_process=1)
    # a training loss still attached to its graph: gloo cannot gather it in place
    loss = torch.full((2,), float(rank + 1), requires_grad=True) * 2
    gathered_loss = gather(loss)
    gathered_mixed = gather({"loss": loss, "w": torch.ones(1, requires_grad=True)})
    return {
        "gathered_loss": (gathered_loss.tolist(), gathered_loss.requires_grad),
        "gathered_mixed": (
            gathered_mixed["loss"].tolist(),
            gathered_mixed["w"].tolist(),
            gathered_mixed["loss"].requires_grad or gathered_mixed["w"].requires_grad,
        ),
        "comm": isinstance(current_comm(), TorchComm),
        "types": (type(gathered["p"]).__name__, type(gathered["o"]).__name__),
        "gathered_a": gathered["p"].a.tolist(),
        "gathered_b": gathered["p"].b.tolist(),
        "gathered_i": gathered["o"]["i"].tolist(),
        "gathered_h": (gathered["o"]["h"].dtype, gathered["o"]["h"].tolist()),
        "summed_i": summed["o"]["i"].tolist(),
        "summed_b": summed["p"].b.item(),
        "mean": mean["x"].tolist(),
        "max": biggest.tolist(),
        "broadcast_same_objects": returned[0] is mine[0] and returned[1] is mine[1],
        "broadcast": [mine[0].tolist(), mine[1].tolist()],
    }


@pytest.mark.timeout(60)
def test_gather_reduce_broadcast_on_two_processes() -> None:
    for out in run_distributed(_tensor_collectives, timeout=45):
        assert out["comm"]
        assert out["types"] == ("Pair", "OrderedDict")
        assert out["gathered_a"] == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
        assert out["gathered_b"] == [0, 1]
        assert out["gathered_i"] == [0, 1, 2, 10, 11, 12]
        assert out["gathered_h"] == (torch.float16, [0.0, 1.0])
        assert out["summed_i"] == [10, 12, 14]
        assert out["summed_b"] == 1
        assert out["mean"] == [1.0, 4.0]
        assert out["max"] == [1, 5]
        assert out["broadcast_same_objects"]
        assert out["broadcast"] == [[1.0, 1.0], [[1.0] * 3, [1.0] * 3]]
        assert out["gathered_loss"] == ([2.0, 2.0, 4.0, 4.0], False)
        assert out["gathered_mixed"] == ([2.0, 2.0, 4.0, 4.0], [1.0, 1.0], False)


def _object_and_padding() -> dict[str, Any]:
    from hasten.ops.collectives import (
        broadcast_object_list,
        copy_tensor_to_devices,
        gather,
        gather_object,
        pad_across_processes,
    )

    rank = _state().process_index
    objects = gather_object([f"r{rank}-{i}" for i in range(rank + 2)])  # 2 items, then 3
    shared = broadcast_object_list([{"rank": rank}, f"from {rank}"] if rank == 0 else [None, None])
    uneven = torch.arange(rank + 2).view(-1, 1) + 100 * rank  # 2 rows, then 3
    padded = pad_across_processes(
        {"u": uneven, "s": [torch.ones(rank + 1, 2)]}, dim=0, pad_index=-1
    )
    padded_dim1 = pad_across_processes(torch.ones(2, rank + 1), dim=1, pad_first=True)
    owned = torch.arange(6, dtype=torch.int32).view(2, 3) if rank == 1 else None
    copied = copy_tensor_to_devices(owned)
    return {
        "copied": (copied.dtype, copied.tolist()),
        "objects": objects,
        "shared": shared,
        "padded_rows": gather(padded["u"]).view(-1).tolist(),
        "padded_nested": padded["s"][0].shape,
        "padded_dim1": padded_dim1.tolist(),
    }


@pytest.mark.timeout(60)
def test_objects_and_uneven_padding_on_two_processes() -> None:
    out0, out1 = run_distributed(_object_and_padding, timeout=45)
    for out in (out0, out1):
        assert out["objects"] == ["r0-0", "r0-1", "r1-0", "r1-1", "r1-2"]
        assert out["shared"] == [{"rank": 0}, "from 0"]
        assert out["padded_rows"] == [0, 1, -1, 100, 101, 102]
        assert out["padded_nested"] == (2, 2)
        assert out["copied"] == (torch.int32, [[0, 1, 2], [3, 4, 5]])
    assert out0["padded_dim1"] == [[0.0, 1.0], [0.0, 1.0]]
    assert out1["padded_dim1"] == [[1.0, 1.0], [1.0, 1.0]]


def _random_states() -> dict[str, Any]:
    from hasten.ops.random import set_seed, synchronize_rng_state, synchronize_rng_states

    rank = _state().process_index
    set_seed(42, device_specific=True)
    specific = torch.rand(2).tolist()
    torch.manual_seed(rank)
    generator = torch.Generator().manual_seed(100 + rank)
    synchronize_rng_states(["torch", "generator"], generator=generator)
    after = (torch.rand(2).tolist(), torch.rand(2, generator=generator).tolist())
    torch.manual_seed(rank)
    synchronize_rng_state("torch")
    return {"specific": specific, "after": after, "again": torch.rand(1).tolist()}


@pytest.mark.timeout(60)
def test_seed_and_rng_sync_on_two_processes() -> None:
    out0, out1 = run_distributed(_random_states, timeout=45)
    assert out0["specific"] != out1["specific"]
    assert out0["after"] == out1["after"]
    assert out0["again"] == out1["again"]
    torch.manual_seed(0)
    assert out0["again"] == torch.rand(1).tolist()  # rank 0's state won


def _shape_from_rank_one() -> tuple[list[int], int]:
    from hasten.ops.shapes import gather_tensor_shape
    from hasten.state import PartialState

    state = PartialState()
    tensor = torch.ones(4, 2, dtype=torch.bfloat16) if state.process_index == 1 else None
    shape, code = gather_tensor_shape(tensor)
    return shape.tolist(), code


def test_gather_tensor_shape_tells_every_process() -> None:
    assert run_distributed(_shape_from_rank_one, world_size=2, timeout=60) == [([4, 2], 4)] * 2
