"""Elastic node counts and the c10d rendezvous settings `hasten launch` gives torch elastic.

``--nnodes MIN:MAX`` lets the job run on any number of machines in that range: when one is
lost, the agents left meet again (a new rendezvous round) and restart their workers at the
new world size; a machine that comes back joins at the next round. How fast that happens is
set by torch's dynamic rendezvous, not by hasten: a dead machine is dropped once it has missed
``keep_alive_interval x keep_alive_max_attempt`` seconds of heartbeats, and a round with at
least MIN machines closes ``last_call_timeout`` seconds after it could. Torch's defaults
(5 s x 3 and 30 s) made a lost machine cost ~45 s; `ELASTIC_RDZV_DEFAULTS` brings that to a
few seconds, and no shorter (see its comment). ``--rdzv_conf KEY=VALUE,...`` overrides them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from hasten.config import envvars

__all__ = [
    "ELASTIC_RDZV_DEFAULTS",
    "check_min_processes",
    "fresh_worker_store",
    "parse_nnodes",
    "parse_rdzv_conf",
    "rdzv_configs",
]

# c10d rendezvous settings (seconds / counts) for elastic runs; each is a documented key of
# torch's DynamicRendezvousHandler. Shorter was measured to break: with heartbeats 1 s x 2 on
# 2 loaded cores a machine that joined late declared the running one dead and trained alone
# (two groups at world size 1 on one checkpoint folder). With these, a late machine waits in
# the rendezvous, the running agents see it and restart once, and both go on at world size 2.
ELASTIC_RDZV_DEFAULTS: Mapping[str, str] = {
    "join_timeout": "600",
    "last_call_timeout": "2",
    "keep_alive_interval": "1",
    "keep_alive_max_attempt": "5",
}

_SIZE_VARIABLES = (
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE",
    "PARALLELISM_CONFIG_DP_SHARD_SIZE",
    "PARALLELISM_CONFIG_TP_SIZE",
    "PARALLELISM_CONFIG_CP_SIZE",
    "PARALLELISM_CONFIG_SP_SIZE",
)


def parse_nnodes(text: str) -> tuple[int, int]:
    """Parse ``--nnodes N`` or ``--nnodes MIN:MAX`` into (min, max) machine counts.

    Raises:
        ValueError: not one or two positive integers, or MIN > MAX.
    """
    parts = text.split(":")
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or min(numbers, default=0) < 1:
        raise ValueError(
            f"--nnodes {text!r} is not a machine count: pass N (a fixed number of machines) or "
            "MIN:MAX (an elastic range), e.g. --nnodes 2 or --nnodes 1:4."
        )
    low, high = numbers[0], numbers[-1]
    if low > high:
        raise ValueError(
            f"--nnodes {text!r} has MIN={low} > MAX={high}; pass --nnodes {high}:{low}."
        )
    return low, high


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """Parse ``--rdzv_conf key=value,key=value`` (torchrun's format) into a dict.

    Raises:
        ValueError: an item is not ``key=value``.
    """
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"--rdzv_conf item {item!r} is not KEY=VALUE; pass e.g. "
                "--rdzv_conf last_call_timeout=2,keep_alive_interval=1."
            )
        values[key.strip()] = value.strip()
    return values


def rdzv_configs(
    backend: str, machine_rank: int, elastic: bool, user: Mapping[str, str]
) -> dict[str, object]:
    """The ``rdzv_configs`` of torch's ``LaunchConfig``: hasten's settings, then the user's."""
    configs: dict[str, object] = {}
    if backend == "static":
        configs["rank"] = machine_rank
    elif backend == "c10d":
        # Machine 0 hosts the store; on loopback every agent would otherwise claim to be host.
        configs["is_host"] = machine_rank == 0
        if elastic:
            configs.update(ELASTIC_RDZV_DEFAULTS)
    configs.update(user)
    return configs


def fresh_worker_store(backend: str) -> None:
    """Make each c10d rendezvous round give its workers a new store, in this (the agent's) env.

    Torch 2.13 shares one TCPStore server between the rank-0 agent and its workers and keeps it
    across rounds, but ``init_process_group(init_method="env://")`` in the workers writes its
    gloo/nccl addresses under the same keys every round. After a machine is lost the restarted
    workers read the previous round's addresses (connectFullMesh: timed out / connection
    refused) or wait for peers of the old world size, until the restarts run out. Torch's
    documented opt-out, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, has rank 0 host a store on a
    new port each round; a value the user set is kept.
    """
    if backend == "c10d" and envvars.read("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") is None:
        envvars.write("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


def check_min_processes(env: Mapping[str, str], min_machines: int, nproc_per_node: int) -> None:
    """Refuse an elastic range whose smallest world cannot hold the parallelism config.

    Raises:
        ValueError: the model-parallel sizes (TP x CP x SP, and the shard size) need more
            processes than ``min_machines x nproc_per_node``, or do not divide it.
    """
    sizes = {name: int(env[name]) for name in _SIZE_VARIABLES if env.get(name)}
    fixed = {
        name: size
        for name, size in sizes.items()
        if name != "PARALLELISM_CONFIG_DP_REPLICATE_SIZE" and size > 1
    }
    needed = math.prod(fixed.values())
    smallest = min_machines * nproc_per_node
    if needed <= 1 or smallest % needed == 0:
        return
    shown = " x ".join(
        f"{name.removeprefix('PARALLELISM_CONFIG_').lower()}={size}" for name, size in fixed.items()
    )
    step = needed // math.gcd(needed, nproc_per_node)
    fit = -(-min_machines // step) * step
    raise ValueError(
        f"--nnodes MIN={min_machines} with {nproc_per_node} process(es) per machine gives "
        f"{smallest} process(es) after losing machines, but the parallelism config ({shown}) "
        f"needs a multiple of {needed}. Raise MIN to at least {fit} (--nnodes {fit}:MAX) or "
        "shrink the model-parallel sizes."
    )
