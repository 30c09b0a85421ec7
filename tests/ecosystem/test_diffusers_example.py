"""diffusers' unconditional image generation example script, unchanged, on hasten-as-accelerate.

diffusers ships its example scripts in its source repository only (not in its package archives),
and the tests download nothing and copy no foreign code here: point ``HASTEN_DIFFUSERS_EXAMPLES``
at a diffusers checkout's ``examples`` folder (or the checkout) to run this test; it skips without
one. The script trains a tiny UNet (from a config written here) on 8 random images through
``accelerate launch --config_file``, with EMA, so its save/load-state hooks write and read the
checkpoints; a second launch resumes from the latest checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _support.ecosystem import SCRIPTS, launch_config, require_alias

pytestmark = [pytest.mark.ecosystem, pytest.mark.timeout(900)]

_SCRIPT = Path("unconditional_image_generation") / "train_unconditional.py"
_UNET = {
    "_class_name": "UNet2DModel",
    "sample_size": 8,
    "in_channels": 3,
    "out_channels": 3,
    "layers_per_block": 1,
    "block_out_channels": [8, 16],
    "down_block_types": ["DownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "UpBlock2D"],
    "norm_num_groups": 4,
}


def _example_script() -> Path:
    root = os.environ.get("HASTEN_DIFFUSERS_EXAMPLES")
    if not root:
        pytest.skip(
            "set HASTEN_DIFFUSERS_EXAMPLES to a diffusers checkout's examples folder: diffusers "
            "publishes its example scripts in its repository only, and tests download nothing"
        )
    for candidate in (Path(root) / _SCRIPT, Path(root) / "examples" / _SCRIPT):
        if candidate.is_file():
            return candidate
    pytest.fail(f"HASTEN_DIFFUSERS_EXAMPLES={root!r} has no {_SCRIPT}")


def _launch(config: Path, script: Path, args: list[str]) -> str:
    runner = SCRIPTS / "diffusers_runner.py"
    command = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file"]
    command += [str(config), str(runner), str(script), *args]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=800)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output


def test_unconditional_example_trains_checkpoints_with_its_hooks_and_resumes(
    tmp_path: Path,
) -> None:
    require_alias()
    pytest.importorskip("diffusers", reason="diffusers is not installed (make install)")
    pytest.importorskip("datasets", reason="datasets is not installed (make install)")
    script = _example_script()
    from PIL import Image

    images = tmp_path / "images" / "train"
    images.mkdir(parents=True)
    import numpy as np

    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(images / f"{i}.png")
    unet = tmp_path / "unet_config"
    unet.mkdir()
    (unet / "config.json").write_text(json.dumps(_UNET))
    out = tmp_path / "out"
    config = launch_config(tmp_path, "NO", num_processes=1)
    args = [
        "--train_data_dir", str(images.parent), "--model_config_name_or_path", str(unet),
        "--resolution", "8", "--train_batch_size", "2", "--eval_batch_size", "2",
        "--checkpointing_steps", "2", "--save_images_epochs", "10", "--save_model_epochs", "10",
        "--ddpm_num_steps", "10", "--ddpm_num_inference_steps", "2", "--use_ema",
        "--output_dir", str(out), "--logger", "tensorboard", "--dataloader_num_workers", "0",
        "--mixed_precision", "no", "--lr_warmup_steps", "0",
    ]  # fmt: skip
    _launch(config, script, [*args, "--num_epochs", "2"])
    checkpoint = out / "checkpoint-8"  # 8 images, batches of 2, 2 epochs
    # The save hook wrote the UNet and its EMA in diffusers' format, in place of the model file
    # save_state would write: the hook took the weights out of the list.
    assert (checkpoint / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    assert (checkpoint / "unet_ema" / "diffusion_pytorch_model.safetensors").is_file()
    assert not list(checkpoint.glob("model*.safetensors"))
    assert (checkpoint / "optimizer.bin").is_file() and (checkpoint / "scheduler.bin").is_file()
    assert (out / "model_index.json").is_file()  # the pipeline saved at the end
    assert list((out / "logs").rglob("events.out.tfevents.*"))  # tensorboard, main process

    # Resumed: the load hook rebuilds the UNet and its EMA from the checkpoint (there is no
    # model file for save_state's loader), then training continues to epoch 3.
    output = _launch(
        config, script, [*args, "--num_epochs", "3", "--resume_from_checkpoint", "latest"]
    )
    assert "Resuming from checkpoint checkpoint-8" in output
    assert (out / "checkpoint-12" / "unet_ema" / "diffusion_pytorch_model.safetensors").is_file()
