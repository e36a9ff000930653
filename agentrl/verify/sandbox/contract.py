"""What a sandbox promises its callers: the `Sandbox` protocol, its limits, what it reports
(`RunResult`, `TestRunResult`, `Isolation`) and the one error that is the sandbox's own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, harness crashed): never a score of 0."""


@dataclass(frozen=True)
class Limits:
    """Per-run limits. Defaults fit HumanEval-sized functions with a wide margin."""

    wall_seconds: float = 10.0  # the whole run, load + all tests
    per_test_seconds: float = 3.0  # one test's calls into the candidate
    cpu_seconds: int = 10  # RLIMIT_CPU, per process
    memory_mb: int = 1024  # RLIMIT_AS, per process (virtual memory)
    run_memory_mb: int = 1024  # memory cgroup: resident memory of all the run's processes together
    max_processes: int = 8  # RLIMIT_NPROC for the run's own uid (threads count)
    max_file_mb: int = 16  # RLIMIT_FSIZE: largest file it can write
    disk_mb: int = 32  # size of its private /tmp
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 64_000  # stdout + stderr kept; past this the process is killed
    output_preview_chars: int = 2_000  # what RunResult keeps of each stream for logs


@dataclass(frozen=True)
class Isolation:
    """What the OS let us isolate for this run, with the reason for anything missing.

    ``filesystem_isolated``: the run sees only the minimal file view (see the package's docstring);
    ``user_isolated``: it cannot see, signal or trace this user's other processes (a fresh uid
    under root; a user and PID namespace of its own otherwise);
    ``memory_per_run``: one memory limit holds for all of the run's processes together (else
    ``memory_mb`` holds per process, and a run that forks can use that much per process);
    ``method``: how: ``"root"`` (namespaces and a fresh uid), ``"user-namespace"`` (the same
    namespaces, owned by an ordinary user), ``"e2b"``, or ``"none"``.

    >>> Isolation(True, True, True, method="user-namespace").sufficient
    True
    >>> Isolation(False, False, False).summary()
    'sandbox isolation: none (network, files and processes are NOT isolated)'
    """

    network_isolated: bool
    filesystem_isolated: bool
    user_isolated: bool
    memory_per_run: bool = False
    reasons: tuple[str, ...] = ()
    method: str = "none"

    @property
    def sufficient(self) -> bool:
        """What training on policy-written code needs: no network, no view of the host's files,
        no reach into the host's processes. (Memory per run is a bonus: without it each process
        is capped, so a run holds at most ``max_processes * memory_mb``.)"""
        return self.network_isolated and self.filesystem_isolated and self.user_isolated

    @property
    def complete(self) -> bool:
        return self.sufficient and self.memory_per_run

    def summary(self) -> str:
        """One line for a log or a console: the method, and what is not isolated."""
        missing = [name for name, ok in (("network", self.network_isolated), ("files", self.filesystem_isolated),
                                         ("processes", self.user_isolated)) if not ok]
        line = f"sandbox isolation: {self.method}"
        if missing:
            line += f" ({', '.join(missing[:-1]) + ' and ' + missing[-1] if len(missing) > 1 else missing[0]}"
            line += f" {'are' if len(missing) > 1 else 'is'} NOT isolated)"
        elif not self.memory_per_run:
            line += " (memory limited per process, not per run)"
        return line


@dataclass(frozen=True)
class RunResult:
    """The outcome of `run_program`."""

    exit_code: int | None  # None when killed by the deadline; negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool
    output_limited: bool  # killed for writing more than max_output_bytes
    wall_seconds: float
    isolation: Isolation


@dataclass(frozen=True)
class TestCase:
    """One test: Python source run by the judge, where ``candidate`` and the entry point name call
    into the sandboxed program. ``setup`` cases (imports, fixtures) run in order and are not scored
    on their own; a setup that fails is reported like a failed test."""

    name: str
    code: str
    setup: bool = False
    __test__: ClassVar[bool] = False  # not a pytest class


@dataclass(frozen=True)
class TestOutcome:
    name: str
    passed: bool
    timed_out: bool = False
    error: str | None = None
    __test__: ClassVar[bool] = False  # not a pytest class


@dataclass(frozen=True)
class TestRunResult:
    """The outcome of `run_tests`: per-test results, load error, the candidate's trimmed output.

    ``protocol_violation`` says what the candidate wrote to the judge's pipe that was not a valid
    reply (a forged frame, a message nested 100,000 deep); then no result can be trusted and the
    run counts as failed, whatever the tests say."""

    tests: tuple[TestOutcome, ...]
    load_error: str | None
    stdout: str
    stderr: str
    timed_out: bool
    output_limited: bool
    wall_seconds: float
    isolation: Isolation
    protocol_violation: str | None = None
    __test__: ClassVar[bool] = False  # not a pytest class

    @property
    def n_passed(self) -> int:
        return 0 if self.protocol_violation else sum(t.passed for t in self.tests)

    @property
    def passed(self) -> bool:
        """Every test passed (and there was at least one), and the candidate kept to the protocol."""
        return bool(self.tests) and not self.protocol_violation and all(t.passed for t in self.tests)

    def first_failure(self) -> TestOutcome | None:
        return next((t for t in self.tests if not t.passed), None)


class Sandbox(Protocol):
    """What verifiers need from a sandbox (local and E2B backends implement it)."""

    limits: Limits

    def run_program(self, code: str) -> RunResult: ...

    def run_tests(
        self, program: str, tests: Sequence[TestCase], entry_point: str, preamble: str = ""
    ) -> TestRunResult: ...



def isolation_of(env: Any) -> Isolation | None:
    """The isolation of the sandbox an environment runs policy-written code in (its ``sandbox``, or
    its verifier's), or None for an environment that runs none. What check-env and a run's first
    lines report."""
    env = getattr(env, "unwrapped", env)
    for holder in (env, getattr(env, "verifier", None)):
        iso = getattr(getattr(holder, "sandbox", None), "isolation", None)
        if isinstance(iso, Isolation):
            return iso
    return None

