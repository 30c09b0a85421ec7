"""Pipeline-parallel inference on `torch.distributed.pipelining`: one model stage per process.

`prepare_pippy` traces the model with example inputs, cuts it at ``split_points`` (module
names; "auto" balances the parameters over the processes with the device-map planner), keeps
this process's stage and replaces ``model.forward`` by a GPipe schedule over ``num_chunks``
micro-batches. The first process feeds the inputs, the last one holds the output (every process
with ``gather_output=True``).

``example_args`` / ``example_kwargs`` are the inputs of one call (as in Accelerate); they are
cut into ``num_chunks`` micro-batches to trace the stages, so later calls must use inputs of the
same shapes, except that a smaller batch is padded up to the traced one (its output then has the
padded rows too, as in Accelerate: slice ``output[:batch]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from hasten.big_modeling.device_map import infer_auto_device_map
from hasten.big_modeling.sizes import calculate_maximum_sizes
from hasten.core.imports import is_pippy_available
from hasten.core.nested import ignorant_find_batch_size, send_to_device
from hasten.ops.collectives import broadcast, broadcast_object_list, pad_input_tensors
from hasten.state.partial import PartialState

__all__ = [
    "build_pipeline",
    "find_pippy_batch_size",
    "generate_device_map",
    "pippy_forward",
    "prepare_pippy",
]


def generate_device_map(
    model: nn.Module,
    num_processes: int = 1,
    no_split_module_classes: list[str] | None = None,
    max_memory: dict[Any, Any] | None = None,
) -> dict[str, Any]:
    """Plan which process holds which module (unflattened), balancing the weights over
    ``num_processes`` devices; with ``max_memory`` the caller's budgets are used as given.
    """
    if num_processes == 1:
        return infer_auto_device_map(
            model, no_split_module_classes=no_split_module_classes, clean_result=False
        )
    if max_memory is not None:
        return infer_auto_device_map(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            clean_result=False,
        )
    size, (largest, _) = calculate_maximum_sizes(model)
    # an equal share plus room for the largest layer (the planner keeps it free on device 0)
    budget = math.ceil((size + largest) / num_processes * 1.1)
    device_map: dict[str, Any] = {}
    for _ in range(32):  # grow the share until every module fits on the processes' devices
        memory: dict[int | str, int | str] = dict.fromkeys(range(num_processes), budget)
        device_map = infer_auto_device_map(
            model,
            max_memory=memory,
            no_split_module_classes=no_split_module_classes,
            clean_result=False,
        )
        if all(isinstance(d, int) and d < num_processes for d in device_map.values()):
            break
        budget = math.ceil(budget * 1.1)
    return device_map


def find_pippy_batch_size(
    args: tuple[object, ...] | None, kwargs: dict[str, object] | None
) -> int | None:
    """The batch size of the first tensor in ``args``, else in ``kwargs`` (None if none)."""
    for group in (args or (), (kwargs or {}).values()):
        for value in group:
            found = ignorant_find_batch_size(value)
            if found is not None:
                return found
    return None


def build_pipeline(
    model: nn.Module, split_points: list[str], args: Any, kwargs: Any, num_chunks: int
) -> Any:
    """Trace ``model`` on one micro-batch (``args``/``kwargs``), cut it before each split point
    and return a GPipe schedule over ``num_chunks`` micro-batches for this process's stage.
    """
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    state = PartialState()
    split_spec = dict.fromkeys(split_points, SplitPoint.BEGINNING)
    pipe = pipeline(model, mb_args=tuple(args or ()), mb_kwargs=kwargs, split_spec=split_spec)
    if pipe.num_stages != state.num_processes:
        raise ValueError(
            f"The split points {split_points} cut the model into {pipe.num_stages} stages, but "
            f"there are {state.num_processes} processes: pass num_processes - 1 split points "
            "(module names called in forward), or split_points='auto'."
        )
    stage = pipe.build_stage(state.process_index, device=state.device)
    return ScheduleGPipe(stage, num_chunks)


def _gather_from_last(output: Any, state: PartialState) -> Any:
    """Give every process the last process's (nested) output: layout first, then the tensors."""
    last = state.num_processes - 1
    leaves, spec = pytree.tree_flatten(output)
    layout = [(spec, [(t.shape, t.dtype) for t in leaves])] if state.is_last_process else [None]
    spec, shapes = broadcast_object_list(layout, from_process=last)[0]
    if not state.is_last_process:
        leaves = [torch.empty(shape, dtype=dtype, device=state.device) for shape, dtype in shapes]
    leaves = broadcast(list(leaves), from_process=last)
    return pytree.tree_unflatten(leaves, spec)


def pippy_forward(
    forward: Callable[..., Any], num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any
) -> Any:
    """Run one pipelined call: the first process feeds (padded) inputs, the last returns the
    output (every process with ``gather_output``), the others return None.

    Raises:
        ValueError: the first process got no tensor to read the batch size from.
    """
    state = PartialState()
    output = None
    if state.num_processes == 1:
        output = forward(*args, **kwargs)
    elif state.is_main_process:
        batch = find_pippy_batch_size(args, kwargs)
        if batch is None:
            raise ValueError(
                "Could not find batch size from args or kwargs: the first pipeline stage needs "
                "at least one tensor input (batch first)."
            )
        if batch % num_chunks:
            args = pad_input_tensors(args, batch, num_chunks)
            kwargs = pad_input_tensors(kwargs, batch, num_chunks)
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output and state.num_processes > 1:
        output = _gather_from_last(output, state)
    return output


