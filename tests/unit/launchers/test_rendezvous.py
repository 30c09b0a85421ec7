from __future__ import annotations

import os

import pytest

from hasten.launchers.elastic import launch_config
from hasten.launchers.plan import LaunchPlan
from hasten.launchers.rendezvous import (
    ELASTIC_RDZV_DEFAULTS,
    check_min_processes,
    fresh_worker_store,
    parse_nnodes,
    parse_rdzv_conf,
    rdzv_configs,
)


def test_parse_nnodes_fixed_and_range() -> None:
    assert parse_nnodes("2") == (2, 2)
    assert parse_nnodes("1:4") == (1, 4)


@pytest.mark.parametrize("text", ["", "a", "0:2", "1:2:3", "1:x"])
def test_parse_nnodes_refuses_non_counts(text: str) -> None:
    with pytest.raises(ValueError, match="pass N .* or MIN:MAX"):
        parse_nnodes(text)


def test_parse_nnodes_refuses_min_above_max() -> None:
    with pytest.raises(ValueError, match="MIN=3 > MAX=1; pass --nnodes 1:3"):
        parse_nnodes("3:1")


def test_parse_rdzv_conf() -> None:
    assert parse_rdzv_conf("") == {}
    assert parse_rdzv_conf("last_call_timeout=1, join_timeout=60") == {
        "last_call_timeout": "1",
        "join_timeout": "60",
    }
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        parse_rdzv_conf("last_call_timeout")


def test_rdzv_configs_elastic_defaults_and_user_override() -> None:
    configs = rdzv_configs("c10d", 0, True, {"last_call_timeout": "5"})
    assert configs["is_host"] is True
    assert configs["last_call_timeout"] == "5"
    assert configs["keep_alive_interval"] == ELASTIC_RDZV_DEFAULTS["keep_alive_interval"]
    assert rdzv_configs("c10d", 1, False, {}) == {"is_host": False}
    assert rdzv_configs("static", 1, False, {}) == {"rank": 1}


def test_launch_config_elastic_range() -> None:
    plan = LaunchPlan("t.py", num_processes=4, num_machines=2, min_machines=1, rdzv_backend="c10d")
    assert plan.is_elastic
    config = launch_config(plan, port=1234)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 2, 2)
    assert config.rdzv_configs["last_call_timeout"] == ELASTIC_RDZV_DEFAULTS["last_call_timeout"]


def test_plan_refuses_elastic_range_on_static() -> None:
    with pytest.raises(ValueError, match="needs the c10d rendezvous.*--rdzv_backend c10d"):
        LaunchPlan("t.py", num_processes=2, num_machines=2, min_machines=1)


def test_plan_refuses_min_outside_range() -> None:
    with pytest.raises(ValueError, match=r"min_machines must be in \[1, num_machines=2\]"):
        LaunchPlan("t.py", num_processes=2, num_machines=2, min_machines=3, rdzv_backend="c10d")


def test_min_that_cannot_hold_tensor_parallel_is_refused() -> None:
    env = {"PARALLELISM_CONFIG_TP_SIZE": "2"}
    with pytest.raises(ValueError, match=r"tp_size=2.*Raise MIN to at least 2 \(--nnodes 2:MAX\)"):
        check_min_processes(env, min_machines=1, nproc_per_node=1)
    check_min_processes(env, min_machines=1, nproc_per_node=2)  # 2 processes hold TP=2
    check_min_processes({"PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2"}, 1, 1)  # DP shrinks


def test_fresh_worker_store_set_for_c10d_keeps_user_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    fresh_worker_store("static")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ
    fresh_worker_store("c10d")
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0")
    fresh_worker_store("c10d")
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"
