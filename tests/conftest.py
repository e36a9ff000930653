"""Shared fixtures: a tokenizer and a very small model built in-process (no downloads); and the markers
that a test's folder or parameters imply.

The test folders are not packages. Under pytest's default import mode each test module is imported by its
bare name with its own folder put first on sys.path, and this file puts tests/ there too: a module beside
this one (`venvs`, `test_e2e`) can be imported by name from any folder, one in a subfolder only from its own
folder. Hence two test files may not share a name anywhere under tests/ (pytest stops with "import file
mismatch" if they do).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.config import TinyModelConfig
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.stages.sft import expert_texts

# keep warm-start caches of the tests out of the user's cache
os.environ.setdefault("AGENTRL_CACHE", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "agentrl"))

MICRO = TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1,
                        max_position_embeddings=512, vocab_size=400)


TESTS = Path(__file__).parent

# Files outside tests/verify/sandbox/ (whose conftest.py marks it) whose tests run candidates in the real
# sandbox; and a test parametrised over Code-v0 steps an env whose verifier does.
SANDBOX_FILES = {TESTS / "verify" / "test_verify_code.py", TESTS / "envs" / "test_env_code.py"}
SANDBOX_ENVS = {"agentrl/Code-v0"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a slow test runs only when asked for by name (`-m slow`): collected, so it is counted, and skipped
    # otherwise; left to an addopts `-m "not slow"`, any other -m (`-m sandbox`) would let it run
    wants_slow = "slow" in (config.getoption("markexpr") or "")
    for item in items:
        if not item.path.is_relative_to(TESTS):
            continue
        if item.get_closest_marker("slow") and not wants_slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with -m slow"))
        params = getattr(item, "callspec", None)
        if item.path in SANDBOX_FILES or (params and SANDBOX_ENVS & set(map(str, params.params.values()))):
            item.add_marker(pytest.mark.sandbox)


@pytest.fixture(scope="session")
def vault_policy_dir(tmp_path_factory):
    """A micro Llama (hidden 16) with a BPE tokenizer trained on Vault's expert text."""
    env = make("agentrl/Vault-v0", locks=2)
    folder = tmp_path_factory.mktemp("micro")
    build_tiny_policy(expert_texts(env, range(60), noise=0.3), folder, MICRO, seed=0)
    return folder


@pytest.fixture
def vault_policy(vault_policy_dir):
    return Policy.load(vault_policy_dir)


@pytest.fixture(scope="session")
def teacher_dir(vault_policy_dir, tmp_path_factory):
    """A second micro policy on `vault_policy_dir`'s tokenizer (the same corpus) with weights of its own (seed 1):
    a teacher for distillation."""
    env = make("agentrl/Vault-v0", locks=2)
    folder = tmp_path_factory.mktemp("teacher")
    build_tiny_policy(expert_texts(env, range(60), noise=0.3), folder, MICRO, seed=1)
    return folder
