"""Verifiable rewards: a verifier judges an answer to a task, ``verify(task, answer) -> Verdict``.

Kinds: ``code`` (tests in a sandbox), ``math`` (math-verify equivalence), ``sql`` (rows against a
gold query), ``state`` (a predicate on the final state). See `agentrl.verify.sandbox` for what the
local sandbox isolates, `agentrl.verify.e2b` for the remote backend, and `agentrl.verify.probe` for
the adversarial battery behind ``agentrl verify-probe``.
"""

from agentrl.verify.base import NotVerifiable, Verdict, Verifier, VerifierError, register_verifier, verifier_for, verify
from agentrl.verify.code import CodeTask, CodeVerifier, humaneval_tasks
from agentrl.verify.math import MathTask, MathVerifier
from agentrl.verify.sandbox import Isolation, Limits, LocalSandbox, SandboxError, SandboxPool, TestCase, TestRunResult
from agentrl.verify.sql import SQLTask, SQLVerifier
from agentrl.verify.state import StateTask, StateVerifier

__all__ = [
    "CodeTask", "CodeVerifier", "Isolation", "Limits", "LocalSandbox", "MathTask", "MathVerifier", "NotVerifiable",
    "SQLTask", "SQLVerifier", "SandboxError", "SandboxPool", "StateTask", "StateVerifier", "TestCase", "TestRunResult",
    "Verdict", "Verifier", "VerifierError", "humaneval_tasks", "register_verifier", "verifier_for", "verify",
]
