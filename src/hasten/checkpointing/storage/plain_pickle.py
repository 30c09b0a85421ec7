"""A fast restricted unpickler: plain data, tensors and numpy arrays, nothing that could run code.

torch's ``weights_only`` unpickler is written in Python: an RNG-state file (a 625-integer tuple,
a numpy array) takes it about 2 ms, where the C unpickler takes 0.2. `RestrictedUnpickler` is the
C unpickler with a ``find_class`` that allows only an explicit list of globals (called once per
distinct global, so at C speed); `PLAIN_PICKLE` is it as the pickle module ``torch.load`` and
torch's archive decoder take. Whatever it refuses raises `UnsafeCheckpointError`; callers that
want torch's wider ``weights_only`` list then hand the file to it (see
`hasten.checkpointing.storage.reader.unpickle_buffer`).
"""

from __future__ import annotations

import _compat_pickle
import pickle
import types
from collections.abc import Collection
from typing import Any

import torch

from hasten.checkpointing.storage.io import UnsafeCheckpointError, safe_globals

__all__ = ["PLAIN_GLOBALS", "PLAIN_PICKLE", "RestrictedUnpickler"]

# "module.name" of what plain data and tensors pickle to (torch's storages reach torch's
# archive decoder as names and are resolved by it before any find_class)
PLAIN_GLOBALS = frozenset(
    {
        *(
            f"builtins.{name}"
            for name in ("bool", "bytearray", "complex", "dict", "frozenset", "list", "set")
        ),
        *("builtins.slice", "builtins.tuple"),
        "_codecs.encode",  # bytes under pickle protocol 2 (numpy arrays' data); weights_only allows it
        "collections.OrderedDict",
        "torch.Size",
        "torch._utils._rebuild_tensor_v2",
    }
)
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)


class RestrictedUnpickler(pickle.Unpickler):
    """The C unpickler refusing every global but `allowed`'s and torch's dtypes and layouts.

    By default `PLAIN_GLOBALS` and the numpy RNG types of `safe_globals` (with what a user
    appended there); subclasses narrow or change the list and the refusal's wording.
    """

    source: object = None

    def allowed(self) -> Collection[str]:
        """The globals this unpickler constructs, as ``"module.name"``."""
        extra = {f"{obj.__module__}.{obj.__qualname__}" for obj in safe_globals()}
        return PLAIN_GLOBALS | extra

    def refusal(self, name: str) -> UnsafeCheckpointError:
        """The error for a pickle holding the global ``name``."""
        return UnsafeCheckpointError(
            f"Refused to unpickle {self.source or 'a checkpoint entry'}: it holds {name}, beyond "
            "plain data, tensors and numpy arrays (other objects could run code when loaded)."
        )

    def find_class(self, module: str, name: str) -> Any:
        # protocol 2 (torch.save's) names Python 2's modules, e.g. __builtin__.set: what the
        # C unpickler maps them to is what is checked
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        allowed = self.__dict__.get("_allowed")
        if allowed is None:
            allowed = self.__dict__["_allowed"] = self.allowed()
        if f"{module}.{name}" in allowed:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_VALUES):
            return getattr(torch, name)  # torch.float32, torch.strided, torch.channels_last...
        raise self.refusal(f"{module}.{name}")


PLAIN_PICKLE = types.ModuleType("hasten_plain_pickle")  # what torch's loaders call Unpickler on
PLAIN_PICKLE.Unpickler = RestrictedUnpickler  # type: ignore[attr-defined]
PLAIN_PICKLE.load = lambda file, **kwargs: RestrictedUnpickler(file, **kwargs).load()  # type: ignore[attr-defined]
