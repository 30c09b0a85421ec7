"""Build `accelerate_api.json` from the reference pages in ``shared/seeds/`` (run once by hand).

Each documented ``accelerate.X`` becomes an entry ``hasten.X`` with its parameter names, kinds and
default reprs, exactly as the page prints them. `test_paths.py` checks hasten against it.

Usage: python tests/compat/build_manifest.py ../shared/seeds/*.txt
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_HEADER = re.compile(r"^#### .*\[\[(accelerate\.[\w.]+)\]\]\s*$")
# The kwargs page (Arabic) documents ProfileKwargs, which the utilities page lacks.
_EXTRA = {
    "accelerate.ProfileKwargs": (
        "activities=None, schedule_option=None, on_trace_ready=None, record_shapes=False, "
        "profile_memory=False, with_stack=False, with_flops=False, with_modules=False, "
        "output_trace_dir=None"
    ),
    "accelerate.ProfileKwargs.build": "",
}


def _split_top_level(text: str) -> list[str]:
    parts, depth, quote, current = [], 0, "", []
    for char in text:
        if quote:
            current.append(char)
            if char == quote:
                quote = ""
            continue
        if char in "'\"":
            quote = char
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _param(text: str) -> dict[str, str]:
    if text.startswith("**"):
        return {"name": text[2:], "kind": "VAR_KEYWORD"}
    if text.startswith("*"):
        return {"name": text[1:], "kind": "VAR_POSITIONAL"}
    head, _, default = text.partition("=")
    name = head.split(":", 1)[0].strip()
    entry = {"name": name, "kind": "POSITIONAL_OR_KEYWORD"}
    if _:
        entry["default"] = default.strip()
    return entry


def _signature(line: str) -> tuple[str, list[dict[str, str]]]:
    name, _, rest = line.partition("(")
    return name.strip(), [_param(p) for p in _split_top_level(rest.rstrip()[:-1])]


_MEMBER = re.compile(r"^- \*\*([A-Z_0-9]+)\*\* --")
# The Spanish page translates one member name; the enum itself keeps the English one.
_TRANSLATED = {"TODOS": "ALL"}


def _enum_members(lines: list[str], start: int) -> list[str]:
    """Member names listed under "Valores:" until the next header."""
    members = []
    for line in lines[start:]:
        if line.startswith("#"):
            break
        match = _MEMBER.match(line)
        if match:
            members.append(_TRANSLATED.get(match.group(1), match.group(1)))
    return members


def build(pages: list[Path]) -> list[dict[str, object]]:
    """Return one manifest entry per documented path, first occurrence wins."""
    entries: dict[str, dict[str, object]] = {}
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            match = _HEADER.match(line)
            if not match or match.group(1) in entries:
                continue
            block = lines[i + 1 : i + 6]
            if "```python" not in block:
                continue
            sig_line = block[block.index("```python") + 1]
            _, params = _signature(sig_line)
            entry: dict[str, object] = {"path": match.group(1), "params": params}
            members = _enum_members(lines, i + 1)
            if members:
                entry["members"] = members
            entries[match.group(1)] = entry
    for path, params_text in _EXTRA.items():
        params = [_param(p) for p in _split_top_level(params_text)] if params_text else []
        entries.setdefault(path, {"path": path, "params": params})
    return [entries[key] for key in sorted(entries)]


if __name__ == "__main__":
    manifest = build([Path(p) for p in sys.argv[1:]])
    out = Path(__file__).with_name("accelerate_api.json")
    out.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(manifest)} entries to {out}")
