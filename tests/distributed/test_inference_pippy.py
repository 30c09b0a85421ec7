"""prepare_pippy on 2 forked CPU processes (gloo): pipelined outputs equal the unsplit model's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from _support.distributed import run_distributed

pytestmark = pytest.mark.distributed


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(x)
        if scale is not None:  # used by the first stage (torch feeds inputs to stage 0 only)
            h = h * scale
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.head(h)


def _run(split_points: Any, gather: bool, batch: int, use_kwargs: bool) -> dict[str, Any]:
    from hasten import PartialState, prepare_pippy

    state = PartialState()
    torch.manual_seed(0)
    model = Net().eval()
    example = torch.randn(4, 4)
    scale = torch.full((4, 8), 0.5)
    x = torch.randn(batch, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x, scale[:batch]) if use_kwargs else model(x)
    kwargs = {"scale": scale} if use_kwargs else None
    model = prepare_pippy(
        model,
        split_points=split_points,
        example_args=(example,),
        example_kwargs=kwargs,
        gather_output=gather,
    )
    with torch.no_grad():
        out = model(x, scale=scale[:batch]) if use_kwargs else model(x)
    return {
        "rank": state.process_index,
        "points": model.hf_split_points,
        "out": None if out is None else out[:batch].tolist(),
        "rows": None if out is None else out.shape[0],
        "expected": expected.tolist(),
    }


def _bad(kind: str) -> str:
    from hasten import PartialState, prepare_pippy

    PartialState()
    model = Net()
    try:
        if kind == "stages":
            prepare_pippy(
                model, split_points=["blocks.1", "blocks.2"], example_args=(torch.randn(2, 4),)
            )
        else:
            model = prepare_pippy(
                model, split_points=["blocks.1"], example_args=(torch.randn(2, 4),)
            )
            model(torch.randn(6, 4))
    except ValueError as exc:
        return str(exc)
    return "no error"


def _scenarios() -> dict[str, Any]:
    """Every case in one pair of workers: forking and tracing dominate the cost."""
    return {
        "explicit": _run(["blocks.2"], True, 4, False),
        "auto": _run("auto", True, 4, False),
        "small": _run(["blocks.1"], False, 3, True),
        "stages": _bad("stages"),
        "batch": _bad("batch"),
    }


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_distributed(_scenarios, world_size=2, timeout=120)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", ["explicit", "auto"])
def test_pipelined_output_matches_the_unsplit_model(
    results: list[dict[str, Any]], case: str
) -> None:
    r0, r1 = (r[case] for r in results)
    for r in (r0, r1):  # gather_output: both processes hold the last stage's output
        torch.testing.assert_close(torch.tensor(r["out"]), torch.tensor(r["expected"]))
    if case == "auto":
        assert len(r0["points"]) == 1 and r0["points"] == r1["points"]
        assert r0["points"][0].startswith("blocks.")  # a balanced cut through the blocks


@pytest.mark.timeout(150)
def test_without_gather_only_the_last_process_has_the_output_and_small_batches_pad(
    results: list[dict[str, Any]],
) -> None:
    r0, r1 = (r["small"] for r in results)
    assert r0["out"] is None
    assert r1["rows"] == 4  # padded up to the traced batch, as in Accelerate
    torch.testing.assert_close(torch.tensor(r1["out"]), torch.tensor(r1["expected"]))


@pytest.mark.timeout(150)
def test_bad_split_and_oversized_batch_raise_clear_errors(results: list[dict[str, Any]]) -> None:
    message = results[0]["stages"]
    assert "3 stages" in message and "2 processes" in message
    for r in results:
        assert "traced for batches of up to 2" in r["batch"]  # on every process: nobody hangs
