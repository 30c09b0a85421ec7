"""Worker entry point: run the user's script or module as ``__main__`` and record a crash.

`hasten launch` starts each worker as ``python -u -m hasten.launchers.bootstrap [-m] TARGET
ARGS...``. The script runs exactly as ``python TARGET ARGS`` would (same ``sys.argv``,
``sys.path[0]`` and ``__name__``); if it raises, the traceback is also written to the error
file torch elastic gives each worker, so the launcher can print which rank failed and why.
Only the standard library is imported here, to keep every worker's start cheap.
"""

from __future__ import annotations

import json
import runpy
import sys
import time
import traceback
from pathlib import Path

from hasten.config import envvars

__all__ = ["main", "record_failure"]


def record_failure(exc: BaseException) -> None:
    """Write `exc` and its traceback to ``$TORCHELASTIC_ERROR_FILE`` in torch elastic's format."""
    path = envvars.read("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(exc)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    try:
        Path(path).write_text(json.dumps(data), encoding="utf-8")
    except OSError:  # the report is best effort; the traceback still reaches stderr
        pass


def main(argv: list[str] | None = None) -> None:
    """Run ``[-m] TARGET ARGS...`` as ``__main__``, recording an uncaught exception first."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_module = bool(args) and args[0] == "-m"
    if as_module:
        args = args[1:]
    if not args:
        raise SystemExit("usage: python -m hasten.launchers.bootstrap [-m] TARGET [ARGS...]")
    target = args[0]
    sys.argv = list(args)
    attempt = envvars.read("HASTEN_RESTART_COUNT")
    if attempt is not None:
        # hasten launch restarts single-machine groups itself, so torch's agent always says 0.
        envvars.write("TORCHELASTIC_RESTART_COUNT", attempt)
        envvars.remove("HASTEN_RESTART_COUNT")
    try:
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            # `python script.py` puts the script's directory first on the path.
            sys.path[0] = str(Path(target).resolve().parent)
            runpy.run_path(target, run_name="__main__")
    except Exception as exc:
        record_failure(exc)
        raise


if __name__ == "__main__":
    main()
