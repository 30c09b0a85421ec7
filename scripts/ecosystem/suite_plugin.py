"""pytest plugin for the ecosystem suites on this machine (``-p suite_plugin``), both sides alike.

No GPU: trl's configs default to ``bf16=True``, and ``TrainingArguments`` refuses bf16 without a GPU
unless ``use_cpu=True`` ("Your setup doesn't support bf16/gpu. You need to assign use_cpu ...").
trl's suites run on GPU machines upstream, so on this CPU machine nearly every trl trainer test
would stop there, before reaching accelerate. This plugin does what a CPU user does: it sets
``use_cpu=True`` on every ``TrainingArguments`` (and subclass) when torch sees no GPU. It is
loaded the same way for real accelerate and for hasten-as-accelerate. transformers' own tests are
written for CPU machines and run without it (``SUITE_USE_CPU=0``, set by ``suites.sh``).

GPU-gated tests on CPU processes (``SUITE_CPU_DEVICES=N``): transformers' multi-device Trainer tests
start ``torchrun`` / ``accelerate launch`` with one process per device and skip below two devices.
Their scripts are device-agnostic, so the plugin reports N devices for ``cpu`` and they run as N
CPU processes with gloo, as Accelerate's own conformance run does with its GPU-gated tests.

No hub: peft's ``hub_online_once`` turns ``HF_HUB_OFFLINE`` off the first time a test loads a
model id, and huggingface_hub then retries the unreachable hub with back-off (about a minute a
test here). The plugin makes every model id count as seen, so the suite stays offline as asked.
"""

from __future__ import annotations

import os
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

    use_cpu = os.environ.get("SUITE_USE_CPU", "1")  # noqa: TID251 - runs outside hasten
    if torch.cuda.is_available() or use_cpu == "0":
        return
    post_init = transformers.TrainingArguments.__post_init__

    def cpu_post_init(self: Any, *args: Any, **kwargs: Any) -> None:
        self.use_cpu = True
        post_init(self, *args, **kwargs)

    transformers.TrainingArguments.__post_init__ = cpu_post_init  # type: ignore[method-assign]


def _cpu_devices() -> None:
    devices = os.environ.get("SUITE_CPU_DEVICES")  # noqa: TID251 - runs outside hasten
    if not devices:
        return
    from transformers import testing_utils

    testing_utils.BACKEND_DEVICE_COUNT["cpu"] = lambda: int(devices)


_cpu_devices()
_patch()
