"""PIL/torch versions of the ``torchvision.transforms`` diffusers' unconditional example uses.

Only for `diffusers_runner` (where torchvision cannot load); each does what torchvision's does
for the square RGB images the ecosystem test writes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch


class InterpolationMode(enum.Enum):
    """The interpolations the example names."""

    BILINEAR = "bilinear"


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Iterable[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for transform in self.transforms:
            x = transform(x)
        return x


class Lambda:
    """Apply a function."""

    def __init__(self, function: Callable[[Any], Any]) -> None:
        self.function = function

    def __call__(self, x: Any) -> Any:
        return self.function(x)


def _width_height(x: Any) -> tuple[int, int]:
    if isinstance(x, torch.Tensor):
        return int(x.shape[-1]), int(x.shape[-2])
    return x.size


class Resize:
    """Resize to ``size`` x ``size`` (bilinear)."""

    def __init__(self, size: int, interpolation: Any = None) -> None:
        self.size = size

    def __call__(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            resized = torch.nn.functional.interpolate(
                x[None].float(), size=(self.size, self.size), mode="bilinear", align_corners=False
            )
            return resized[0]
        from PIL import Image

        return x.resize((self.size, self.size), Image.BILINEAR)


class CenterCrop:
    """Crop the central ``size`` x ``size`` square."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: Any) -> Any:
        width, height = _width_height(x)
        left, top = (width - self.size) // 2, (height - self.size) // 2
        if isinstance(x, torch.Tensor):
            return x[..., top : top + self.size, left : left + self.size]
        return x.crop((left, top, left + self.size, top + self.size))


class RandomCrop(CenterCrop):
    """Crop a ``size`` x ``size`` square at a random place."""

    def __call__(self, x: Any) -> Any:
        width, height = _width_height(x)
        left = int(torch.randint(0, width - self.size + 1, ()))
        top = int(torch.randint(0, height - self.size + 1, ()))
        if isinstance(x, torch.Tensor):
            return x[..., top : top + self.size, left : left + self.size]
        return x.crop((left, top, left + self.size, top + self.size))


class RandomHorizontalFlip:
    """Mirror left-right with probability one half."""

    def __call__(self, x: Any) -> Any:
        if torch.rand(()) >= 0.5:
            return x
        if isinstance(x, torch.Tensor):
            return x.flip(-1)
        from PIL import Image

        return x.transpose(Image.FLIP_LEFT_RIGHT)


class ToTensor:
    """A PIL image as a float CHW tensor in [0, 1]."""

    def __call__(self, image: Any) -> torch.Tensor:
        array = np.asarray(image, dtype=np.float32) / 255.0
        return torch.from_numpy(array).permute(2, 0, 1).contiguous()


class PILToTensor:
    """A PIL image as a CHW tensor of its own dtype."""

    def __call__(self, image: Any) -> torch.Tensor:
        array = np.array(image)
        tensor = torch.from_numpy(array)
        return tensor.permute(2, 0, 1).contiguous() if array.ndim == 3 else tensor[None]


class ConvertImageDtype:
    """Integers scaled to [0, 1] in ``dtype``; floats only cast."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point():
            return x.to(self.dtype)
        return x.to(self.dtype) / float(torch.iinfo(x.dtype).max)


class Normalize:
    """``(x - mean) / std`` per channel."""

    def __init__(self, mean: list[float], std: list[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std
