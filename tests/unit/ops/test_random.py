"""Unit tests for hasten.ops.random: seeding and (single-process) rng synchronisation."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from hasten.ops.comm import LocalComm, set_comm
from hasten.ops.random import set_seed, synchronize_rng_state, synchronize_rng_states
from unit.ops.mirror_comm import MirrorComm


def _draw() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


@pytest.fixture
def local() -> LocalComm:
    comm = LocalComm()
    set_comm(comm)
    return comm


@pytest.fixture
def restore_determinism() -> Iterator[None]:
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def test_set_seed_reproduces_python_numpy_torch(local: LocalComm) -> None:
    set_seed(123)
    first = _draw()
    set_seed(123)
    assert _draw() == first
    set_seed(124)
    assert _draw() != first


def test_set_seed_seeds_each_library_with_the_seed_itself(local: LocalComm) -> None:
    # the same streams a script seeded by hand (or by Accelerate's set_seed) would draw
    set_seed(1234)
    assert random.random() == random.Random(1234).random()
    assert float(np.random.rand()) == float(np.random.RandomState(1234).rand())
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(1234)))


def test_set_seed_device_specific_adds_process_index(mirror: MirrorComm) -> None:
    mirror.process_index = 1
    set_seed(10, device_specific=True)
    specific = _draw()
    set_seed(11)
    assert _draw() == specific


def test_set_seed_accepts_numpy_integers_and_rejects_other_types(local: LocalComm) -> None:
    set_seed(np.int64(77))
    assert torch.initial_seed() == 77
    for bad in ("42", 4.5, None):
        with pytest.raises(TypeError, match=rf"set_seed\(seed={bad!r}\) needs an integer seed"):
            set_seed(bad)  # type: ignore[arg-type]


def test_set_seed_deterministic(local: LocalComm, restore_determinism: None) -> None:
    torch.use_deterministic_algorithms(False)
    set_seed(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()


def test_synchronize_single_process_keeps_state(local: LocalComm) -> None:
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    synchronize_rng_state("generator", generator=gen)
    synchronize_rng_states(["torch"])
    assert torch.equal(gen.get_state(), state)


def test_synchronize_with_peer_sets_broadcast_state(mirror: MirrorComm) -> None:
    gen = torch.Generator().manual_seed(5)
    calls = []

    def fake_broadcast(flat: torch.Tensor, src: int, op: str, data: object = None) -> None:
        calls.append((src, op))
        flat.copy_(torch.Generator().manual_seed(9).get_state())

    mirror.broadcast = fake_broadcast  # type: ignore[method-assign]
    synchronize_rng_state("generator", generator=gen)
    assert calls == [(0, "synchronize_rng_state")]
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(9).get_state())


def test_synchronize_errors(local: LocalComm) -> None:
    with pytest.raises(ValueError, match=r"rng_type=None\) is not a generator type.*'torch'"):
        synchronize_rng_state()
    with pytest.raises(ValueError, match=r"rng_type='dice'\)"):
        synchronize_rng_states(["torch", "dice"])
    with pytest.raises(ValueError, match="needs `generator=`"):
        synchronize_rng_state("generator")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no cuda device is available"):
            synchronize_rng_state("cuda")
    if not hasattr(torch, "sdaa"):
        with pytest.raises(RuntimeError, match="no sdaa device"):
            synchronize_rng_state("sdaa")
