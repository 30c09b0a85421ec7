"""Unit tests for hasten.ops.collectives: one process (identity) and a mirrored 2-process comm."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch

from hasten.ops.collectives import (
    CannotPadNestedTensorWarning,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    pad_input_tensors,
    reduce,
)
from hasten.ops.comm import LocalComm, set_comm
from hasten.ops.debug import DistributedOperationException
from unit.ops.mirror_comm import MirrorComm

Pair = namedtuple("Pair", ["a", "b"])


@pytest.fixture
def local() -> LocalComm:
    comm = LocalComm()
    set_comm(comm)
    return comm


def test_single_process_collectives_are_identity(local: LocalComm) -> None:
    data = {"x": torch.arange(3.0), "y": [torch.ones(2)]}
    assert gather(data) is data
    assert broadcast(data, from_process=0) is data
    assert pad_across_processes(data) is data
    assert gather_object(["a"]) == ["a"]
    objs = [1, {"k": 2}]
    assert broadcast_object_list(objs) is objs
    with pytest.raises(TypeError, match=r"`pad_across_processes` only works on tensors.*str"):
        pad_across_processes([torch.ones(1), "label"])


def test_single_process_reduce_clones(local: LocalComm) -> None:
    t = torch.arange(4.0)
    out = reduce({"t": t}, reduction="sum")
    assert torch.equal(out["t"], t)
    assert out["t"] is not t
    with pytest.raises(ValueError, match=r"reduce\(reduction='avg'\) is not supported"):
        reduce(t, reduction="avg")


def test_gather_keeps_types_and_concatenates(mirror: MirrorComm) -> None:
    data = {
        "p": Pair(torch.arange(4.0).view(2, 2), torch.tensor(3)),
        "o": OrderedDict(i=torch.arange(3), f=torch.ones(1, dtype=torch.float16)),
        "t": (torch.arange(6.0).view(2, 3).t(),),  # non-contiguous
    }
    out = gather(data)
    assert isinstance(out["p"], Pair)
    assert isinstance(out["o"], OrderedDict)
    assert isinstance(out["t"], tuple)
    assert torch.equal(out["p"].a, torch.cat([data["p"].a, data["p"].a]))
    assert out["p"].b.tolist() == [3, 3]  # scalars become one row per process
    assert torch.equal(out["o"]["i"], torch.arange(3).repeat(2))
    assert out["o"]["f"].dtype == torch.float16
    assert torch.equal(out["t"][0], torch.cat([data["t"][0], data["t"][0]]))
    # float32, int64 and float16 leaves travel as three buffers, not five
    assert len(mirror.calls) == 3


def test_gather_single_tensor_and_flat_dict(mirror: MirrorComm) -> None:
    t = torch.arange(6.0).view(3, 2)
    assert torch.equal(gather(t), torch.cat([t, t]))
    out = gather({"a": t, "b": t[:, 0]})
    assert torch.equal(out["b"], torch.cat([t[:, 0], t[:, 0]]))
    assert len(mirror.calls) == 2


def test_gather_rejects_objects(mirror: MirrorComm) -> None:
    with pytest.raises(
        TypeError, match=r"`gather` only works on tensors.*str.*\['labels'\]\[1\].*gather_object"
    ):
        gather({"labels": [torch.ones(1), "cat"]})


def test_gather_object_flattens_lists(mirror: MirrorComm) -> None:
    assert gather_object([1, 2]) == [1, 2, 1, 2]
    assert gather_object({"k": 1}) == [{"k": 1}, {"k": 1}]


def test_reduce_mean_sum_max_none(mirror: MirrorComm) -> None:
    data = {"a": torch.tensor([1.0, 3.0]), "b": [torch.tensor([[2.0]])], "i": torch.tensor([5])}
    summed = reduce(data, reduction="sum")
    assert summed["a"].tolist() == [2.0, 6.0]
    assert summed["i"].tolist() == [10]
    assert summed["b"][0].shape == (1, 1)
    assert data["a"].tolist() == [1.0, 3.0]  # inputs untouched
    mean = reduce({"a": data["a"], "b": data["b"]})
    assert mean["a"].tolist() == [1.0, 3.0]
    assert isinstance(mean["b"], list)
    assert reduce(data["a"], reduction="max").tolist() == [1.0, 3.0]
    assert reduce(data["a"], reduction="none").tolist() == [2.0, 6.0]


def test_reduce_errors(mirror: MirrorComm) -> None:
    with pytest.raises(
        ValueError, match=r"reduce\(reduction='median'\).*\['mean', 'sum', 'max', 'none'\]"
    ):
        reduce(torch.ones(1), reduction="median")
    with pytest.raises(
        TypeError, match=r"reduction='mean'\) needs floating-point tensors, got torch.int64"
    ):
        reduce(torch.ones(2, dtype=torch.long))
    with pytest.raises(TypeError, match="`reduce` only works on tensors"):
        reduce([torch.ones(1), 3])
    assert mirror.calls == []  # nothing was sent before the errors


def test_broadcast_in_place(mirror: MirrorComm) -> None:
    mirror.process_index = 1
    a, b = torch.zeros(2), torch.zeros(3, 2).t()
    out = broadcast({"a": a, "b": [b]}, from_process=0)
    assert out["a"] is a
    assert out["b"][0] is b
    assert a.tolist() == [7.0, 7.0]
    assert torch.equal(b, torch.full((2, 3), 7.0))
    single = torch.zeros(2)
    assert broadcast(single) is single
    assert single.tolist() == [7.0, 7.0]


def test_broadcast_overwrites_parameters(mirror: MirrorComm) -> None:
    mirror.process_index = 1
    model = torch.nn.Linear(2, 2)
    broadcast(list(model.parameters()))
    assert torch.equal(model.weight, torch.full((2, 2), 7.0))
    assert model.weight.requires_grad


def test_broadcast_source_keeps_values(mirror: MirrorComm) -> None:
    data = [torch.arange(3.0), torch.arange(2.0)]
    out = broadcast(data, from_process=0)
    assert out[0].tolist() == [0.0, 1.0, 2.0]


def test_broadcast_errors(mirror: MirrorComm) -> None:
    with pytest.raises(ValueError, match=r"broadcast\(from_process=2\) is out of range.*0\.\.1"):
        broadcast(torch.ones(1), from_process=2)
    with pytest.raises(TypeError, match="broadcast_object_list"):
        broadcast(["text"])
    with pytest.raises(ValueError, match=r"broadcast_object_list\(from_process=-1\)"):
        broadcast_object_list([1], from_process=-1)


def test_broadcast_object_list(mirror: MirrorComm) -> None:
    mirror.process_index = 1
    objs = [None, None]
    assert broadcast_object_list(objs) is objs
    assert objs == ["from", "source"]


def test_pad_across_processes(mirror: MirrorComm) -> None:
    t = torch.ones(2, 3)
    # mirrored peer has the same sizes: nothing to pad
    assert pad_across_processes(t, dim=1) is t
    # a 1-d tensor asked to pad dim 1 is returned unchanged
    data = {"a": t, "v": torch.ones(4)}
    assert pad_across_processes(data, dim=1)["v"] is data["v"]


def test_pad_across_processes_pads_to_peer_max(
    mirror: MirrorComm, monkeypatch: pytest.MonkeyPatch
) -> None:
    def peer_is_longer(flat: torch.Tensor, reduce_op: str, op: str, data: object = None) -> None:
        assert reduce_op == "max"
        flat.fill_(4)

    monkeypatch.setattr(mirror, "all_reduce", peer_is_longer)
    t = torch.tensor([[1, 2], [3, 4]])
    out = pad_across_processes({"t": t}, dim=0, pad_index=-1)
    assert out["t"].tolist() == [[1, 2], [3, 4], [-1, -1], [-1, -1]]
    first = pad_across_processes([t], dim=-1, pad_first=True)
    assert first[0].tolist() == [[0, 0, 1, 2], [0, 0, 3, 4]]


def test_pad_across_processes_warns_on_nested(mirror: MirrorComm) -> None:
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    with pytest.warns(CannotPadNestedTensorWarning, match="nested tensor"):
        out = pad_across_processes([nested])
    assert out[0] is nested


def test_pad_across_processes_warns_on_nested_on_one_process(local: LocalComm) -> None:
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    with pytest.warns(CannotPadNestedTensorWarning):
        assert pad_across_processes(nested) is nested
    plain = torch.ones(4, 3)
    assert pad_across_processes(plain, dim=-4) is plain  # out of range: unchanged


def test_pad_input_tensors() -> None:
    out = pad_input_tensors({"x": torch.ones(3, 2)}, batch_size=3, num_processes=4)
    assert out["x"].shape == (4, 2)
    assert out["x"][3].tolist() == [0.0, 0.0]
    assert pad_input_tensors(torch.ones(10), batch_size=10, num_processes=4).shape == (12,)
    assert pad_input_tensors(torch.ones(8), batch_size=8, num_processes=4).shape == (8,)
    assert pad_input_tensors(torch.ones(2, 5), batch_size=5, num_processes=3, dim=1).shape == (2, 6)
    with pytest.raises(ValueError, match=r"num_processes=0\) must be at least 1"):
        pad_input_tensors(torch.ones(1), batch_size=1, num_processes=0)


def test_debug_mode_passes_matching_shapes(mirror: MirrorComm) -> None:
    mirror.debug = True
    assert gather(torch.ones(2)).shape == (4,)
    assert ("all_gather_object", "gather (debug shape check)") in mirror.calls


def test_debug_mode_reports_every_rank(mirror: MirrorComm) -> None:
    mirror.debug = True
    mirror.peer_object = ("gather", "tensor[5, 3]", "")
    with pytest.raises(
        DistributedOperationException,
        match=r"rank 0: gather of tensor\[4, 3\]; rank 1: gather of tensor\[5, 3\]",
    ):
        gather(torch.ones(4, 3))
    assert ("all_gather", "gather") not in mirror.calls


def test_copy_tensor_to_devices(local: LocalComm) -> None:
    t = torch.arange(3)
    assert copy_tensor_to_devices(t) is t
    with pytest.raises(ValueError, match=r"copy_tensor_to_devices\(None\) on a single process"):
        copy_tensor_to_devices(None)


def test_copy_tensor_to_devices_needs_one_owner(mirror: MirrorComm) -> None:
    with pytest.raises(ValueError, match=r"exactly one process.*processes \[0, 1\] did"):
        copy_tensor_to_devices(torch.ones(1))  # the mirrored peer holds one too
