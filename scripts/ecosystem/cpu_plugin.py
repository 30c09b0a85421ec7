"""pytest plugin for the ecosystem suites on a machine without a GPU (``-p cpu_plugin``).

trl's configs default to ``bf16=True``, and ``TrainingArguments`` refuses bf16 without a GPU
unless ``use_cpu=True`` ("Your setup doesn't support bf16/gpu. You need to assign use_cpu ...").
trl's suites run on GPU machines upstream, so on this CPU machine nearly every trl trainer test
would stop there, before reaching accelerate. This plugin does what a CPU user does: it sets
``use_cpu=True`` on every ``TrainingArguments`` (and subclass) when torch sees no GPU. It is
loaded the same way for real accelerate and for hasten-as-accelerate.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def _patch() -> None:
    import torch
    import transformers

    if torch.cuda.is_available():
        return
    post_init = transformers.TrainingArguments.__post_init__

    def cpu_post_init(self: Any, *args: Any, **kwargs: Any) -> None:
        self.use_cpu = True
        post_init(self, *args, **kwargs)

    transformers.TrainingArguments.__post_init__ = cpu_post_init  # type: ignore[method-assign]


_patch()
