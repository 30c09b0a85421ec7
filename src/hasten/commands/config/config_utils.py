"""Shared pieces of the ``hasten config`` commands: the compile backends and the help format."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from hasten.config.enums import DynamoBackend

__all__ = ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"]

# torch.compile backends the questionnaire offers (every DynamoBackend except NO).
DYNAMO_BACKENDS: list[str] = [value for value in DynamoBackend.list() if value != "NO"]


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help format of ``hasten config``: the usage line drops the ``<command> [<args>]`` part."""

    def _format_usage(
        self,
        usage: str | None,
        actions: Iterable[argparse.Action],
        groups: Iterable[Any],
        prefix: str | None,
    ) -> str:
        text = super()._format_usage(usage, actions, groups, prefix)
        return text.replace("<command> [<args>] ", "")
