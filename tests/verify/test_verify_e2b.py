from __future__ import annotations

import os

import pytest

from agentrl.verify.e2b import E2BSandbox
from agentrl.verify.sandbox import SandboxError, TestCase


def test_missing_extra_or_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    ok, why = E2BSandbox.available()
    assert not ok and ("E2B_API_KEY" in why or "e2b extra" in why)
    with pytest.raises(SandboxError, match="E2B sandbox unavailable"):
        E2BSandbox()


@pytest.mark.skipif(not E2BSandbox.available()[0], reason="needs the e2b extra and E2B_API_KEY ("
                    + E2BSandbox.available()[1] + ")")
def test_runs_tests_remotely():
    sb = E2BSandbox()
    res = sb.run_tests("def f(x):\n    return 2 * x\n",
                       [TestCase("t", "assert f(2) == 4"), TestCase("u", "assert f(2) == 5")], "f")
    assert [t.passed for t in res.tests] == [True, False]
    assert "hunter2" not in sb.run_program("import os; "
                                           "print(os.environ)").stdout or os.environ.get("E2B_API_KEY") != "hunter2"
