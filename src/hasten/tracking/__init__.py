"""Experiment tracking (compat path ``accelerate.tracking``): `GeneralTracker`, one class per
supported library, the built-in `JSONLTracker`, and the ``log_with`` registry.

Each tracker imports its library only when a run starts, so importing this package is cheap.
"""

from hasten.tracking.aim import AimTracker
from hasten.tracking.base import GeneralTracker, on_main_process
from hasten.tracking.clearml import ClearMLTracker
from hasten.tracking.comet_ml import CometMLTracker
from hasten.tracking.dvclive import DVCLiveTracker
from hasten.tracking.jsonl import JSONLTracker
from hasten.tracking.manager import TrackerManager
from hasten.tracking.mlflow import MLflowTracker
from hasten.tracking.registry import (
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from hasten.tracking.swanlab import SwanLabTracker
from hasten.tracking.tensorboard import TensorBoardTracker
from hasten.tracking.trackio import TrackioTracker
from hasten.tracking.wandb import WandBTracker

__all__ = [
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONLTracker",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackerManager",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
]
