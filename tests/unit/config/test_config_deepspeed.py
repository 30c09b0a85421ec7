"""config.deepspeed: DeepSpeedPlugin config building, auto filling, mismatches, selection."""

from __future__ import annotations

import base64
import json
import sys

import pytest

from hasten.config.deepspeed import DeepSpeedPlugin, HfDeepSpeedConfig
from hasten.config.envvars import read_prefixed


@pytest.fixture(autouse=True)
def _no_deepspeed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in read_prefixed("ACCELERATE_"):
        monkeypatch.delenv(name)


def test_defaults_build_a_zero2_config() -> None:
    plugin = DeepSpeedPlugin()
    config = plugin.deepspeed_config
    assert plugin.zero_stage == 2
    assert config["zero_optimization"]["stage"] == 2
    assert config["gradient_accumulation_steps"] == "auto"
    assert config["gradient_clipping"] == "auto"
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "none", "nvme_path": None}
    assert config["steps_per_print"] == float("inf")
    assert plugin.zero3_init_flag is False
    assert plugin.selected is False


def test_fields_come_from_the_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "1.5")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "nvme")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", "/nvme")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "true")
    plugin = DeepSpeedPlugin()
    config = plugin.deepspeed_config
    assert (plugin.zero_stage, plugin.gradient_accumulation_steps, plugin.gradient_clipping) == (
        3,
        4,
        1.5,
    )
    assert config["zero_optimization"]["offload_param"] == {"device": "nvme", "nvme_path": "/nvme"}
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert plugin.zero3_init_flag is True  # defaults to "is ZeRO-3"
    assert plugin.hf_ds_config.is_zero3() and plugin.hf_ds_config.is_offload()


def test_user_config_dict_is_copied_and_fields_follow_it() -> None:
    user = {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
        "train_micro_batch_size_per_gpu": "auto",
    }
    plugin = DeepSpeedPlugin(hf_ds_config=user, zero_stage=1)
    assert "gradient_accumulation_steps" not in user  # the caller's dict is untouched
    assert plugin.zero_stage == 3  # the file wins over the field
    assert plugin.offload_optimizer_device == "cpu"
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 1


def test_user_config_auto_values_are_filled_from_fields() -> None:
    user = {"zero_optimization": {"stage": "auto"}, "gradient_clipping": "auto"}
    plugin = DeepSpeedPlugin(hf_ds_config=user, zero_stage=1, gradient_clipping=0.3)
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 1
    assert plugin.deepspeed_config["gradient_clipping"] == 0.3


def test_config_from_file_json_and_base64(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = {"zero_optimization": {"stage": 1}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data))
    assert DeepSpeedPlugin(hf_ds_config=str(path)).zero_stage == 1
    assert HfDeepSpeedConfig(json.dumps(data)).get_value("zero_optimization.stage") == 1
    encoded = base64.urlsafe_b64encode(json.dumps(data).encode()).decode()
    assert HfDeepSpeedConfig(encoded).get_value("zero_optimization.stage") == 1


def test_config_file_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 0}}))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(path))
    assert DeepSpeedPlugin().zero_stage == 0


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"zero_stage": 4}, r"zero_stage=4\) must be one of \(0, 1, 2, 3\)"),
        (
            {"offload_param_device": "disk"},
            r"offload_param_device='disk'\) must be one of \['none', 'cpu', 'nvme'\]",
        ),
        (
            {"gradient_accumulation_steps": 0},
            r"gradient_accumulation_steps=0\) must be an int >= 1 or 'auto'",
        ),
        ({"hf_ds_config": {"train_batch_size": 8}}, r"no 'zero_optimization' section"),
        ({"hf_ds_config": "not json {"}, r"neither an existing JSON file"),
    ],
)
def test_errors(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DeepSpeedPlugin(**options)


def test_config_file_conflicts_with_launcher_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "zero_stage,mixed_precision")
    with pytest.raises(ValueError, match=r"launch settings \['zero_stage', 'mixed_precision'\]"):
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}})