def _auto_split_points(
    model: nn.Module, num_stages: int, no_split_module_classes: list[str] | None
) -> list[str]:
    device_map = generate_device_map(model, num_stages, no_split_module_classes)
    points: list[str] = []
    for index in range(1, num_stages):
        first = next((name for name, d in device_map.items() if d == index), None)
        if first is None:
            raise ValueError(
                f"split_points='auto' found no module for stage {index} of {num_stages}: the "
                "model has too few layers to balance; pass split_points (module names) yourself."
            )
        points.append(first)
    return points


def _traced_inputs(args: Any, kwargs: Any, num_chunks: int) -> tuple[tuple[Any, ...], Any, int]:
    """Cut the example call's inputs to one micro-batch; return it and the full traced batch."""
    args = tuple(send_to_device(tuple(args or ()), "cpu"))
    kwargs = send_to_device(kwargs, "cpu") if kwargs is not None else None
    batch = find_pippy_batch_size(args, kwargs)
    if batch is None:
        raise ValueError(
            "prepare_pippy needs example_args or example_kwargs holding at least one tensor "
            "(batch first) to trace the model, e.g. example_args=(torch.randint(0, 100, (2, 8)),)."
        )
    micro = -(-batch // num_chunks)

    def first_rows(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != batch:
            return t
        padded = pad_input_tensors(t, batch, num_chunks)
        return padded[:micro]

    cut = pytree.tree_map_only(torch.Tensor, first_rows, (args, kwargs))
    return cut[0], cut[1], micro * num_chunks


def prepare_pippy(
    model: Any,
    split_points: str | list[str] | None = "auto",
    no_split_module_classes: list[str] | None = None,
    example_args: tuple[Any, ...] | None = (),
    example_kwargs: dict[str, Any] | None = None,
    num_chunks: int | None = None,
    gather_output: bool | None = False,
) -> Any:
    """Wrap ``model`` for pipeline-parallel inference over the processes of this run.

    Args:
        model: the model, on cpu (each process keeps and moves only its own stage).
        split_points: "auto", or the module names before which a new stage starts
            (``num_processes - 1`` of them).
        no_split_module_classes: layer classes "auto" never cuts through.
        example_args: positional inputs of one call (batch first).
        example_kwargs: keyword inputs of one call (every call must pass the same keys).
        num_chunks: micro-batches per call (default: the number of processes).
        gather_output: give every process the output (otherwise only the last one).

    Returns:
        The same model, whose ``forward`` now runs the pipeline (``model.pippy_stage`` is the
        schedule, ``model.hf_split_points`` the split points).

    Raises:
        ImportError: torch has no ``torch.distributed.pipelining`` (needs torch >= 2.4).
        ValueError: bad split points, num_chunks, or no tensor in the example inputs.
    """
    if not is_pippy_available():
        raise ImportError(
            "prepare_pippy needs torch.distributed.pipelining (torch >= 2.4); upgrade torch."
        )
    state = PartialState()
    if num_chunks is None:
        num_chunks = state.num_processes
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be a positive int (micro-batches), got {num_chunks!r}")
    if split_points == "auto":
        split_points = _auto_split_points(model, state.num_processes, no_split_module_classes)
    elif isinstance(split_points, str):
        split_points = [split_points]
    if split_points is None or not all(isinstance(p, str) for p in split_points):
        raise ValueError(
            f"split_points must be 'auto' or a list of module names, got {split_points!r}"
        )
    args, kwargs, traced_batch = _traced_inputs(example_args, example_kwargs, num_chunks)
    original_forward = model.forward
    if state.num_processes == 1:
        stage: Any = None  # one process holds the whole model: no pipeline to build
        step: Callable[..., Any] = original_forward
    else:
        stage = build_pipeline(model, list(split_points), args, kwargs, num_chunks)
        step = stage.step
    model._original_forward = original_forward
    model._original_call = model.__call__
    model.pippy_stage = stage
    model.hf_split_points = list(split_points)

    def forward(*call_args: Any, **call_kwargs: Any) -> Any:
        if state.num_processes > 1:
            # checked wherever inputs are passed, so every process raises (none is left waiting)
            batch = find_pippy_batch_size(call_args, call_kwargs)
            if batch is not None and batch > traced_batch:
                raise ValueError(
                    f"This pipeline was traced for batches of up to {traced_batch} (the "
                    f"example inputs), got {batch}: split the call, or prepare with larger "
                    "example inputs."
                )
            if state.is_main_process:  # the first stage runs on this process's device
                call_args = send_to_device(call_args, state.device)
                call_kwargs = send_to_device(call_kwargs, state.device)
                if batch is not None and batch < traced_batch:
                    call_args = pad_input_tensors(call_args, batch, traced_batch)
                    call_kwargs = pad_input_tensors(call_kwargs, batch, traced_batch)
        return pippy_forward(step, num_chunks, bool(gather_output), *call_args, **call_kwargs)

    forward.__wrapped__ = original_forward  # type: ignore[attr-defined]
    model.forward = forward
    return model
