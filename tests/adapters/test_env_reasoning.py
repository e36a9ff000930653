"""reasoning-gym tasks through the real reasoning_gym package: check_env for the single- and multi-turn
ids, reasoning-gym's own scorer as the reward, the difficulty knob, held-out datasets, clear errors."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'agentrl[reasoning-gym]')")

import agentrl  # noqa: E402
from agentrl.adapters.reasoning_gym_tasks import ReasoningGymCalcEnv, ReasoningGymEnv  # noqa: E402
from agentrl.checker import check_env  # noqa: E402


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def play(env, seed, noise=0.0):
    env.reset(seed=seed)
    actions = []
    while True:
        actions.append(env.expert_action(noise))
        _, reward, terminated, truncated, _ = env.step(actions[-1])
        if terminated or truncated:
            return reward, actions


@pytest.mark.parametrize("env_id, kwargs", [
    ("agentrl/RG-v0", {}), ("agentrl/RG-v0", {"task": "leg_counting", "difficulty": 4}),
    ("agentrl/RG-v0", {"task": "word_sorting", "config": {"min_words": 3, "max_words": 6}}),
    ("agentrl/RG-Calc-v0", {}), ("agentrl/RG-Calc-v0", {"task": "products", "difficulty": 2}),
    ("agentrl/RG-Calc-v0", {"task": "gcd", "difficulty": 3}),
])
def test_check_env_passes(env_id, kwargs):
    assert [(r.name, r.message) for r in check_env(env_id, **kwargs) if not r.ok] == []


def test_reward_is_reasoning_gyms_score():
    env = ReasoningGymEnv(task="chain_sum", difficulty=2)
    obs, _ = env.reset(seed=0)
    assert obs.endswith("1 - 7 =")  # -6, by hand
    assert env.step(call("answer", answer="-6"))[1] == 1.0
    env.reset(seed=0)
    assert env.step(call("answer", answer="-5"))[1] == 0.0


def test_difficulty_sets_the_number_of_terms():
    for difficulty in (2, 5):
        env = ReasoningGymEnv(task="chain_sum", difficulty=difficulty)
        for seed in range(5):
            obs, _ = env.reset(seed=seed)
            expression = obs.split(":")[-1].removesuffix("=")
            assert len(re.findall(r"\d+", expression)) == difficulty


def test_config_overrides_the_knob_and_bad_ones_fail_clearly():
    env = ReasoningGymEnv(task="chain_sum", difficulty=2, config={"min_terms": 4, "max_terms": 4})
    obs, _ = env.reset(seed=1)
    assert len(re.findall(r"\d+", obs.split(":")[-1])) == 4
    with pytest.raises(ValueError, match="did you mean chain_sum"):
        ReasoningGymEnv(task="chainsum")
    with pytest.raises(ValueError, match="rejected the config of task 'chain_sum'.*max_terms must be >= min_terms"):
        ReasoningGymEnv(task="chain_sum", config={"min_terms": 5, "max_terms": 2})
    with pytest.raises(ValueError, match="has no difficulty knob"):
        ReasoningGymEnv(task="n_queens", difficulty=3)


def test_another_dataset_seed_is_the_same_items_shifted_so_the_split_goes_by_generator_seed():
    # reasoning-gym makes item i of the dataset of seed s from random.Random(s + i): seed 1's item 0 is seed 0's item 1
    shifted = ReasoningGymEnv(task="products", difficulty=2, dataset_seed=1).dataset
    base = ReasoningGymEnv(task="products", difficulty=2).dataset
    assert [shifted[i]["question"] for i in range(5)] == [base[i + 1]["question"] for i in range(5)]
    # so the items are named by generator seed, and the eval split's start at 2**31 = 2147483648, by hand
    assert ReasoningGymEnv(dataset_seed=5).task_ids(limit=2) == ["chain_sum-5", "chain_sum-6"]
    assert ReasoningGymEnv(dataset_seed=5, split="eval").task_ids(limit=2) == ["chain_sum-2147483653",
                                                                               "chain_sum-2147483654"]


@pytest.mark.parametrize("cls, kwargs", [
    ("ReasoningGymEnv", {"task": "products", "difficulty": 2}),
    ("ReasoningGymCalcEnv", {"task": "chain_sum", "difficulty": 3, "dataset_seed": 7}),
    ("ReasoningGymChainEnv", {"difficulty": 3}),
])
def test_an_eval_split_never_serves_a_train_item(cls, kwargs):
    from agentrl.adapters import reasoning_gym_tasks as rg

    train, held = getattr(rg, cls)(**kwargs), getattr(rg, cls)(**kwargs, split="eval")
    top = kwargs.get("dataset_seed", 0) + 1_000_000  # the training dataset's last generator seed, plus one
    for seed in range(200):
        _, info = held.reset(seed=seed)
        _, train_info = train.reset(seed=seed)
        generator_seed = int(info["task_id"].rsplit("-", 1)[1])
        assert generator_seed >= 2**31 and int(train_info["task_id"].rsplit("-", 1)[1]) < top
        # the item served is the one its id names
        index = generator_seed - 2**31 - kwargs.get("dataset_seed", 0)
        assert held.entry["question"] == held.dataset[index]["question"]


def test_split_check_passes_and_reports_texts_a_small_task_space_repeats():
    from agentrl.checker import check_splits_disjoint

    note = check_splits_disjoint(ReasoningGymEnv(task="chain_sum", difficulty=3),
                                 ReasoningGymEnv(task="chain_sum", difficulty=3, split="eval"))
    assert note.startswith("1,000,000 train and 1,000,000 eval tasks, none shared"), note
    # two one-digit terms: 10 x 10 x 2 = 200 questions, so 64 items of each split share some texts, not ids
    note = check_splits_disjoint(ReasoningGymEnv(task="chain_sum", difficulty=2),
                                 ReasoningGymEnv(task="chain_sum", difficulty=2, split="eval"), seeds=64)
    assert "none shared" in note and "open episodes of both splits" in note, note


def test_split_arguments_are_checked_and_heldout_kwargs_picks_the_eval_split():
    from agentrl.evaluation import heldout_kwargs

    for bad, match in [({"split": "test"}, "split must be 'train' or 'eval'"),
                       ({"dataset_seed": -1}, r"dataset_seed must be an int in \[0, 2146483648\]"),
                       ({"dataset_seed": 2**31}, "the eval split's items start at generator seed 2147483648")]:
        with pytest.raises(ValueError, match=match):
            ReasoningGymEnv(**bad)
    for env_id in ("agentrl/RG-v0", "agentrl/RG-Calc-v0", "agentrl/RG-Chain-v0"):
        assert heldout_kwargs(env_id, {})["split"] == "eval"


def test_cli_check_env_says_the_split_is_checked(capsys, monkeypatch):
    from agentrl.cli import main

    monkeypatch.setenv("COLUMNS", "300")  # the table on one line a row, so the note reads whole
    assert main(["check-env", "agentrl/RG-v0", "--kw", "difficulty=2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "split" in out and "1,000,000 train and 1,000,000 eval tasks, none shared" in out


def test_multi_turn_expert_checks_on_the_calculator_where_the_item_has_an_expression():
    env = ReasoningGymCalcEnv(task="products", difficulty=2)
    reward, actions = play(env, seed=1)  # "3 * 7", by the item
    assert reward == 1.0 and [json.loads(a[11:-12])["name"] for a in actions] == ["calculator", "answer"]
    assert env.calculator("3 * 7") == "3 * 7 = 21"
    env = ReasoningGymCalcEnv(task="word_sorting", difficulty=3)
    reward, actions = play(env, seed=1)
    assert reward == 1.0 and len(actions) == 1  # no expression to check: the answer at once


def test_no_answer_is_a_zero_not_an_error():
    env = ReasoningGymCalcEnv(task="chain_sum", difficulty=3)
    env.reset(seed=0)
    for _ in range(env.max_turns):
        _, reward, terminated, truncated, _ = env.step(call("note", text="thinking"))
    assert truncated and not terminated and reward == 0.0


def test_scratchpad_is_bounded():
    env = ReasoningGymCalcEnv(task="chain_sum", difficulty=3, max_turns=20)
    env.reset(seed=0)
    for i in range(15):
        obs, *_ = env.step(call("note", text=f"line {i} " + "x" * 2000))
    assert len(obs) < 10 * 210 and obs.count("\n") == 10 and "6. line 5" in obs and "15. line 14" in obs


def test_noisy_expert_is_reproducible_and_costs_something():
    env = agentrl.make("agentrl/RG-Calc-v0")
    first = [play(env, s, noise=0.6) for s in range(20)]
    assert first == [play(env, s, noise=0.6) for s in range(20)]
    assert 0 < sum(r for r, _ in first) < 20


def test_rg_chain_takes_one_operation_a_turn_and_scores_only_the_answer():
    from agentrl.adapters.reasoning_gym_tasks import ReasoningGymChainEnv

    assert [(r.name, r.message) for r in check_env("agentrl/RG-Chain-v0", difficulty=4, slack=1) if not r.ok] == []
    env = ReasoningGymChainEnv(difficulty=3, slack=1)
    obs, _ = env.reset(seed=0)
    assert obs.endswith("1 - 7 + 5 =")  # -1, by hand: -6 after one operation
    obs, reward, *_, info = env.step(call("calculator", expression="1 - 7 + 5"))
    assert "one operation" in obs and reward == 0.0 and info["step_reward"] == 0.0
    obs, _, terminated, _, info = env.step(call("calculator", expression="1 - 7"))
    assert obs.endswith("= -6") and not terminated and info["step_reward"] == 0.0  # progress is never scored
    assert env.step(call("answer", answer="-1"))[1:3] == (1.0, True)
    rewards = [play(ReasoningGymChainEnv(difficulty=6, slack=2), seed)[0] for seed in range(20)]
    assert rewards == [1.0] * 20  # the noise-free expert passes
    _, actions = play(ReasoningGymChainEnv(difficulty=6, slack=2), 0)
    assert len(actions) == 6  # five operations and the answer


def test_rg_chain_answers_a_calculation_it_cannot_do_with_an_error_the_policy_reads():
    """The policy's numbers are its own text: a leading zero ("05 + 3" is not Python) or a division by zero is an
    observation and a spent turn, never an episode that raises (an RL run on rg-chain stopped on "05")."""
    from agentrl.adapters.reasoning_gym_tasks import ReasoningGymChainEnv

    env = ReasoningGymChainEnv(difficulty=3, slack=1)
    env.reset(seed=0)  # 1 - 7 + 5
    for bad in ("01 - 7", "1 / 0"):
        obs, reward, terminated, truncated, _ = env.step(call("calculator", expression=bad))
        assert obs.startswith("calculator error:") and (reward, terminated, truncated) == (0.0, False, False)
    assert env.folded == 0 and env.turn == 2
    obs, *_ = env.step(call("calculator", expression="1 - 7"))
    assert obs.endswith("= -6") and env.folded == 1  # the episode goes on where it was


def test_rg_chain_state_key_is_the_progress_of_the_sum_whatever_turns_were_wasted():
    """gigpo's step groups: two episodes of one task that reach the same partial sum share a state, one that
    wasted a turn on the way included; one still at the start does not."""
    from agentrl.adapters.reasoning_gym_tasks import ReasoningGymChainEnv

    straight, wasteful = ReasoningGymChainEnv(difficulty=3, slack=1), ReasoningGymChainEnv(difficulty=3, slack=1)
    for env in (straight, wasteful):
        env.reset(seed=0)  # 1 - 7 + 5
    assert wasteful.step(call("calculator", expression="1 - 8"))[-1]["state_key"] == 0  # -7: not a partial sum
    keys = [env.step(call("calculator", expression="1 - 7"))[-1]["state_key"] for env in (straight, wasteful)]
    assert keys == [1, 1]  # -6, the first partial sum, on the first turn and on the second
    assert straight.step(call("calculator", expression="-6 + 5"))[-1]["state_key"] == 2


def test_the_sweeps_rg_chain_family_sets_the_turn_budget_by_its_terms():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from horizon_sweep import FAMILIES

    fam = FAMILIES["rg-chain"]
    for n in fam.horizons:
        env = agentrl.make(fam.env_id, **fam.env_kwargs(n, fam.slack(n)))
        assert env.max_turns == fam.max_turns(n, fam.slack(n)) == n + fam.slack(n)