def test_zero3_init_flag_needs_stage_3() -> None:
    with pytest.warns(UserWarning, match="only applies to ZeRO stage 3"):
        plugin = DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert plugin.zero3_init_flag is False
    assert plugin.is_zero3_init_enabled() is False


def test_deepspeed_config_process_fills_auto_and_reports_mismatches() -> None:
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "zero_optimization": {"stage": 2},
            "train_micro_batch_size_per_gpu": "auto",
            "optimizer": {"params": {"lr": "auto", "eps": 1e-8}},
        }
    )
    plugin.deepspeed_config_process(
        must_match=True,
        train_micro_batch_size_per_gpu=8,
        **{"optimizer.params.lr": 0.1, "optimizer.params.eps": 1e-8},
    )
    assert plugin.get_value("train_micro_batch_size_per_gpu") == 8
    assert plugin.get_value("optimizer.params.lr") == 0.1
    assert plugin.is_auto("optimizer.params.lr") is False
    with pytest.raises(
        ValueError, match=r"ds optimizer.params.eps=1e-08 vs hasten optimizer.params.eps=0.5"
    ):
        plugin.deepspeed_config_process(**{"optimizer.params.eps": 0.5})


def test_auto_value_without_counterpart_is_an_error() -> None:
    plugin = DeepSpeedPlugin(
        hf_ds_config={"zero_optimization": {"stage": 2}, "train_batch_size": "auto"}
    )
    assert plugin.is_auto("train_batch_size") is True
    with pytest.raises(ValueError, match=r"'train_batch_size' is 'auto' but hasten has no value"):
        plugin.deepspeed_config_process()


def test_set_mixed_precision() -> None:
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision("bf16")
    assert plugin.deepspeed_config["bf16"] == {"enabled": True}
    assert plugin.deepspeed_config["fp16"] == {"enabled": False}
    auto = DeepSpeedPlugin(
        hf_ds_config={"zero_optimization": {"stage": 2}, "fp16": {"enabled": "auto"}}
    )
    auto.set_mixed_precision("fp16")
    assert auto.deepspeed_config["fp16"]["enabled"] is True
    clash = DeepSpeedPlugin(
        hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    )
    with pytest.raises(ValueError, match=r"mixed_precision='fp16' conflicts.*enables bf16"):
        clash.set_mixed_precision("fp16")


def test_hf_deepspeed_config_queries() -> None:
    config = HfDeepSpeedConfig(
        {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}, "a": {"b": False}}
    )
    assert config.is_zero2() and not config.is_zero3()
    assert config.is_offload() is True
    assert config.find_config_node("zero_optimization.stage") == (
        config.config["zero_optimization"],
        "stage",
    )
    assert config.find_config_node("x.y.z") == (None, "z")
    assert config.get_value("missing.key", 5) == 5
    assert config.is_false("a.b") is True
    assert config.is_true("a.b") is False
    assert config.is_true("a.missing") is False and config.is_false("a.missing") is False
    config.del_config_sub_tree("a.b")
    assert config.config["a"] == {}
    config.del_config_sub_tree("a.gone")
    with pytest.raises(ValueError, match=r"no entry 'a.gone' to delete"):
        config.del_config_sub_tree("a.gone", must_exist=True)


def test_select_only_through_the_state() -> None:
    plugin = DeepSpeedPlugin()
    with pytest.raises(ValueError, match=r"call AcceleratorState\(\).select_deepspeed_plugin"):
        plugin.select()


