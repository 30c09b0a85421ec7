"""Import cost, guarded by what is imported (never by a time): `from hasten import Accelerator`
loads only the modules every run needs; checkpointing, data loading, trackers, collectives,
kwargs handlers, fp8, profiling and the other engines load when a script first uses them.

The timing itself is measured by benchmarks/bench_import.py.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

#: Every module `from hasten import Accelerator` loads after `import torch`. A module joining
#: this list costs every script: import it where it is used instead, or add it here on purpose.
ACCELERATOR_IMPORTS = {
    "hasten",
    "hasten._version",
    "hasten.accelerator",
    "hasten.config",
    "hasten.config.dynamo",
    "hasten.config.enums",
    "hasten.config.envvars",
    "hasten.config.handler",
    "hasten.config.project",
    "hasten.core",
    "hasten.core.coerce",
    "hasten.core.constants",
    "hasten.core.environment",
    "hasten.core.errors",
    "hasten.core.imports",
    "hasten.core.lazy",
    "hasten.core.nested",
    "hasten.core.versions",
    "hasten.optimizer",
    "hasten.platforms",
    "hasten.platforms.base",
    "hasten.platforms.checks",
    "hasten.platforms.cpu",
    "hasten.platforms.cuda",
    "hasten.platforms.mps",
    "hasten.platforms.npu",
    "hasten.platforms.numa",
    "hasten.platforms.registry",
    "hasten.platforms.xpu",
    "hasten.precision",
    "hasten.precision.amp",
    "hasten.precision.base",
    "hasten.precision.select",
    "hasten.scheduler",
    "hasten.state",
    "hasten.state._shared",
    "hasten.state.accelerator_state",
    "hasten.state.detect",
    "hasten.state.engine",
    "hasten.state.environments",
    "hasten.state.gradient",
    "hasten.state.mesh",
    "hasten.state.partial",
    "hasten.state.recorder",
    "hasten.state.split",
    "hasten.state.teardown",
    "hasten.strategies",
    "hasten.strategies.base",
    "hasten.strategies.call",
    "hasten.strategies.ddp",
    "hasten.strategies.rebind",
    "hasten.strategies.select",
    "hasten.strategies.single",
    "hasten.strategies.unwired",
    "hasten.strategies.unwrap",
    "hasten.training",
    "hasten.training.accumulation",
    "hasten.training.arguments",
    "hasten.training.prepare",
}

#: Packages a plain training step (build, prepare, forward, backward, step) never needs.
NOT_FOR_A_PLAIN_STEP = (
    "hasten.big_modeling",
    "hasten.checkpointing",
    "hasten.commands",
    "hasten.config.kwargs",
    "hasten.config.parallelism",
    "hasten.launchers",
    "hasten.ops.collectives",
    "hasten.precision.fp8",
    "hasten.strategies.deepspeed",
    "hasten.strategies.fsdp",
    "hasten.strategies.megatron",
    "hasten.tracking",
    "hasten.training.metrics",
    "hasten.training.profiling",
    "hasten.utils",
)

_LOADED = """
import json, sys
import torch
before = set(sys.modules)
from hasten import Accelerator
imported = sorted(set(sys.modules) - before)
before = set(sys.modules)
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.backward(model(torch.randn(3, 4)).sum())
optimizer.step()
optimizer.zero_grad()
stepped = sorted(set(sys.modules) - before)
print(json.dumps({"imported": imported, "stepped": stepped}))
"""


@functools.cache
def _loaded() -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _LOADED], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    loaded: dict[str, list[str]] = json.loads(result.stdout.splitlines()[-1])
    return loaded


def test_accelerator_import_loads_only_the_listed_modules() -> None:
    imported = set(_loaded()["imported"])
    added = sorted(imported - ACCELERATOR_IMPORTS)
    gone = sorted(ACCELERATOR_IMPORTS - imported)
    assert not added, (
        f"`from hasten import Accelerator` now also loads {added}: import them where they are "
        "used (a method, or a lazy package table), or list them in ACCELERATOR_IMPORTS on purpose"
    )
    assert not gone, f"no longer loaded by the Accelerator import, drop from the list: {gone}"


def test_a_plain_training_step_loads_no_unused_part() -> None:
    loaded = _loaded()
    every = [*loaded["imported"], *loaded["stepped"]]
    unused = sorted(m for m in every if m.startswith(NOT_FOR_A_PLAIN_STEP))
    assert not unused, f"a plain training step loaded parts it does not use: {unused}"
