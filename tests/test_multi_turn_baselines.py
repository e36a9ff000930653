"""benchmarks/multi_turn.py's two generate() baselines do the same work: carrying the DynamicCache across turns
(only the last action token and the new observation fed, left-padded inside the chunk, masked) writes, greedy,
the same tokens as re-encoding every history each turn, so the stronger baseline is a faster loop, not another
task."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from multi_turn import BASELINES  # noqa: E402

from agentrl.config import TinyModelConfig  # noqa: E402
from agentrl.policy import Policy, build_tiny_policy  # noqa: E402
from agentrl.registry import make  # noqa: E402
from agentrl.stages.sft import expert_texts  # noqa: E402


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy")
    model = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=1024)
    build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=2, slack=0), range(30), noise=0.3), folder, model,
                      seed=0)
    p = Policy.load(folder)
    p.model.eval()
    return p


def test_carrying_the_cache_writes_the_tokens_re_encoding_writes(policy):
    seeds = list(range(5))  # observations of different lengths: every later chunk is padded inside
    actions = {name: [] for name in BASELINES}
    lengths = {name: run(policy, 2, seeds, 5, greedy=True, actions_out=actions[name])
               for name, run in BASELINES.items()}
    assert len(actions["regenerate"]) == 4  # 2 locks: 4 turns, every one compared
    assert actions["carry_cache"] == actions["regenerate"]
    assert lengths["carry_cache"] == lengths["regenerate"]


def test_sampled_baselines_keep_every_action_its_full_length(policy):
    for name, run in BASELINES.items():
        actions = []
        run(policy, 1, [0, 1, 2], 6, actions_out=actions)
        assert [len(a) for turn in actions for a in turn] == [6] * 6, name
