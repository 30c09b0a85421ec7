"""pytest plugin for the ecosystem suites on this machine (``-p suite_plugin``), both sides alike.

No GPU: trl's configs default to ``bf16=True``, and ``TrainingArguments`` refuses bf16 without a GPU
unless ``use_cpu=True`` ("Your setup doesn't support bf16/gpu. You need to assign use_cpu ...").
trl's suites run on GPU machines upstream, so on this CPU machine nearly every trl trainer test
would stop there, before reaching accelerate. This plugin does what a CPU user does: it sets
``use_cpu=True`` on every ``TrainingArguments`` (and subclass) when torch sees no GPU. It is
loaded the same way for real accelerate and for hasten-as-accelerate.

No hub: peft's ``hub_online_once`` turns ``HF_HUB_OFFLINE`` off the first time a test loads a
model id, and huggingface_hub then retries the unreachable hub with back-off (about a minute a
test here). The plugin makes every model id count as seen, so the suite stays offline as asked.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["pytest_collection_finish"]


class _AlwaysSeen(dict):  # type: ignore[type-arg]
    """peft's record of hub accesses, answering "already fetched" for every model id."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: object) -> int:
        return 0


def pytest_collection_finish(session: Any) -> None:
    for module in list(sys.modules.values()):
        if isinstance(getattr(module, "_HUB_MODEL_ACCESSES", None), dict):
            module._HUB_MODEL_ACCESSES = _AlwaysSeen()


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
