from __future__ import annotations

import pytest

from hasten.launchers.slurm import expand_nodelist, first_host, slurm_topology


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node[01-04]", ["node01", "node02", "node03", "node04"]),
        ("node[01-02,07],gpu5", ["node01", "node02", "node07", "gpu5"]),
        ("a1,a2", ["a1", "a2"]),
        ("host-[3,5-6]", ["host-3", "host-5", "host-6"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("localhost", ["localhost"]),
        ("127.0.0.1", ["127.0.0.1"]),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


def test_first_host_takes_first_of_first_range() -> None:
    assert first_host("node[09-12],other") == "node09"


@pytest.mark.parametrize("bad", ["node[a-b]", "node[1-x]"])
def test_malformed_range_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="Cannot parse the range"):
        expand_nodelist(bad)


def test_empty_nodelist_is_an_error() -> None:
    with pytest.raises(ValueError, match="names no host"):
        expand_nodelist(" , ")


def test_topology_from_srun_task() -> None:
    environ = {
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": "2",
        "SLURM_NNODES": "4",
        "SLURM_NODEID": "2",
        "SLURM_JOB_NODELIST": "node[01-04]",
    }
    assert slurm_topology(environ) == {
        "num_machines": 4,
        "machine_rank": 2,
        "main_process_ip": "node01",
    }


def test_topology_needs_srun_inside_an_allocation() -> None:
    # sbatch shell without srun: no SLURM_PROCID -> nothing is inferred.
    assert slurm_topology({"SLURM_JOB_ID": "42", "SLURM_NNODES": "4"}) == {}
    assert slurm_topology({"SLURM_PROCID": "0", "SLURM_NNODES": "4"}) == {}
