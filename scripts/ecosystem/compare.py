"""Compare two pytest JUnit XML reports of one suite: real accelerate vs hasten-as-accelerate.

``python compare.py accelerate.xml[,more.xml] hasten.xml[,more.xml]`` prints each side's passed /
failed / skipped / errors, then every test that passes with accelerate and does not with hasten
(with the first line of hasten's failure message), and the tests that pass with hasten only. A
side may be several reports (shards of one selection; the first report that has a test wins).
With ``--common``, only the tests both sides ran are counted (runs stopped early: pytest still
writes its report on Ctrl-C). The exit code is 1 when a test passes with accelerate and not with
hasten.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

__all__ = ["main", "outcomes"]


def outcomes(paths: str) -> dict[str, tuple[str, str]]:
    """``{test id: (outcome, message)}`` from comma-separated reports.

    A report is a JUnit XML file, or ``RUN.log+ORDER.txt``: the progress characters of a ``-q``
    run that was stopped before pytest wrote its XML, read against the ``--collect-only -q`` test
    ids in run order (the outcome only; a teardown error's extra ``E`` would shift the rest).
    """
    results: dict[str, tuple[str, str]] = {}
    for path in paths.split(","):
        if "+" in path:
            log, order = path.split("+", 1)
            found = _progress_outcomes(Path(log), Path(order))
        else:
            found = _outcomes(Path(path))
        for test_id, result in found.items():
            results.setdefault(test_id, result)
    return results


_PROGRESS = re.compile(r"^([.FEsxX]+)(\s+\[\s*\d+%\])?$")
_CHARS = {".": "passed", "F": "failed", "E": "error", "s": "skipped", "x": "skipped", "X": "passed"}


def _progress_outcomes(log: Path, order: Path) -> dict[str, tuple[str, str]]:
    chars = "".join(
        m.group(1) for line in log.read_text().splitlines() if (m := _PROGRESS.match(line.strip()))
    )
    ids = [line.strip() for line in order.read_text().splitlines() if "::" in line]
    results = {}
    for test_id, char in zip(ids, chars):
        module, _, rest = test_id.partition("::")
        classname = module.removesuffix(".py").replace("/", ".") + "." + rest.rpartition("::")[0]
        results[f"{classname.rstrip('.')}::{rest.rpartition('::')[2]}"] = (_CHARS[char], "")
    return results


def _outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """``{test id: (outcome, message)}`` from a JUnit XML file (passed/failed/skipped/error)."""
    results: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("error", "failure", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                text = (node.get("message") or node.text or "").strip()
                message = text.splitlines()[0][:200] if text else ""
                break
        # pytest writes a teardown error as a second <error> on a passed case: keep the worst.
        if test_id in results and results[test_id][0] != "passed":
            continue
        results[test_id] = (outcome, message)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("accelerate", help="JUnit XML report(s), comma-separated")
    parser.add_argument("hasten", help="JUnit XML report(s), comma-separated")
    parser.add_argument("--name", default="")
    parser.add_argument("--common", action="store_true", help="count the tests both sides ran")
    args = parser.parse_args(argv)
    ref, ours = outcomes(args.accelerate), outcomes(args.hasten)
    if args.common:
        both = ref.keys() & ours.keys()
        ref = {t: r for t, r in ref.items() if t in both}
        ours = {t: r for t, r in ours.items() if t in both}
    print(f"== {args.name or Path(args.accelerate).stem}")
    for side, res in (("accelerate", ref), ("hasten", ours)):
        n = Counter(outcome for outcome, _ in res.values())
        print(
            f"  {side:<11} {len(res):5d} tests: {n['passed']:5d} passed {n['failed']:5d} failed "
            f"{n['skipped']:5d} skipped {n['error']:5d} errors"
        )
    lost = sorted(
        t for t, (o, _) in ref.items() if o == "passed" and ours.get(t, ("missing",))[0] != "passed"
    )
    gained = sorted(
        t for t, (o, _) in ours.items() if o == "passed" and ref.get(t, ("missing",))[0] != "passed"
    )
    for title, tests, side in (
        ("pass with accelerate only", lost, ours),
        ("pass with hasten only", gained, ref),
    ):
        print(f"  {title}: {len(tests)}")
        for t in tests:
            outcome, message = side.get(t, ("missing", ""))
            print(f"    {t}  [{outcome}] {message}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
