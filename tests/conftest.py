"""Shared fixtures: a tokenizer and a very small model built in-process (no downloads)."""

from __future__ import annotations

import os

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
