"""E2B backend: the same `Sandbox` interface, running in an E2B cloud micro-VM.

>>> E2BSandbox.available()  # doctest: +SKIP
(False, 'E2B_API_KEY is not set')

Needs the ``[e2b]`` extra (``pip install 'agentrl[e2b]'``) and ``E2B_API_KEY``; either missing is
a `SandboxError` that says so, never a score of 0. The VM is the isolation boundary (network and
filesystem are the VM's own). Tests run the same two-process harness as the local sandbox (judge
and worker), inside the VM; unlike locally, both run as the VM's one user, so the separation
between them is weaker than the local sandbox's (the worker could signal the judge, which makes
the run fail, never pass).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Sequence
from typing import Any

from agentrl.verify.sandbox import Isolation, Limits, RunResult, SandboxError, TestCase, TestOutcome, TestRunResult
from agentrl.verify.sandbox.harness import SOURCE as _HARNESS  # the harness program, uploaded as one script

__all__ = ["E2BSandbox"]

# Runs inside the VM: start worker and judge connected by pipes, print the judge's report.
_DRIVER = r"""
import json, os, subprocess, sys
req_r, req_w = os.pipe(); rep_r, rep_w = os.pipe()
w = subprocess.Popen([sys.executable, "/tmp/agentrl/_harness.py", "worker", str(req_r), str(rep_w)],
                     pass_fds=(req_r, rep_w), stdin=open("/tmp/agentrl/program.py"),
                     stdout=open("/tmp/agentrl/out.txt", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
j = subprocess.Popen([sys.executable, "/tmp/agentrl/_harness.py", "judge", str(req_w), str(rep_r)],
                     pass_fds=(req_w, rep_r), stdin=open("/tmp/agentrl/payload.json"), stdout=subprocess.PIPE,
                     start_new_session=True)
for fd in (req_r, req_w, rep_r, rep_w): os.close(fd)
out, _ = j.communicate(timeout=float(sys.argv[1]))
w.kill()
sys.stdout.write(out.decode())
"""


class E2BSandbox:
    """``E2BSandbox(limits)``: one VM per run (simple, and nothing leaks between runs)."""

    def __init__(self, limits: Limits | None = None, api_key: str | None = None, template: str | None = None):
        ok, why = self.available(api_key)
        if not ok:
            raise SandboxError(f"E2B sandbox unavailable: {why}")
        self.limits = limits or Limits()
        self.api_key = api_key or os.environ["E2B_API_KEY"]
        self.template = template
        # the VM bounds the memory of all the run's processes together
        self.isolation = Isolation(True, True, True, memory_per_run=True, reasons=("isolated by an E2B micro-VM",),
                                   method="e2b")

    @staticmethod
    def available(api_key: str | None = None) -> tuple[bool, str]:
        """(True, "") when the extra is installed and a key is set, else (False, why)."""
        try:
            import e2b_code_interpreter  # noqa: F401
        except ImportError:
            return False, "the e2b extra is not installed: pip install 'agentrl[e2b]'"
        if not (api_key or os.environ.get("E2B_API_KEY")):
            return False, "E2B_API_KEY is not set"
        return True, ""

    def _vm(self) -> Any:
        from e2b_code_interpreter import Sandbox as VM

        try:
            kwargs: dict[str, Any] = {"api_key": self.api_key, "timeout": int(self.limits.wall_seconds) + 60}
            if self.template:
                kwargs["template"] = self.template
            return VM(**kwargs)
        except Exception as e:  # network, auth, quota: all infrastructure failures
            raise SandboxError(f"could not start an E2B sandbox: {type(e).__name__}: {e}") from e

    def _run(self, vm: Any, cmd: str) -> tuple[int | None, str, str, bool]:
        from e2b.sandbox.commands.command_handle import CommandExitException

        try:
            r = vm.commands.run(cmd, timeout=self.limits.wall_seconds)
            return r.exit_code, r.stdout, r.stderr, False
        except CommandExitException as e:
            return e.exit_code, e.stdout, e.stderr, False
        except Exception as e:
            if "timeout" in type(e).__name__.lower() or "timed out" in str(e).lower():
                return None, "", "", True
            raise SandboxError(f"E2B command failed: {type(e).__name__}: {e}") from e

    def run_program(self, code: str) -> RunResult:
        t0 = time.monotonic()
        vm = self._vm()
        try:
            vm.files.write("/tmp/agentrl/program.py", code)
            lim = self.limits
            ulimit = (f"ulimit -t {lim.cpu_seconds} -v {lim.memory_mb * 1024} -f {lim.max_file_mb * 1024} "
                      f"-u {lim.max_processes * 4};")
            command = f"bash -c {shlex.quote(ulimit + ' cd /tmp/agentrl && python3 program.py')}"
            code_, out, err, timed_out = self._run(vm, command)
        finally:
            vm.kill()
        cap = self.limits.max_output_bytes
        return RunResult(code_, out[:cap], err[:cap], timed_out, len(out) + len(err) > cap, time.monotonic() - t0,
                         self.isolation)

    def run_tests(self, program: str, tests: Sequence[TestCase], entry_point: str, preamble: str = "") -> TestRunResult:
        if not tests:
            raise ValueError("run_tests: no tests given; a task without tests cannot be verified")
        t0 = time.monotonic()
        lim = self.limits
        payload = {"tests": [{"name": t.name, "code": t.code} for t in tests], "entry_point": entry_point,
                   "preamble": preamble,
                   "per_test_seconds": lim.per_test_seconds, "load_seconds": max(1.0, lim.wall_seconds / 2)}
        vm = self._vm()
        try:
            for name, text in (("_harness.py", _HARNESS), ("driver.py", _DRIVER), ("program.py", program),
                               ("payload.json", json.dumps(payload))):
                vm.files.write(f"/tmp/agentrl/{name}", text)
            code_, out, err, timed_out = self._run(vm, f"python3 /tmp/agentrl/driver.py {lim.wall_seconds}")
            cand_out = "" if timed_out else vm.files.read("/tmp/agentrl/out.txt")[: lim.output_preview_chars]
        finally:
            vm.kill()
        if timed_out:
            outcomes = tuple(TestOutcome(t.name, False, True, "not finished: wall-clock limit") for t in tests)
            return TestRunResult(outcomes, None, "", "", True, False, time.monotonic() - t0, self.isolation)
        try:
            report = json.loads(out)
        except ValueError:
            raise SandboxError(f"the E2B judge failed (exit {code_}) without a report: {err[-800:]}") from None
        outcomes = tuple(TestOutcome(r["name"], bool(r["passed"]), bool(r["timed_out"]), r["error"])
                         for r in report["tests"])
        return TestRunResult(outcomes, report["load_error"], cand_out, "", False, False, time.monotonic() - t0,
                             self.isolation,
                             protocol_violation=report.get("protocol_violation"))
