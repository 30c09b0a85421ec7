"""config.dynamo: TorchDynamoPlugin defaults from ACCELERATE_DYNAMO_* and torch.compile kwargs."""

from __future__ import annotations

import pytest
import torch

from hasten.config.dynamo import TorchDynamoPlugin
from hasten.config.enums import DynamoBackend

_VARS = (
    "ACCELERATE_DYNAMO_BACKEND",
    "ACCELERATE_DYNAMO_MODE",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH",
    "ACCELERATE_DYNAMO_USE_DYNAMIC",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
)


@pytest.fixture(autouse=True)
def _no_dynamo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)


def test_defaults_without_environment() -> None:
    plugin = TorchDynamoPlugin()
    assert plugin.backend is DynamoBackend.NO
    assert (plugin.mode, plugin.fullgraph, plugin.dynamic) == ("default", False, None)
    assert plugin.use_regional_compilation is False
    assert plugin.enabled is False
    assert plugin.to_kwargs() == {}


def test_defaults_come_from_the_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "inductor")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "max-autotune")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "True")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "false")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "1")
    plugin = TorchDynamoPlugin()
    assert plugin.backend is DynamoBackend.INDUCTOR
    assert (plugin.mode, plugin.fullgraph, plugin.dynamic) == ("max-autotune", True, False)
    assert plugin.use_regional_compilation is True
    assert plugin.to_kwargs() == {
        "backend": "inductor",
        "mode": "max-autotune",
        "fullgraph": True,
        "dynamic": False,
    }


def test_explicit_values_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "inductor")
    assert TorchDynamoPlugin(backend="eager").backend is DynamoBackend.EAGER  # type: ignore[arg-type]


def test_to_dict_lowercases_backend() -> None:
    values = TorchDynamoPlugin(backend=DynamoBackend.AOT_EAGER).to_dict()
    assert values["backend"] == "aot_eager"
    assert values["use_regional_compilation"] is False


def test_to_kwargs_fit_torch_compile_signature() -> None:
    # Binding (not compiling: that takes seconds) proves every key is a torch.compile argument.
    import inspect

    plugin = TorchDynamoPlugin(
        backend="eager",
        mode="reduce-overhead",
        fullgraph=True,
        dynamic=True,
        disable=True,  # type: ignore[arg-type]
    )
    kwargs = plugin.to_kwargs()
    assert set(kwargs) == {"backend", "mode", "fullgraph", "dynamic", "disable"}
    inspect.signature(torch.compile).bind(torch.nn.Linear(2, 2), **kwargs)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"backend": "magic"}, r"backend='magic'\) is not a known dynamo backend.*INDUCTOR"),
        ({"mode": "fastest"}, r"mode='fastest'\) is not a torch.compile mode.*reduce-overhead"),
        (
            {"mode": "max-autotune", "options": {"trace.enabled": True}},
            r"sets both; torch.compile accepts only one",
        ),
    ],
)
def test_validation(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TorchDynamoPlugin(**options)


def test_options_alone_are_forwarded() -> None:
    plugin = TorchDynamoPlugin(backend="inductor", options={"epilogue_fusion": True})  # type: ignore[arg-type]
    assert plugin.to_kwargs() == {"backend": "inductor", "options": {"epilogue_fusion": True}}


def test_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "perhaps")
    with pytest.raises(ValueError, match="ACCELERATE_DYNAMO_USE_FULLGRAPH='perhaps'"):
        TorchDynamoPlugin()


def test_launcher_round_trip_through_environment_variables() -> None:
    from hasten.core.environment import patch_environment

    plugin = TorchDynamoPlugin(
        backend="inductor",  # type: ignore[arg-type]
        mode="max-autotune",
        fullgraph=True,
        dynamic=False,
        use_regional_compilation=True,
    )
    written = {  # what `hasten launch --dynamo_backend inductor ...` gives the workers
        "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR",
        "ACCELERATE_DYNAMO_MODE": "max-autotune",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "true",
        "ACCELERATE_DYNAMO_USE_DYNAMIC": "false",
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "true",
    }
    with patch_environment(**written):
        assert TorchDynamoPlugin() == plugin
