"""Ray Train: hasten's Accelerator inside TorchTrainer's loop, with Ray's checkpoints.

Two CPU workers; Ray makes the process group, hasten adopts it (and leaves it to Ray). Each
worker saves into a temporary folder of its own and reports it; Ray copies the workers' folders
into one checkpoint, which a new ``fit()`` resumes from exactly. FSDP2 saves sharded into a
folder both workers share. One Ray cluster (few CPUs, no dashboard, temporary folders under
pytest's) serves the whole module: Ray starts slowly.

Run with ``make test-clusters`` (the ``clusters`` marker; not part of ``make test``: a fit takes
tens of seconds here).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ray[train]')")
# the workers unpickle the training loop: send this module's functions by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.distributed, pytest.mark.clusters]

STEPS, SAVE_AT = 6, 3


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit
    os.environ["RAY_DEDUP_LOGS"] = "0"
    ray.init(num_cpus=3, include_dashboard=False, _temp_dir=temp, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _fit(loop: Any, config: dict[str, Any], storage: Path) -> Any:
    """One ``fit()``; a second one with the same storage and name resumes from the run's newest
    checkpoint (Ray Train hands it to the loop as ``ray.train.get_checkpoint()``)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=str(storage), name="run"),
    )
    return trainer.fit()


def _accelerator(fsdp: bool) -> Any:
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if fsdp else None
    return Accelerator(cpu=True, fsdp_plugin=plugin)


def _train_loop(config: dict[str, Any]) -> None:  # runs in each Ray worker
    import json

    import ray.train
    import torch.distributed as dist
    from ray.train import Checkpoint

    from hasten.utils import set_seed

    accelerator = _accelerator(config["fsdp"])
    assert not accelerator.state.owns_process_group  # Ray's group, adopted
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    start = 0
    resumed = ray.train.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as folder:
            accelerator.load_state(os.path.join(folder, "ckpt"))
            start = json.loads(Path(folder, "step.json").read_text())["step"]
    losses = []
    for step in range(start, STEPS):
        x = torch.randn(4, 8) + accelerator.process_index  # from the saved RNG states
        loss = model(x).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if step + 1 == SAVE_AT and resumed is None:
            shared = config["shared"]
            with tempfile.TemporaryDirectory() as own:
                folder = shared if shared else own  # a folder every worker sees, or its own
                accelerator.save_state(os.path.join(folder, "ckpt"))
                Path(folder, "step.json").write_text(json.dumps({"step": SAVE_AT}))
                report = accelerator.is_main_process or not shared
                checkpoint = Checkpoint.from_directory(folder) if report else None
                ray.train.report({"step": step + 1}, checkpoint=checkpoint)
    accelerator.end_training()
    out = Path(config["out"], f"{'resumed' if resumed else 'first'}_{accelerator.process_index}")
    out.write_text(json.dumps({"losses": losses, "group_alive": dist.is_initialized()}))


def _results(out: Path, phase: str) -> list[dict[str, Any]]:
    import json

    return [json.loads((out / f"{phase}_{rank}").read_text()) for rank in (0, 1)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("fsdp", "shared"),
    [(False, False), (False, True), (True, True)],
    ids=["per-worker-folders", "shared-folder", "fsdp2-shared-folder"],
)
def test_save_report_and_resume_in_a_new_fit(
    ray_cluster: None, tmp_path: Path, fsdp: bool, shared: bool
) -> None:
    config = {"fsdp": fsdp, "shared": str(tmp_path / "shared") if shared else "", "out": ""}
    config["out"] = str(tmp_path)
    first = _fit(_train_loop, config, tmp_path / "storage")
    assert first.error is None
    merged = Path(first.checkpoint.path) / "ckpt"
    names = {p.name for p in merged.iterdir()}
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= names
    if not shared:  # Ray copied both workers' folders into one, manifests included
        assert {"hasten_manifest.json", "hasten_manifest_1.json", "model.safetensors"} <= names
    resumed = _fit(_train_loop, config, tmp_path / "storage")  # a new fit of the same run
    assert resumed.error is None
    for before, after in zip(_results(tmp_path, "first"), _results(tmp_path, "resumed")):
        assert after["losses"] == before["losses"][SAVE_AT:]  # continues exactly
        assert before["group_alive"] and after["group_alive"]  # end_training left Ray's group
