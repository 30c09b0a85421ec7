"""``make conformance``: run Accelerate's own tests (from its release archive) against hasten.

Steps: download ``accelerate==<version>``'s source archive with pip into a cache outside the
repository, unpack its ``tests/`` and ``src/accelerate/test_utils/``, point their ``accelerate``
imports, dotted names and CLI names at hasten (``redirect/``), run each test file in its own
pytest process, print one table per file and one closing line, and compare the failures with
``known_differences.txt``. A failure not listed there fails the run; a listed test that passes is
reported so the list can shrink. A second pass runs the GPU-gated tests named in
``cpu_gated.txt`` on CPU processes (the override described in docs/conformance.md).

``--reference`` runs the same files against Accelerate itself instead (installed into a scratch
virtual environment in the cache), for the side-by-side numbers. Nothing of Accelerate's is
written inside the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tokenize
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

__all__ = ["main"]

VERSION = "1.15.0"
HERE = Path(__file__).resolve().parent
REDIRECT = HERE / "redirect"
KNOWN = HERE / "known_differences.txt"
CPU_GATED = HERE / "cpu_gated.txt"
#: Why a listed test may fail: no accelerator here; no network (model hub) here; a file the
#: release archive does not ship (it fails on Accelerate the same way); a deliberate difference
#: documented in docs/differences.md.
REASONS = ("hardware", "network", "archive", "difference")
# Accelerate's console scripts and the hasten entry point each one runs.
SHIMS = {
    "accelerate": "hasten.commands.accelerate_cli:main",
    "accelerate-config": "hasten.commands.config:main",
    "accelerate-launch": "hasten.commands.launch:main",
    "accelerate-estimate-memory": "hasten.commands.estimate:main",
    "accelerate-merge-weights": "hasten.commands.merge:main",
}
PER_TEST_TIMEOUT_S = 300
# Seconds pytest may spend in exit handlers after its session has ended.
EXIT_GRACE_S = 60
# The slowest files first, so the parallel runs end together.
SLOW_FIRST = ("test_tracking", "test_cli", "test_big_modeling", "test_accelerator", "test_utils")


@dataclass(frozen=True)
class Known:
    """One line of known_differences.txt: a test id that fails on hasten, and why."""

    test_id: str
    reason: str
    note: str


@dataclass(frozen=True)
class Setup:
    """Where one run's files are and how its pytest processes are started."""

    work: Path
    python: str
    env: dict[str, str]


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hasten-conformance"


def fetch_archive(cache: Path) -> Path:
    """The release archive, downloaded once with pip (the package index's own client)."""
    archive = cache / f"accelerate-{VERSION}.tar.gz"
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        + ["--no-build-isolation", f"accelerate=={VERSION}", "-d", str(cache)],
        check=True,
    )
    if not archive.is_file():
        raise SystemExit(f"pip download did not leave {archive.name} in {cache}")
    return archive


def unpack(archive: Path, work: Path, redirect: bool) -> None:
    """A fresh copy of ``tests/`` and ``test_utils/`` (tests write files next to themselves).

    With `redirect`, dotted ``accelerate.`` names in their strings are pointed at hasten.
    """
    if work.exists():
        shutil.rmtree(work)
    root = f"accelerate-{VERSION}/"
    wanted = {
        root + "tests/": "tests/",
        root + "src/accelerate/test_utils/": "accelerate/test_utils/",
    }
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            for prefix, into in wanted.items():
                if member.isfile() and member.name.startswith(prefix):
                    target = work / (into + member.name[len(prefix) :])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    data = tar.extractfile(member)
                    assert data is not None
                    content = data.read()
                    if redirect and target.suffix == ".py":
                        content = redirect_dotted_names(content)
                    target.write_bytes(content)


def redirect_dotted_names(source: bytes) -> bytes:
    """String literals naming ``accelerate.<module>`` (patch targets, logger names) -> ``hasten.``.

    Imports need no rewriting (the import hook aliases them); strings do, because a logger is
    named after hasten's module. Names under ``accelerate.test_utils`` stay: those are the archive's.
    """
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    for tok in tokenize.tokenize(BytesIO(source).readline):
        if tok.type != tokenize.STRING:
            continue
        quote_at = min(i for i in (tok.string.find("'"), tok.string.find('"')) if i >= 0)
        body = tok.string[quote_at:].strip("'\"")
        dotted = all(part.isidentifier() for part in body.split("."))
        if (
            dotted
            and body.startswith("accelerate.")
            and not body.startswith("accelerate.test_utils")
        ):
            start = quote_at + 1
            new = tok.string[:start] + "hasten" + tok.string[start + len("accelerate") :]
            edits.append((tok.start, tok.end, new))
    if not edits:
        return source
    lines = source.decode().splitlines(keepends=True)
    for (row, col), (end_row, end_col), new in reversed(edits):
        assert row == end_row, "a dotted name is a one-line string"
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[end_col:]
    return "".join(lines).encode()


