"""core helpers Accelerate exports from utils.other/environment: bytes, names, dicts, ports, CPU ranks."""

from __future__ import annotations

import socket

import pytest

from hasten.core.environment import (
    CPUInformation,
    get_cpu_distributed_information,
    patch_environment,
)
from hasten.core.names import get_pretty_name, recursive_getattr
from hasten.core.nested import merge_dicts
from hasten.core.network import get_free_port, is_port_in_use
from hasten.core.units import convert_bytes


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 bytes"),
        (1023, "1023 bytes"),
        (1536, "1.5 KB"),
        (5 * 2**20, "5.0 MB"),
        (3 * 2**30 + 2**29, "3.5 GB"),
        (2**40, "1.0 TB"),
        (3 * 2**50, "3.0 PB"),
    ],
)
def test_convert_bytes_picks_the_largest_unit(size: int, text: str) -> None:
    assert convert_bytes(size) == text


class _Outer:
    class Inner:
        def method(self) -> None:
            """A method."""


def test_get_pretty_name_of_classes_functions_and_instances() -> None:
    assert get_pretty_name(_Outer.Inner) == "_Outer.Inner"
    assert get_pretty_name(_Outer.Inner().method) == "_Outer.Inner.method"
    assert get_pretty_name(_Outer.Inner()) == "_Outer.Inner"
    assert get_pretty_name(len) == "len"
    assert get_pretty_name(3) == "int"


def test_recursive_getattr_follows_a_dotted_path() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    assert recursive_getattr(model, "0.weight") is model[0].weight
    with pytest.raises(AttributeError, match="nope"):
        recursive_getattr(model, "0.nope")


def test_merge_dicts_recurses_and_replaces_leaves_in_place() -> None:
    destination = {"a": {"x": 1, "y": 2}, "b": 1}
    result = merge_dicts({"a": {"y": 20, "z": {"k": 3}}, "b": 2, "c": [1]}, destination)
    assert result is destination
    assert destination == {"a": {"x": 1, "y": 20, "z": {"k": 3}}, "b": 2, "c": [1]}


def test_ports_free_and_in_use() -> None:
    port = get_free_port()
    assert 0 < port < 65536
    assert not is_port_in_use(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("localhost", 0))
        server.listen(1)
        assert is_port_in_use(server.getsockname()[1])


_RANK_VARIABLES = [
    f"{prefix}{suffix}"
    for prefix, suffixes in {
        "": ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
        "PMI_": ["RANK", "SIZE"],
        "MPI_": ["LOCALRANKID", "LOCALNRANKS"],
        "OMPI_COMM_WORLD_": ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE"],
        "MV2_COMM_WORLD_": ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE"],
    }.items()
    for suffix in suffixes
]


def test_cpu_distributed_information_reads_torchrun_then_mpi_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in _RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert get_cpu_distributed_information() == CPUInformation()
    with patch_environment(
        OMPI_COMM_WORLD_RANK="3",
        OMPI_COMM_WORLD_SIZE="8",
        OMPI_COMM_WORLD_LOCAL_RANK="1",
        OMPI_COMM_WORLD_LOCAL_SIZE="2",
    ):
        assert get_cpu_distributed_information() == CPUInformation(3, 8, 1, 2)
        with patch_environment(RANK="5", WORLD_SIZE="6"):
            info = get_cpu_distributed_information()
            assert (info.rank, info.world_size, info.local_rank) == (5, 6, 1)


def test_cpu_distributed_information_rejects_a_non_integer_rank() -> None:
    with patch_environment(RANK="two"), pytest.raises(ValueError, match="RANK='two'"):
        get_cpu_distributed_information()


def test_is_torch_xpu_tensor() -> None:
    import torch

    from hasten.core.nested import is_torch_xpu_tensor

    assert not is_torch_xpu_tensor(torch.ones(1))
    assert not is_torch_xpu_tensor([1])
    assert is_torch_xpu_tensor(torch.empty(1, device="meta")) is False


def test_fp8_literal_aliases_and_enum_bases() -> None:
    import typing

    from hasten.config.enums import BaseEnum, EnumWithContains, PrecisionType
    from hasten.config.kwargs import AmaxComputeAlgorithm, Backend, OptLevel

    assert typing.get_args(Backend) == ("MSAMP", "TE")
    assert typing.get_args(OptLevel) == ("O1", "O2")
    assert typing.get_args(AmaxComputeAlgorithm) == ("max", "most_recent")
    assert issubclass(PrecisionType, BaseEnum) and isinstance(PrecisionType, EnumWithContains)
    assert "fp16" in PrecisionType
