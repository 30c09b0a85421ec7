"""SageMaker: config and questions, estimator arguments, and `hasten launch` with the SDK mocked."""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from hasten.commands.cli import main
from hasten.commands.config.config import get_user_input
from hasten.commands.config.config_args import SageMakerConfig, load_config_from_file
from hasten.commands.launch import launch_command_parser
from hasten.config.enums import SageMakerDistributedType
from hasten.launchers import sagemaker
from hasten.launchers.sagemaker import convert_nargs_to_dict, prepare_sagemager_args_inputs


def _config(**overrides: Any) -> SageMakerConfig:
    values: dict[str, Any] = {
        "compute_environment": "AMAZON_SAGEMAKER",
        "distributed_type": "DATA_PARALLEL",
        "mixed_precision": "bf16",
        "use_cpu": False,
        "debug": False,
        "ec2_instance_type": "ml.p3.16xlarge",
        "iam_role_name": "trainer",
        "profile": "dev",
        "num_machines": 2,
    }
    values.update(overrides)
    return SageMakerConfig(**values)


def test_script_arguments_become_typed_hyperparameters() -> None:
    assert convert_nargs_to_dict(
        ["--lr", "0.1", "--epochs=3", "--fp16", "True", "--name", "x"]
    ) == {
        "lr": 0.1,
        "epochs": 3,
        "fp16": True,
        "name": "x",
    }
    # A flag without a value cannot round-trip through SageMaker (Accelerate refuses it too).
    for nargs in (["--fp16"], ["--do_train", "--epochs", "3"]):
        with pytest.raises(
            ValueError, match=r"^SageMaker doesn't support argparse actions .* no value"
        ):
            convert_nargs_to_dict(nargs)
    assert convert_nargs_to_dict(["--flag", "true", "--off", "False"]) == {
        "flag": True,
        "off": False,
    }
    with pytest.raises(ValueError, match="has no --name before it"):
        convert_nargs_to_dict(["stray"])


def test_estimator_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = tmp_path / "inputs.tsv"
    inputs.write_text("channel\tpath\ntrain\ts3://b/train \n")
    metrics = tmp_path / "metrics.tsv"
    metrics.write_text("name\tregex\nloss\tloss: ([0-9.]+)\n")
    config = _config(
        sagemaker_inputs_file=str(inputs),
        sagemaker_metrics_file=str(metrics),
        additional_args={"max_run": 600, "environment": {"EXTRA": "1"}},
    )
    args = launch_command_parser().parse_args(
        ["--mixed_precision", "bf16", "src/train.py", "--lr", "0.5"]
    )
    estimator, fit_inputs = prepare_sagemager_args_inputs(config, args)
    assert fit_inputs == {"train": "s3://b/train"}
    assert estimator["entry_point"] == "train.py" and estimator["source_dir"] == "src"
    assert estimator["role"] == "trainer" and estimator["instance_count"] == 2
    assert estimator["instance_type"] == "ml.p3.16xlarge"
    assert estimator["distribution"] == {"smdistributed": {"dataparallel": {"enabled": True}}}
    assert estimator["hyperparameters"] == {"lr": 0.5}
    assert estimator["metric_definitions"] == [{"Name": "loss", "Regex": "loss: ([0-9.]+)"}]
    assert estimator["max_run"] == 600
    env = estimator["environment"]
    assert env["ACCELERATE_USE_SAGEMAKER"] == "true" and env["EXTRA"] == "1"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE"] == "DATA_PARALLEL"
    import os

    assert os.environ["AWS_PROFILE"] == "dev" and os.environ["AWS_DEFAULT_REGION"] == "us-east-1"


def test_estimator_arguments_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    parse = launch_command_parser().parse_args
    with pytest.raises(OSError, match="No AWS credentials"):
        prepare_sagemager_args_inputs(_config(profile=None), parse(["t.py"]))
    keys = ["--aws_access_key_id", "k", "--aws_secret_access_key", "s"]
    estimator, _ = prepare_sagemager_args_inputs(_config(profile=None), parse([*keys, "t.py"]))
    assert estimator["distribution"] is not None
    with pytest.raises(ValueError, match=r"must be a Python file \(.py\), got 'run.sh'"):
        prepare_sagemager_args_inputs(_config(), parse(["run.sh"]))
    with pytest.raises(ValueError, match="--module and --no_python cannot be used"):
        prepare_sagemager_args_inputs(_config(), parse(["-m", "pkg.train"]))


class _FakeEstimator:
    made: list[_FakeEstimator] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.fit_inputs: Any = "not called"
        self.model_data = "s3://bucket/model.tar.gz"
        _FakeEstimator.made.append(self)

    def fit(self, inputs: Any = None) -> None:
        self.fit_inputs = inputs


def test_hasten_launch_starts_a_sagemaker_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sm.yaml"
    _config(distributed_type="NO", num_machines=1).save(str(config))
    loaded = load_config_from_file(str(config))
    assert isinstance(loaded, SageMakerConfig)
    assert loaded.distributed_type == SageMakerDistributedType.NO
    fake_sdk = types.ModuleType("sagemaker.huggingface")
    fake_sdk.HuggingFace = _FakeEstimator  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sagemaker.huggingface", fake_sdk)
    monkeypatch.setattr("hasten.core.imports.require", lambda *a, **k: None)
    _FakeEstimator.made.clear()
    assert main(["launch", "--config_file", str(config), "train.py", "--epochs", "2"]) == 0
    (estimator,) = _FakeEstimator.made
    assert estimator.kwargs["hyperparameters"] == {"epochs": 2}
    assert estimator.kwargs["distribution"] is None and estimator.fit_inputs is None
    assert "s3://bucket/model.tar.gz" in capsys.readouterr().out


def test_sagemaker_launch_without_the_sdk_says_what_to_install(tmp_path: Path) -> None:
    if importlib.util.find_spec("sagemaker") is not None:  # not a test dependency
        pytest.skip("the sagemaker SDK is installed here")
    with pytest.raises(ImportError, match=r"pip install"):
        sagemaker.run_sagemaker(_config(), argparse.Namespace(training_script="t.py"))


def test_sagemaker_questionnaire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SageMaker; profile "ml"; region; role; no image/inputs/metrics; data parallel; no compile;
    # a non-parallel instance is refused, then the default; 2 machines; bf16.
    answers = "1\n0\nml\neu-west-1\nrole-x\nno\nno\nno\n1\nno\nml.g5.xlarge\n\n2\n2\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(answers))
    config = get_user_input()
    assert isinstance(config, SageMakerConfig)
    assert (config.profile, config.region, config.iam_role_name) == ("ml", "eu-west-1", "role-x")
    assert config.distributed_type == SageMakerDistributedType.DATA_PARALLEL
    assert (config.ec2_instance_type, config.num_machines) == ("ml.p3.16xlarge", 2)
    assert config.mixed_precision == "bf16" and config.base_job_name == "accelerate-sagemaker-2"
    path = tmp_path / "q.yaml"
    config.save(str(path))
    data = yaml.safe_load(path.read_text())
    assert data["compute_environment"] == "AMAZON_SAGEMAKER"
    assert load_config_from_file(str(path)) == config


def test_sagemaker_config_bad_values() -> None:
    with pytest.raises(TypeError, match="'iam_role_name' must be a non-empty string"):
        _config(iam_role_name="")
    with pytest.raises(ValueError, match="'num_machines' must be >= 1"):
        _config(num_machines=0)
    with pytest.raises(ValueError, match="does not fit a SageMakerConfig"):
        _config(compute_environment="LOCAL_MACHINE")