def write_shims(bin_dir: Path) -> None:
    """``accelerate``, ``accelerate-launch``, ... run hasten's entry points with this Python."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, entry in SHIMS.items():
        module, func = entry.split(":")
        script = bin_dir / name
        script.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"from {module} import {func}\n"
            f"sys.argv[0] = {name!r}\n"
            f"sys.exit({func}())\n"
        )
        script.chmod(0o755)


def read_known() -> dict[str, Known]:
    """known_differences.txt: ``<test id>  <reason>  <why>`` a line (reasons: `REASONS`)."""
    known: dict[str, Known] = {}
    for number, raw in enumerate(KNOWN.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or parts[1] not in REASONS:
            raise SystemExit(
                f"{KNOWN.name}:{number}: expected '<test id> <{'|'.join(REASONS)}> <why>', got {raw!r}"
            )
        known[parts[0]] = Known(parts[0], parts[1], parts[2])
    return known


def read_gated(listing: Path = CPU_GATED) -> list[str]:
    """cpu_gated.txt: the GPU-gated test ids whose bodies run on CPU processes."""
    ids = []
    for raw in listing.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            ids.append(line.split()[0])
    return ids


def _base_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "HASTEN_"))}
    # No user config leaks in, and nothing waits on a model hub this machine cannot reach.
    env["HF_HOME"] = str(work / "hf_home")
    env["HF_HUB_OFFLINE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    # Accelerate's MLflow tests log to a local folder; mlflow 3 refuses that store unless asked.
    env["MLFLOW_ALLOW_FILE_STORE"] = "true"
    # DeepSpeed's comm op as `make test` builds it (tests/conftest.py): in the venv, its ninja
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    # ClearML's Task.init forks a monitor process while a thread of its own runs `git` to detect
    # the repository; a fork inside that Popen keeps the pipe Popen waits on open, and
    # Task.close() then waits 300 s for the detection. Detecting synchronously avoids the race.
    clearml = work / "clearml.conf"
    clearml.write_text("sdk { development { vcs_repo_detect_async: false } }\n")
    env["CLEARML_CONFIG_FILE"] = str(clearml)
    return env


def add_checkout_files(checkout: Path, work: Path, redirect: bool) -> None:
    """Copy what the archive lacks from an Accelerate checkout (``--tests-from``).

    Its ``tests/fsdp``, ``tests/deepspeed`` and ``tests/tp`` folders, the ``tests/test_configs``
    and ``tests/test_samples`` data, and ``examples/``; Python files get the same redirection.
    """
    for part in (
        "tests/fsdp",
        "tests/deepspeed",
        "tests/tp",
        "tests/test_configs",
        "tests/test_samples",
        "examples",
    ):
        source = checkout / part
        if not source.is_dir():
            continue
        for path in source.rglob("*"):
            if path.is_file():
                target = work / part / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                content = path.read_bytes()
                if redirect and path.suffix == ".py":
                    content = redirect_dotted_names(content)
                target.write_bytes(content)


def hasten_setup(
    archive: Path,
    work: Path,
    cpu_gates: bool,
    checkout: Path | None = None,
    gated_list: Path = CPU_GATED,
) -> Setup:
    """The archive's tests unpacked for hasten: import hook, dotted names, CLI shims."""
    unpack(archive, work, redirect=True)
    if checkout is not None:
        add_checkout_files(checkout, work, redirect=True)
    write_shims(work / "bin")
    env = _base_env(work)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REDIRECT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join(
        [str(work / "bin"), str(Path(sys.executable).parent), env["PATH"]]
    )
    env["HASTEN_CONFORMANCE_ACCELERATE_DIR"] = str(work / "accelerate")
    if cpu_gates:
        env["HASTEN_CONFORMANCE_CPU_GATES"] = "1"
        env["HASTEN_CONFORMANCE_OPEN_GATES"] = str(gated_list.resolve())
    return Setup(work, sys.executable, env)