def test_select_and_unselect(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = DeepSpeedPlugin()
    registered: list[object] = []
    monkeypatch.setattr(plugin, "set_deepspeed_weakref", lambda: registered.append(True))
    plugin.select(_from_accelerator_state=True)
    assert plugin.selected is True and registered == [True]
    plugin._unselect()
    assert plugin.selected is False


def test_select_without_deepspeed_installed_still_selects() -> None:
    plugin = DeepSpeedPlugin(zero_stage=2)
    plugin.select(_from_accelerator_state=True)
    assert plugin.selected is True


def test_zero3_init_without_deepspeed_names_the_pip_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hasten.config.deepspeed as module

    monkeypatch.setattr(module, "is_deepspeed_available", lambda: False)
    monkeypatch.setattr(module, "is_transformers_available", lambda: True)
    plugin = DeepSpeedPlugin(zero_stage=3)
    asked: list[tuple[str, dict]] = []

    def fake_require(package: str, **kw: object) -> None:
        asked.append((package, kw))

    monkeypatch.setattr(module, "require", fake_require)
    plugin.set_deepspeed_weakref()
    assert [package for package, _ in asked] == ["transformers", "deepspeed"]
    assert asked[1][1]["extra"] == "deepspeed"
    assert plugin.dschf is None


def test_weakref_without_transformers_is_a_no_op_unless_zero3_init(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hasten.config.deepspeed as module

    monkeypatch.setattr(module, "is_transformers_available", lambda: False)
    plugin = DeepSpeedPlugin()
    plugin.set_deepspeed_weakref()
    assert plugin.dschf is None
    from hasten.core.imports import is_package_available

    # Hide transformers for this check only; the availability cache must not remember it.
    monkeypatch.setitem(sys.modules, "transformers", None)  # type: ignore[arg-type]
    plugin.zero3_init_flag = True
    is_package_available.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"zero3_init_flag=True\) requires 'transformers'"):
            plugin.set_deepspeed_weakref()
    finally:
        is_package_available.cache_clear()


def test_zero3_init_context_manager_toggles_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = DeepSpeedPlugin(zero_stage=3)
    calls: list[bool] = []
    monkeypatch.setattr(
        plugin, "set_deepspeed_weakref", lambda: calls.append(plugin.zero3_init_flag)
    )
    with plugin.zero3_init_context_manager(enable=False):
        assert plugin.zero3_init_flag is False
    assert plugin.zero3_init_flag is True
    assert calls == [False, True]
    with plugin.zero3_init_context_manager(enable=True):
        pass
    assert calls == [False, True]  # already enabled: nothing re-registered


def test_long_base64_config_is_not_mistaken_for_a_path() -> None:
    data = {"zero_optimization": {"stage": 1}, "comment": "x" * 600}
    encoded = base64.urlsafe_b64encode(json.dumps(data).encode()).decode()
    assert len(encoded) > 255  # longer than any file name: Path.is_file() raises OSError
    assert DeepSpeedPlugin(hf_ds_config=encoded).zero_stage == 1


def test_fp8_with_msamp_adds_the_msamp_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "msamp")
    plugin = DeepSpeedPlugin()
    assert plugin.enable_msamp is True
    plugin.set_mixed_precision("fp8")
    assert plugin.deepspeed_config["msamp"] == {"enabled": True, "opt_level": "O1"}
    assert plugin.deepspeed_config["bf16"] == {"enabled": True}


def test_weakref_registers_a_resolved_config_with_transformers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    import hasten.config.deepspeed as module

    events: list[object] = []
    fake = types.SimpleNamespace(
        unset_hf_deepspeed_config=lambda: events.append("unset"),
        set_hf_deepspeed_config=lambda obj: events.append(obj),
    )
    monkeypatch.setattr(module, "is_transformers_available", lambda: True)
    monkeypatch.setattr(module, "is_deepspeed_available", lambda: True)
    monkeypatch.setattr(module, "require", lambda package, **kw: fake)
    plugin = DeepSpeedPlugin(zero_stage=3)
    plugin.set_deepspeed_weakref()
    assert events[0] == "unset"
    assert events[1] is plugin.dschf  # transformers holds a weakref to the plugin's object
    assert plugin.dschf.is_zero3()
    config = plugin.dschf.config
    assert isinstance(config, dict)
    assert config["gradient_accumulation_steps"] == 1
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert "train_batch_size" not in config
    assert plugin.deepspeed_config["train_batch_size"] == "auto"  # the plugin's own copy is kept
