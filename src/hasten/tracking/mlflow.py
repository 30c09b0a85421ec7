"""MLflow tracker: one MLflow run (fluent API) per project, in any tracking store.

As in Accelerate, ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``,
``MLFLOW_TAGS`` (JSON), ``MLFLOW_NESTED_RUN``, ``MLFLOW_RUN_NAME`` and ``MLFLOW_RUN_NOTE``
take precedence over the constructor arguments.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hasten.config import envvars
from hasten.core.imports import require
from hasten.tracking.base import GeneralTracker
from hasten.tracking.values import SkipWarner, flatten_dict, to_scalar

__all__ = ["MLflowTracker"]


def _mlflow() -> Any:
    return require("mlflow", feature="The MLflow tracker", extra="mlflow")  # optional: mlflow


def _tags(tags: dict[str, Any] | str | None) -> dict[str, Any] | None:
    if isinstance(tags, str):
        try:
            parsed = json.loads(tags)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"MLflow tags must be a dict or a JSON object string, got {tags!r} ({err.msg})."
            ) from err
        if not isinstance(parsed, dict):
            raise ValueError(f"MLflow tags must be a JSON object, got {tags!r}.")
        return parsed
    return tags


class MLflowTracker(GeneralTracker):
    """Log params and metrics to MLflow.

    Args:
        experiment_name: the MLflow experiment (created if missing); the project name.
        logging_dir: tracking URI (``file:///path``, ``sqlite:///mlflow.db``, ``http://...``).
        run_id: resume this run instead of starting a new one.
        tags: run tags, a dict or a JSON object string.
        nested_run: start the run nested in the active one.
        run_name: display name of the run.
        description: run description (the "note").
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__()
        self.experiment_name = envvars.read("MLFLOW_EXPERIMENT_NAME") or experiment_name
        uri = envvars.read("MLFLOW_TRACKING_URI") or logging_dir
        self.logging_dir = None if uri is None else str(uri)
        self.run_id = envvars.read("MLFLOW_RUN_ID") or run_id
        self.tags = _tags(envvars.read("MLFLOW_TAGS") or tags)
        self.nested_run = envvars.read_flag("MLFLOW_NESTED_RUN", bool(nested_run))
        self.run_name = envvars.read("MLFLOW_RUN_NAME") or run_name
        self.description = envvars.read("MLFLOW_RUN_NOTE") or description
        self.active_run: Any = None
        self._mlflow: Any = None
        self._skips = SkipWarner(self.name)

    def start(self) -> None:
        """Point MLflow at the tracking URI, get or create the experiment and start the run."""
        mlflow = self._mlflow = _mlflow()
        if self.logging_dir is not None:
            mlflow.set_tracking_uri(self.logging_dir)
        experiment_id = None
        if self.experiment_name:
            found = mlflow.get_experiment_by_name(self.experiment_name)
            if found is None:
                experiment_id = mlflow.create_experiment(self.experiment_name)
            else:
                experiment_id = found.experiment_id
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    @property
    def tracker(self) -> Any:
        """The active ``mlflow.ActiveRun``."""
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log ``values`` as params: nested keys joined with ``.``, values as (capped) strings."""
        mlflow = _mlflow()
        from mlflow.utils.validation import (  # optional: mlflow
            MAX_PARAM_VAL_LENGTH,
            MAX_PARAMS_TAGS_PER_BATCH,
        )

        params: dict[str, str] = {}
        for key, value in flatten_dict(values, sep=".").items():
            text = str(value)
            if len(text) > MAX_PARAM_VAL_LENGTH:
                self._skips.skip(key, value, f"params up to {MAX_PARAM_VAL_LENGTH} characters")
                continue
            params[key] = text
        items = list(params.items())
        for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(items[start : start + MAX_PARAMS_TAGS_PER_BATCH]))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log the numeric ``values`` as metrics at ``step``; others are skipped with a warning."""
        metrics: dict[str, float] = {}
        for key, value in values.items():
            scalar = to_scalar(value)
            if scalar is None:
                self._skips.skip(key, value)
            else:
                metrics[key] = scalar
        if metrics:
            self._mlflow.log_metrics(metrics, step=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log each image (numpy array or PIL image) as MLflow image ``key`` at ``step``."""
        for key, image in values.items():
            self._mlflow.log_image(image, key=key, step=step, **kwargs)

    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib/plotly ``figure`` as the run artifact ``artifact_file``."""
        _mlflow().log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Upload every file under ``local_dir`` as run artifacts."""
        _mlflow().log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Upload one file as a run artifact."""
        _mlflow().log_artifact(local_path=local_path, artifact_path=artifact_path)

    def finish(self) -> None:
        """End the run."""
        if self.active_run is not None:
            self._mlflow.end_run()
            self.active_run = None