def _purelib(python: str) -> str:
    """The site-packages folder of the interpreter ``python``."""
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def reference_setup(archive: Path, cache: Path, work: Path, checkout: Path | None = None) -> Setup:
    """The same tests against Accelerate itself, in a scratch venv sharing this one's packages."""
    venv = cache / "reference-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = _purelib(str(python))
    shared = Path(site, "hasten_conformance_shared.pth")
    if not shared.exists():
        shared.write_text(_purelib(sys.executable) + "\n")
    if not Path(site, "accelerate").is_dir():
        # --ignore-installed: this venv sees ours, where hasten's `accelerate 1.15.0+hasten...`
        # (make install) satisfies ==1.15.0, so pip would otherwise install nothing here
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed"]
            + [f"accelerate=={VERSION}"],
            check=True,
        )
    unpack(archive, work, redirect=False)
    if checkout is not None:
        add_checkout_files(checkout, work, redirect=False)
    plugin_only = work / "plugin"
    plugin_only.mkdir()
    (plugin_only / "hasten_conformance").symlink_to(REDIRECT / "hasten_conformance")
    env = _base_env(work)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_only), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env["PATH"]])
    return Setup(work, str(python), env)


def run_file(setup: Setup, targets: list[str], name: str) -> dict[str, dict[str, str]]:
    """Run `targets` in one pytest process; return {test id: {outcome, why}}."""
    results = setup.work / "results" / f"{name}.jsonl"
    log = setup.work / "logs" / f"{name}.log"
    results.parent.mkdir(exist_ok=True)
    log.parent.mkdir(exist_ok=True)
    command = [setup.python, "-m", "pytest", "-q", "-p", "hasten_conformance.plugin"]
    command += ["-p", "no:cacheprovider", f"--timeout={PER_TEST_TIMEOUT_S}", "-rN"]
    command += ["--continue-on-collection-errors", *targets]
    env = {**setup.env, "HASTEN_CONFORMANCE_RESULTS": str(results)}
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=setup.work, env=env, stdout=out, stderr=out, start_new_session=True
        )
        _wait_for_exit(process, results, log)
    with contextlib.suppress(ProcessLookupError):  # launched jobs a timed-out test left behind
        os.killpg(process.pid, signal.SIGKILL)
    if not results.is_file():
        return {targets[0]: {"outcome": "failed", "why": f"pytest wrote no results; see {log}"}}
    outcomes = {}
    for line in results.read_text().splitlines():
        entry = json.loads(line)
        outcomes[entry.pop("id")] = entry
    return outcomes


def _wait_for_exit(process: subprocess.Popen[bytes], results: Path, log: Path) -> None:
    """Wait for pytest; once its results are written, give exit handlers a bounded time.

    A third-party exit handler can block for ever (ClearML's offline flush can); the results
    are complete by then, so the process group is stopped and the run says so.
    """
    finished_at = None
    while process.poll() is None:
        time.sleep(1)
        if finished_at is None and results.is_file():
            finished_at = time.monotonic()
        if finished_at is not None and time.monotonic() - finished_at > EXIT_GRACE_S:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            print(
                f"note: pytest had not exited {EXIT_GRACE_S} s after its session; stopped ({log})"
            )
            return


def run_all(setup: Setup, groups: dict[str, list[str]], jobs: int) -> dict[str, dict[str, str]]:
    """Each group (a file, or the ids of one file) in its own pytest process, `jobs` at a time."""
    order = sorted(groups, key=lambda f: (not f.startswith(SLOW_FIRST, 6), f))
    outcomes: dict[str, dict[str, str]] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = pool.map(lambda f: run_file(setup, groups[f], Path(f).stem), order)
        for found in done:
            outcomes.update(found)
    return outcomes


