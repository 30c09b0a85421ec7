"""Compatibility path for ``accelerate.commands.config.cluster``: the questions live in `questionnaire`."""

from hasten.commands.config.questionnaire import get_cluster_input

__all__ = ["get_cluster_input"]
