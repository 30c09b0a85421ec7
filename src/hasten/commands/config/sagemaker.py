"""The ``hasten config`` questions for Amazon SageMaker; the answers become a `SageMakerConfig`.

hasten asks for an existing IAM role instead of creating one (that would need AWS calls from
the questionnaire); create it in the AWS console or with ``aws iam create-role``.
"""

from __future__ import annotations

from typing import Any

from hasten.commands.config.config_args import SageMakerConfig
from hasten.commands.config.config_utils import DYNAMO_BACKENDS
from hasten.commands.config.questionnaire import ask, ask_choice, ask_yes_no
from hasten.config.enums import PrecisionType, SageMakerDistributedType
from hasten.launchers.sagemaker import SAGEMAKER_PARALLEL_EC2_INSTANCES

__all__ = ["get_sagemaker_input"]


def _non_empty(answer: str) -> str:
    if not answer.strip():
        raise ValueError("an answer is required")
    return answer.strip()


def _positive_int(answer: str) -> int:
    value = int(answer)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _ask_credentials(config: dict[str, Any]) -> None:
    ways = ["AWS Profile", "Credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"]
    if ask_choice("How do you want to authorize?", ways) == 0:
        config["profile"] = ask("Enter your AWS Profile name", _non_empty, "default")
    else:
        print(
            "Pass --aws_access_key_id and --aws_secret_access_key to `hasten launch`; they are "
            "not stored in the config file."
        )
    config["region"] = ask("Enter your AWS Region", _non_empty, "us-east-1")


def _ask_files(config: dict[str, Any]) -> None:
    if ask_yes_no("Do you want to use a custom Docker image?"):
        config["image_uri"] = ask("Enter your Docker image URI", _non_empty, "")
    if ask_yes_no("Do you want to give SageMaker input channels (a TSV of name<TAB>S3 URI)?"):
        config["sagemaker_inputs_file"] = ask("Path to the input channels file", _non_empty, "")
    if ask_yes_no("Do you want SageMaker to track metrics (a TSV of name<TAB>regex)?"):
        config["sagemaker_metrics_file"] = ask("Path to the metrics file", _non_empty, "")


def _ask_dynamo(config: dict[str, Any]) -> None:
    if not ask_yes_no("Do you wish to optimize your script with torch.compile?"):
        return
    default = DYNAMO_BACKENDS.index("INDUCTOR")
    backend = DYNAMO_BACKENDS[ask_choice("Which torch.compile backend?", DYNAMO_BACKENDS, default)]
    config["dynamo_config"] = {"dynamo_backend": backend}


def get_sagemaker_input() -> SageMakerConfig:
    """Ask the SageMaker questions on stdin and return the validated config."""
    config: dict[str, Any] = {}
    _ask_credentials(config)
    config["iam_role_name"] = ask(
        "Enter the name of the IAM role SageMaker training jobs run as", _non_empty, ""
    )
    _ask_files(config)
    kinds = ["No distributed training", "Data parallelism"]
    kind = [SageMakerDistributedType.NO, SageMakerDistributedType.DATA_PARALLEL][
        ask_choice("What is the distributed mode?", kinds)
    ]
    _ask_dynamo(config)

    def instance(answer: str) -> str:
        value = _non_empty(answer)
        if kind.value == "DATA_PARALLEL" and value not in SAGEMAKER_PARALLEL_EC2_INSTANCES:
            raise ValueError(f"data parallelism runs on {SAGEMAKER_PARALLEL_EC2_INSTANCES}")
        return value

    default_instance = "ml.p3.16xlarge" if kind.value == "DATA_PARALLEL" else "ml.p3.2xlarge"
    config["ec2_instance_type"] = ask("Which EC2 instance type?", instance, default_instance)
    config["num_machines"] = 1
    if kind.value != "NO":
        config["num_machines"] = ask("How many machines (instances)?", _positive_int, 1)
    precisions = [value for value in PrecisionType.list() if value != "fp8"]
    mixed_precision = precisions[ask_choice("Mixed precision?", precisions)]
    return SageMakerConfig(
        compute_environment="AMAZON_SAGEMAKER",
        distributed_type=kind,
        mixed_precision=mixed_precision,
        use_cpu=False,
        debug=False,
        base_job_name=f"accelerate-sagemaker-{config['num_machines']}",
        **config,
    )