def file_of(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def print_table(title: str, outcomes: dict[str, dict[str, str]], files: list[str]) -> Counter[str]:
    per_file: dict[str, Counter[str]] = {f: Counter() for f in files}
    for test_id, entry in outcomes.items():
        per_file.setdefault(file_of(test_id), Counter())[entry["outcome"]] += 1
    print(f"\n{title}")
    print(f"{'file':<58}{'passed':>8}{'failed':>8}{'skipped':>9}")
    total: Counter[str] = Counter()
    for name in sorted(per_file):
        counts = per_file[name]
        total.update(counts)
        print(f"{name:<58}{counts['passed']:>8}{counts['failed']:>8}{counts['skipped']:>9}")
    print(f"{'total':<58}{total['passed']:>8}{total['failed']:>8}{total['skipped']:>9}")
    return total


def compare(
    outcomes: dict[str, dict[str, str]], known: dict[str, Known]
) -> tuple[list[str], list[str]]:
    """(unexpected failures, listed tests that passed)."""
    unexpected, stale = [], []
    for test_id, entry in sorted(outcomes.items()):
        if entry["outcome"] == "failed" and test_id not in known:
            unexpected.append(f"  {test_id}\n      {entry['why']}")
        elif entry["outcome"] == "passed" and test_id in known:
            stale.append(f"  {test_id}  (listed: {known[test_id].reason})")
    return unexpected, stale


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "files", nargs="*", help="only these test files or ids (e.g. tests/test_utils.py)"
    )
    parser.add_argument(
        "--cache", type=Path, default=default_cache(), help="download/unpack folder"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=int(os.environ.get("CONFORMANCE_JOBS", "2")),
        help="test files run at once (default 2, or CONFORMANCE_JOBS)",
    )
    parser.add_argument("--no-gpu-gated", action="store_true", help="skip the CPU-gates pass")
    parser.add_argument("--gpu-gated-only", action="store_true", help="run only the CPU-gates pass")
    parser.add_argument(
        "--reference", action="store_true", help="run the tests on Accelerate itself instead"
    )
    parser.add_argument(
        "--gated-list",
        type=Path,
        default=CPU_GATED,
        help="the GPU-gated tests to run on CPU (default conformance/cpu_gated.txt)",
    )
    parser.add_argument(
        "--tests-from",
        type=Path,
        default=None,
        help="an Accelerate checkout: adds tests/fsdp, tests/deepspeed, tests/tp and the test data "
        "the release archive lacks (not used by make conformance)",
    )
    return parser.parse_args(argv)


def _test_files(work: Path) -> list[str]:
    """Every test file under ``work/tests`` (the archive's, and a checkout's subfolders)."""
    return sorted(str(p.relative_to(work)) for p in (work / "tests").rglob("test_*.py"))


def _groups(targets: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for target in targets:
        groups.setdefault(file_of(target), []).append(target)
    return groups


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    archive = fetch_archive(args.cache)
    root = args.cache / f"accelerate-{VERSION}"
    if args.reference:
        setup = reference_setup(archive, args.cache, root / "reference", args.tests_from)
        every = _test_files(setup.work)
        outcomes = run_all(setup, _groups(args.files or every), args.jobs)
        total = print_table(f"Accelerate {VERSION}'s tests on Accelerate itself", outcomes, [])
        print(
            f"\nreference (accelerate {VERSION} on itself): {total['passed']} passed, "
            f"{total['failed']} failed, {total['skipped']} skipped; "
            f"{time.monotonic() - started:.0f} s"
        )
        return 0
    setup = hasten_setup(archive, root / "hasten", cpu_gates=False, checkout=args.tests_from)
    files = args.files or _test_files(setup.work)
    known = read_known()
    outcomes = {} if args.gpu_gated_only else run_all(setup, _groups(files), args.jobs)
    total = print_table(f"Accelerate {VERSION}'s tests on hasten", outcomes, [])
    unexpected, stale = compare(outcomes, known)
    known_failed = sum(1 for t, e in outcomes.items() if e["outcome"] == "failed" and t in known)

    gated_line = ""
    if not args.no_gpu_gated:
        chosen = {file_of(f) for f in files}
        present = set(_test_files(setup.work))
        listed = read_gated(args.gated_list)
        gated = [t for t in listed if file_of(t) in chosen and file_of(t) in present]
        if gated:
            gated_setup = hasten_setup(
                archive,
                root / "hasten-cpu-gates",
                cpu_gates=True,
                checkout=args.tests_from,
                gated_list=args.gated_list,
            )
            gated_outcomes = run_all(gated_setup, _groups(gated), args.jobs)
            gated_total = print_table(
                "GPU-gated tests on CPU processes (HASTEN_CONFORMANCE_CPU_GATES=1)",
                gated_outcomes,
                [],
            )
            more_unexpected, more_stale = compare(gated_outcomes, known)
            unexpected += more_unexpected
            stale += more_stale
            gated_line = (
                f"; GPU-gated on CPU: {gated_total['passed']} passed, {gated_total['failed']} "
                f"failed, {gated_total['skipped']} skipped"
            )
    if stale:
        print("\nListed in conformance/known_differences.txt but passed (remove the line):")
        print("\n".join(stale))
    if unexpected:
        print("\nFailures not in conformance/known_differences.txt:")
        print("\n".join(unexpected))
        print(f"(logs: {root}/hasten*/logs/)")
    print(
        f"\nconformance (accelerate {VERSION} tests on hasten): {total['passed']} passed, "
        f"{total['failed']} failed ({known_failed} listed), {total['skipped']} skipped"
        f"{gated_line}; {len(unexpected)} unexpected failures; "
        f"{time.monotonic() - started:.0f} s"
    )
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
