"""Command-line tools: `python -m torchtpu.tools.coverage` (what runs from specs),
`python -m torchtpu.tools.report prog.py` (where a program's time goes) and
`python -m torchtpu.tools.accuracy` (float32 error against float64, per function); `plots` draws
their charts."""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def run_as_main(program: str, args: list[str]) -> tuple[int, str | None]:
    """Runs `program` in this process as `python program args...` would (its own argv, its directory
    first on sys.path). Never raises for the program's own failure: the traceback is printed, as
    Python would, and returned are the status `python` would exit with and how it ended, if not cleanly."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [program, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    status, error = 0, None
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as stop:  # sys.exit(...) in the program: Python's own rules for its status
        code = stop.code
        if code is None or code == 0:
            status = 0
        elif isinstance(code, int):
            status, error = code, f"exited with status {code}"
        else:
            print(code, file=sys.stderr)
            status, error = 1, f"exited: {code}"
    except KeyboardInterrupt:
        status, error = 130, "interrupted (KeyboardInterrupt)"
    except BaseException as raised:  # noqa: BLE001 - the program's failure is reported, not ours
        traceback.print_exc()
        status, error = 1, f"raised {type(raised).__name__}: {raised}".strip()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    sys.stdout.flush()
    return status, error
