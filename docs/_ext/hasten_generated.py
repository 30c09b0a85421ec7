"""Reference pages generated from the code at build time, so they cannot go stale.

``{hasten-generated} envvars`` renders every variable of `hasten.config.envvars.ENV_VARS`,
``cli`` every flag of every ``hasten`` subcommand (from the argparse parsers), ``config`` every
config-file key (the `ClusterConfig` fields and the engine sections' keys). The text builders
are plain functions so that ``tests/docs/test_generated_reference.py`` checks they are complete.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

__all__ = ["cli_markdown", "config_markdown", "envvars_markdown", "setup"]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def envvars_markdown() -> str:
    """One table row per environment variable: name, value when unset, meaning."""
    from hasten.config.envvars import ENV_VARS

    rows = ["| variable | when unset | meaning |", "|---|---|---|"]
    for name in sorted(ENV_VARS):
        var = ENV_VARS[name]
        default = "(unset)" if var.default is None else f"`{var.default!r}`"
        rows.append(f"| `{name}` | {_cell(default)} | {_cell(var.doc)} |")
    return "\n".join(rows) + "\n"


def _flags(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(action.option_strings) or action.dest
        found.append((names, action.help or ""))
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_markdown() -> str:
    """A section per ``hasten`` command (and sub-command) with a row per flag."""
    from hasten.commands.cli import build_parser

    parts: list[str] = []
    pending: list[tuple[str, argparse.ArgumentParser]] = [("hasten", build_parser())]
    while pending:
        name, parser = pending.pop(0)
        parts += [f"### `{name}`", "", "| flag | what it does |", "|---|---|"]
        parts += [f"| `{_cell(flags)}` | {_cell(text)} |" for flags, text in _flags(parser)]
        parts.append("")
        children = _subparsers(parser)
        pending += [(f"{name} {child}", sub) for child, sub in sorted(children.items())]
    return "\n".join(parts) + "\n"


def config_markdown() -> str:
    """The top-level keys of a config file, then the keys of its engine sections."""
    from hasten.commands.config.config_args import ClusterConfig
    from hasten.launchers.env import section_keys

    rows = ["| key | default |", "|---|---|"]
    for field in dataclasses.fields(ClusterConfig):
        if field.default is not dataclasses.MISSING:
            default = f"`{_cell(repr(field.default))}`"
        elif field.default_factory is not dataclasses.MISSING:
            default = f"`{_cell(repr(field.default_factory()))}`"
        else:
            default = "required"
        rows.append(f"| `{field.name}` | {default} |")
    for section in ("fsdp_config", "deepspeed_config"):
        rows += ["", f"Keys of `{section}`:", ""]
        rows += [", ".join(f"`{key}`" for key in section_keys(section))]
    return "\n".join(rows) + "\n"


_BUILDERS = {"envvars": envvars_markdown, "cli": cli_markdown, "config": config_markdown}


def setup(app: Any) -> dict[str, Any]:
    """Register the ``hasten-generated`` directive."""
    from docutils.parsers.rst import Directive
    from docutils.statemachine import StringList

    class Generated(Directive):
        required_arguments = 1

        def run(self) -> list[Any]:
            which = self.arguments[0]
            if which not in _BUILDERS:
                raise self.error(
                    f"hasten-generated: unknown table {which!r}; one of {sorted(_BUILDERS)}"
                )
            from docutils import nodes

            container = nodes.container()
            lines = StringList(_BUILDERS[which]().splitlines(), source=f"hasten-generated {which}")
            self.state.nested_parse(lines, self.content_offset, container)
            return [container]

    app.add_directive("hasten-generated", Generated)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
