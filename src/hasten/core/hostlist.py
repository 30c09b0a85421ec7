"""SLURM's compressed host lists (``node[01-04,07],gpu5``): expanded in order, as ``scontrol
show hostnames`` prints them. Pure functions; both the launcher (one ``hasten launch`` per node)
and the rank detection (one process per ``srun`` task) read SLURM's node lists through them.
"""

from __future__ import annotations

import re

__all__ = ["expand_nodelist", "first_host"]

_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top_level(nodelist: str) -> list[str]:
    """Split a SLURM node list on the commas that are not inside ``[...]``."""
    items: list[str] = []
    depth = 0
    current = ""
    for char in nodelist:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def _expand_range(spec: str, nodelist: str) -> list[str]:
    """Expand ``01-03,07`` to ``['01', '02', '03', '07']``, keeping zero padding."""
    values: list[str] = []
    for part in spec.split(","):
        start, _, stop = part.strip().partition("-")
        if not start.isdigit() or (stop and not stop.isdigit()):
            raise ValueError(
                f"Cannot parse the range {part!r} in SLURM node list {nodelist!r}: expected "
                "numbers like 'node[01-04,07]'. Check SLURM_JOB_NODELIST or pass --main_process_ip."
            )
        width = len(start)
        values.extend(str(n).zfill(width) for n in range(int(start), int(stop or start) + 1))
    return values


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM node list such as ``node[01-03],gpu7`` into host names, in order.

    Raises:
        ValueError: the list is empty or a bracket range is malformed.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        expanded = [""]
        pos = 0
        for match in _BRACKET.finditer(item):
            prefix = item[pos : match.start()]
            expanded = [
                head + prefix + value
                for head in expanded
                for value in _expand_range(match.group(1), nodelist)
            ]
            pos = match.end()
        hosts.extend(head + item[pos:] for head in expanded)
    if not hosts:
        raise ValueError(
            f"SLURM node list {nodelist!r} names no host. Check SLURM_JOB_NODELIST or pass "
            "--main_process_ip."
        )
    return hosts


def first_host(nodelist: str) -> str:
    """Return the first host of a SLURM node list (``node[01-04]`` -> ``node01``)."""
    return expand_nodelist(nodelist)[0]
