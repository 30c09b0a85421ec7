"""Experiment tracking (compat path ``accelerate.tracking``): `GeneralTracker`, one class per
supported library, the built-in `JSONLTracker`, and the ``log_with`` registry.

Names resolve lazily from their modules, and each tracker imports its library only when a run
starts, so importing this package (as the Accelerator does) loads only what is used.
"""

from hasten.core.lazy import lazy_namespace

_TABLE: dict[str, list[str]] = {
    "hasten.tracking.aim": ["AimTracker"],
    "hasten.tracking.base": ["GeneralTracker", "on_main_process"],
    "hasten.tracking.clearml": ["ClearMLTracker"],
    "hasten.tracking.comet_ml": ["CometMLTracker"],
    "hasten.tracking.dvclive": ["DVCLiveTracker"],
    "hasten.tracking.jsonl": ["JSONLTracker"],
    "hasten.tracking.manager": ["TrackerManager"],
    "hasten.tracking.mlflow": ["MLflowTracker"],
    "hasten.tracking.registry": [
        "LOGGER_TYPE_TO_CLASS",
        "filter_trackers",
        "get_available_trackers",
        "register_tracker_class",
    ],
    "hasten.tracking.swanlab": ["SwanLabTracker"],
    "hasten.tracking.tensorboard": ["TensorBoardTracker"],
    "hasten.tracking.trackio": ["TrackioTracker"],
    "hasten.tracking.wandb": ["WandBTracker"],
}

__getattr__, __dir__ = lazy_namespace(__name__, _TABLE, globals())

__all__ = sorted(name for names in _TABLE.values() for name in names)
