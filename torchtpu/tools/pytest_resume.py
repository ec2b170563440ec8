"""A pytest plugin that splits one suite over several runs: on a TPU host whose device time comes in
calls of a few minutes, repeat the same command until it reports nothing left.

    python -m pytest -p torchtpu.tools.pytest_resume --resume-log /tmp/suite.jsonl --seconds 540 ...

Each test's outcome is appended to the log as it finishes; a test already in the log is deselected; no
test starts after --seconds; a test that took the process down (its "started" line has no outcome)
counts as failed and is not run again. The summary covers the whole log.

As a program it repeats pytest with the plugin until --seconds are spent or a run ends by itself (a
test that ran out of --test-seconds ends its process; the next run goes on after it). Run the file, not
the module: `python -m torchtpu.tools...` imports torchtpu, which would hold the one TPU its pytest needs.

    python torchtpu/tools/pytest_resume.py --resume-log /tmp/suite.jsonl --seconds 480 --test-seconds 60 -- tests/
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("resume", "split one suite over several runs (torchtpu)")
    group.addoption("--resume-log", default=None,
                    help="JSON lines of finished tests: those in it are not run again; outcomes are appended")
    group.addoption("--seconds", type=float, default=None, help="start no test after this many seconds")
    group.addoption("--test-seconds", type=float, default=None,
                    help="a test still running after this many seconds ends the process (its stacks printed)")


def read_log(path: str) -> dict[str, dict]:
    """nodeid -> its last record; a test started but never finished is a crash (outcome 'failed')."""
    records: dict[str, dict] = {}
    if not os.path.exists(path):
        return records
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if record["outcome"] == "started":
                records.setdefault(record["nodeid"], {**record, "outcome": "failed", "crashed": True})
            else:
                records[record["nodeid"]] = record
    return records


def _compile_metrics() -> tuple[int, float] | None:
    """(compiles, seconds compiling) so far in this process, once torchtpu is imported."""
    import sys
    debug = sys.modules.get("torchtpu.debug")
    if debug is None:
        return None
    metrics = debug.metrics()
    return metrics["compiles"], metrics["compile_seconds"]


class _Resume:
    def __init__(self, config):
        self.log = config.getoption("resume_log")
        self.seconds = config.getoption("seconds")
        self.test_seconds = config.getoption("test_seconds")
        # pytest captures file descriptor 2 during a test: the stacks of a test that ran out of time go here
        self.stacks = open(self.log + ".stacks", "a") if self.test_seconds else None
        self.start = time.monotonic()
        self.reports: dict[str, list] = {}
        self.left = 0
        self.compiles_before = None

    def _append(self, record: dict):
        with open(self.log, "a") as f:
            f.write(json.dumps(record) + "\n")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        done = read_log(self.log)
        deselected = [item for item in items if item.nodeid in done]
        if deselected:
            items[:] = [item for item in items if item.nodeid not in done]
            config.hook.pytest_deselected(items=deselected)
        self.left = len(items)

    def pytest_runtest_logstart(self, nodeid, location):
        self.compiles_before = _compile_metrics()
        self._append({"nodeid": nodeid, "outcome": "started"})
        if self.test_seconds:
            self.stacks.write(f"{nodeid}\n")
            self.stacks.flush()
            faulthandler.dump_traceback_later(self.test_seconds, exit=True, file=self.stacks)

    def pytest_runtest_logreport(self, report):
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.test_seconds:
            faulthandler.cancel_dump_traceback_later()
        reports = self.reports.pop(nodeid, [])
        outcome = "passed"
        if any(report.failed for report in reports):
            outcome = "failed"
        elif any(report.skipped for report in reports):
            outcome = "skipped"
        seconds = sum(getattr(report, "duration", 0.0) for report in reports)
        record = {"nodeid": nodeid, "outcome": outcome, "seconds": round(seconds, 3)}
        compiles_after = _compile_metrics()
        if compiles_after is not None and self.compiles_before is not None:
            # on a TPU most of a test's time can be XLA compiling: the log says how much
            record["compiles"] = compiles_after[0] - self.compiles_before[0]
            record["compile_seconds"] = round(compiles_after[1] - self.compiles_before[1], 3)
        if outcome == "failed":
            record["message"] = "\n".join(str(report.longrepr) for report in reports if report.failed)[-3000:]
        self._append(record)
        self.left -= 1

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        yield
        if self.seconds is not None and time.monotonic() - self.start > self.seconds and self.left > 0:
            item.session.shouldstop = f"--seconds {self.seconds:g} spent; {self.left} tests left for the next run"

    def pytest_terminal_summary(self, terminalreporter):
        records = read_log(self.log)
        counts: dict[str, int] = {}
        for record in records.values():
            counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
        crashed = [nodeid for nodeid, record in records.items() if record.get("crashed")]
        failed = [nodeid for nodeid, record in records.items()
                  if record["outcome"] == "failed" and not record.get("crashed")]
        terminalreporter.section(f"resume log {self.log}")
        line = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        terminalreporter.write_line(f"whole log: {line or 'empty'}; {max(self.left, 0)} left in this selection")
        for nodeid in failed:
            terminalreporter.write_line(f"FAILED {nodeid}")
        for nodeid in crashed:
            terminalreporter.write_line(f"CRASHED {nodeid}")


def pytest_configure(config):
    if config.getoption("resume_log"):
        config.pluginmanager.register(_Resume(config), "torchtpu-resume")


def _last_test_crashed(path: str) -> bool:
    """Whether the log ends with a test that started and never finished (its process ended)."""
    if not os.path.exists(path):
        return False
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    return bool(lines) and json.loads(lines[-1])["outcome"] == "started"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python torchtpu/tools/pytest_resume.py",
                                     description="run pytest with this plugin again after a test ends its process, "
                                                 "until --seconds are spent")
    parser.add_argument("--resume-log", required=True)
    parser.add_argument("--seconds", type=float, required=True, help="start no test after this many seconds in all")
    parser.add_argument("--test-seconds", type=float, default=None)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest's own arguments")
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    start = time.monotonic()
    returncode = 0
    while True:
        left = args.seconds - (time.monotonic() - start)
        if left <= 0:
            return returncode
        command = [sys.executable, "-m", "pytest", "-p", "torchtpu.tools.pytest_resume",
                   "--resume-log", args.resume_log, "--seconds", f"{left:.1f}"]
        if args.test_seconds:
            command += ["--test-seconds", str(args.test_seconds)]
        returncode = subprocess.run(command + pytest_args).returncode
        if not _last_test_crashed(args.resume_log):
            return returncode
        spent = time.monotonic() - start
        print(f"pytest_resume: a test ended the process after {spent:.0f} of {args.seconds:g} s: going on",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
