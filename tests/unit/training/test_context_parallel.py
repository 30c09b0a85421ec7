"""Context parallelism: a no-op without cp, refused on the CPU, sharded SDPA on 2+ GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hasten.config.parallelism import ParallelismConfig
from hasten.training.context_parallel import maybe_context_parallel


def test_without_context_parallelism_buffers_are_untouched() -> None:
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    x = torch.arange(12.0).reshape(1, 12)
    with accelerator.maybe_context_parallel(buffers=[x], buffer_seq_dims=[1]):
        assert x.shape == (1, 12)
    with maybe_context_parallel(None, None, buffers=[x], buffer_seq_dims=[1]):
        assert x.tolist() == [list(range(12))]


def test_buffers_need_one_sequence_dim_each() -> None:
    config = ParallelismConfig(dp_shard_size=1, cp_size=2)
    with (
        pytest.raises(ValueError, match="got 2 buffers but 1 buffer_seq_dims"),
        maybe_context_parallel(config, None, [torch.ones(2), torch.ones(2)], [0]),
    ):
        pass


def test_context_parallel_on_the_cpu_says_it_needs_a_gpu() -> None:
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    with pytest.raises(ValueError, match=r"cp_size=2\): context parallelism needs a GPU"):
        Accelerator(
            cpu=True,
            parallelism_config=ParallelismConfig(dp_shard_size=1, cp_size=2),
            fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        )


_GPU_SCRIPT = """
import torch, torch.nn.functional as F
from hasten import Accelerator
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.config.parallelism import ParallelismConfig
from torch.distributed.tensor.experimental import context_parallel_unshard
n = torch.cuda.device_count()
acc = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=1, cp_size=n),
                  fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 64, 16, device=acc.device) for _ in range(3))
full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
with acc.maybe_context_parallel(buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
    assert q.shape[2] == 64 // n, q.shape
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (out,) = context_parallel_unshard(acc.torch_device_mesh["cp"], [out], [2])
assert q.shape[2] == 64  # restored
torch.testing.assert_close(out, full, rtol=1e-4, atol=1e-4)
print("cp ok", acc.context_parallel_rank)
"""


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="context parallelism needs 2+ GPUs")
def test_context_parallel_attention_matches_full_attention(tmp_path: Path) -> None:
    script = tmp_path / "cp.py"
    script.write_text(_GPU_SCRIPT)
    hasten = Path(sys.executable).parent / "hasten"
    count = str(torch.cuda.device_count())
    done = subprocess.run(
        [str(hasten), "launch", "--num_processes", count, str(script)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("cp ok") == int(count)
