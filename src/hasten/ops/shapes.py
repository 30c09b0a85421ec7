"""Learn the shape and dtype of a tensor that only one process holds (before sending it).

`torch.distributed` cannot receive a tensor of unknown size, so the receivers first learn its
shape and dtype; dtypes travel as the small integer codes of `TENSOR_TYPE_TO_INT`.
"""

from __future__ import annotations

import torch

from hasten.ops.collectives import gather_object
from hasten.ops.comm import current_comm

__all__ = ["TENSOR_INT_TO_DTYPE", "TENSOR_TYPE_TO_INT", "gather_tensor_shape"]

# Accelerate's codes, kept so that both ends of a mixed job agree.
TENSOR_TYPE_TO_INT: dict[torch.dtype, int] = {
    torch.float: 1,
    torch.double: 2,
    torch.half: 3,
    torch.bfloat16: 4,
    torch.uint8: 5,
    torch.int8: 6,
    torch.int16: 7,
    torch.int32: 8,
    torch.int64: 9,
    torch.bool: 10,
}
TENSOR_INT_TO_DTYPE: dict[int, torch.dtype] = {code: dt for dt, code in TENSOR_TYPE_TO_INT.items()}


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """Return ``(shape, dtype code)`` of the tensor that one process passes (others pass None).

    Every process calls it. The shape comes back as a 1-D int64 tensor on this process's device;
    decode the dtype with `TENSOR_INT_TO_DTYPE`. When several processes pass a tensor, the
    lowest-ranked one's is described.

    Raises:
        ValueError: no process passed a tensor, or its dtype has no code.
    """
    mine = None
    if tensor is not None:
        code = TENSOR_TYPE_TO_INT.get(tensor.dtype)
        if code is None:
            raise ValueError(
                f"gather_tensor_shape cannot describe dtype {tensor.dtype}; supported dtypes: "
                f"{sorted(str(d) for d in TENSOR_TYPE_TO_INT)}"
            )
        mine = (list(tensor.shape), code)
    described = [item for item in gather_object([mine]) if item is not None]
    if not described:
        raise ValueError(
            "gather_tensor_shape: no process passed a tensor; exactly one process should pass "
            "the tensor to describe and the others None"
        )
    shape, code = described[0]
    return torch.tensor(shape, dtype=torch.int64, device=current_comm().device), int(code)
