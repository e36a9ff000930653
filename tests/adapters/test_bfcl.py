"""BFCL-v0: BFCL's multi-turn entries, its API classes and its own checker behind an AgentEnv.

Skips without bfcl-eval (install: pip install --no-deps bfcl-eval==2026.3.23; agentrl/adapters/bfcl.py says why).
"""

import json
import pickle

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval==2026.3.23)")

from agentrl.adapters.bfcl import BACKEND, BFCLEnv, load_category  # noqa: E402
from agentrl.checker import check_env  # noqa: E402
from agentrl.registry import make  # noqa: E402


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def play(env, seed, actor):
    env.reset(seed=seed)
    while True:
        obs, reward, terminated, truncated, info = env.step(actor(env))
        if terminated or truncated:
            return reward, terminated, truncated, info


@pytest.mark.parametrize("split, entries", [("train", 20), ("eval", 5)])  # 0-24: 3, 8, 13, 18, 23 held out
def test_expert_scores_one_on_bfcls_checker_for_a_slice_of_base(split, entries):
    env = BFCLEnv(category="base", subset="0-25", split=split)
    scores = [play(env, seed, lambda e: e.expert_action())[0] for seed in range(len(env.entries))]
    assert scores == [1.0] * entries, [env.entries[i].id for i, s in enumerate(scores) if s != 1.0]


@pytest.mark.parametrize("category", ["miss_func", "miss_param", "long_context"])
def test_expert_on_the_other_categories(category):
    env = BFCLEnv(category=category, subset=4)
    assert [play(env, s, lambda e: e.expert_action())[0] for s in range(4)] == [1.0] * 4


def test_check_env_passes():
    failed = [(r.name, r.message) for r in check_env(make("agentrl/BFCL-v0", subset=3)) if not r.ok]
    assert failed == []


def test_replying_at_once_fails_and_the_checker_says_why():
    env = BFCLEnv(subset=[0])
    reward, terminated, truncated, info = play(env, 0, lambda e: "Sure, done.")
    assert (reward, terminated, truncated, info["malformed_calls"]) == (0.0, True, False, 0)
    assert env.verdict["error_type"] == "multi_turn:empty_turn_model_response"


def test_a_missing_call_changes_the_state_and_fails():
    env = BFCLEnv(subset=[0])  # turn 0's truth: cd(document), mkdir(temp), mv(final_report.pdf -> temp)

    def skip_mkdir(e):
        text = e.expert_action()
        if e._user_turn == 0 and "mkdir" in text:
            return text.replace(call("mkdir", dir_name="temp"), "")
        return text

    assert play(env, 0, skip_mkdir)[0] == 0.0
    assert env.verdict["valid"] is False


def test_user_turns_come_in_order_after_a_reply():
    env = BFCLEnv(subset=[0])
    obs, info = env.reset(seed=0)
    question = env.entry.record["question"]
    assert obs == question[0][0]["content"] and info["user_turns"] == len(question)
    obs, *_ = env.step(env.expert_action())  # the calls: their results, the same user turn
    assert "User:" not in obs
    obs, reward, terminated, truncated, info = env.step("Done.")  # a reply: the next user message
    assert obs == "User: " + question[1][0]["content"]
    assert (reward, terminated, info["malformed"]) == (0.0, False, 0)


def test_hostile_calls_are_observations_not_crashes():
    env = BFCLEnv(subset=[0])
    env.reset(seed=0)
    for bad, said in [("<tool_call>{not json</tool_call>", "error"),
                      (call("rm_rf_everything"), "unknown tool"),
                      (call("cd", folder="document", force=True), "force"),
                      (call("cd"), "folder"),
                      ('<tool_call>{"name": "cd", "arguments": [1, 2]}</tool_call>', "error")]:
        obs, reward, terminated, truncated, info = env.step(bad)
        assert said in obs and info["malformed"] >= 1 and not (terminated or truncated), (bad, obs)
    # a call the API class itself refuses or raises on: BFCL's own error text, not counted as malformed
    obs, *_, info = env.step(call("cd", folder="no_such_folder"))
    assert "error" in obs.lower() and info["malformed"] == 0
    obs, *_, info = env.step(call("mkdir", dir_name={"not": "a name"}))
    assert obs.startswith("Error during execution:") and info["malformed"] == 0


def test_values_go_to_the_api_as_written_as_bfcl_passes_them():
    # its ground truth: close_ticket(ticket_id='ticket_001'); 173 is held out, so it is played in the eval split
    env = BFCLEnv(subset=["multi_turn_base_173"], split="eval")
    assert play(env, 0, lambda e: e.expert_action())[0] == 1.0


def test_step_limit_of_a_user_turn_truncates_with_zero():
    env = BFCLEnv(subset=[0], steps_per_turn=3)
    env.reset(seed=0)
    for _ in range(4):
        obs, reward, terminated, truncated, info = env.step(call("pwd"))
    # as BFCL: the limit's 3 steps run and may still end with an answer; the 4th runs, then the entry fails
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, True, 4)
    assert env.verdict["error_type"] == "multi_turn:force_terminated"
    assert len(env._steps[0]) == 4 and "4 steps in one user turn, more than 3" in obs


def test_the_step_limits_own_steps_may_still_end_with_an_answer():
    env = BFCLEnv(subset=[0], steps_per_turn=3)
    env.reset(seed=0)
    for _ in range(3):
        _, _, terminated, truncated, _ = env.step(call("pwd"))
        assert not (terminated or truncated)
    obs, _, terminated, truncated, _ = env.step("Done.")  # the answer ends user turn 0 inside the limit
    assert not truncated and not env._forced_out and (terminated or obs.startswith("User: "))


def test_replays_of_one_entry_are_judged_afresh():
    import importlib

    utils = importlib.import_module(f"{BACKEND}.multi_turn_utils")
    before = {k for k in vars(utils) if k.startswith("agentrl_")}
    env = BFCLEnv(subset=[0])
    assert play(env, 0, lambda e: e.expert_action())[0] == 1.0
    assert play(env, 0, lambda e: "no.")[0] == 0.0  # the checker's instances of the last verdict are not reused
    assert play(env, 0, lambda e: e.expert_action())[0] == 1.0
    assert {k for k in vars(utils) if k.startswith("agentrl_")} == before  # nothing left in the checker's globals


def test_miss_func_hands_the_held_out_function_in_at_its_turn():
    env = BFCLEnv(category="miss_func", subset=[0])  # 'sort' is held out until turn 3
    env.reset(seed=0)
    assert "sort" not in [s["function"]["name"] for s in env.tool_schemas()]
    obs, *_ = env.step(call("sort", file_name="final_report.pdf"))
    assert "unknown tool" in obs
    for _ in range(40):
        if env._user_turn == 3:
            break
        obs, *_ = env.step(env.expert_action())
    assert env._user_turn == 3 and '"name": "sort"' in obs and "I have updated some more functions" in obs
    assert "sort" in env._tools


def test_pickled_mid_episode_plays_on_alike():
    env = BFCLEnv(category="miss_func", subset=[0])
    env.reset(seed=0)
    for _ in range(7):
        env.step(env.expert_action())
    copy = pickle.loads(pickle.dumps(env))  # at user turn 4, 'sort' handed in at turn 3
    a = [env.step(env.expert_action())[:4] for _ in range(2)]
    b = [copy.step(copy.expert_action())[:4] for _ in range(2)]
    assert a[-1][1:3] == (1.0, True)
    assert a == b


def test_subset_and_category_knobs():
    assert len(BFCLEnv(subset=5).entries) == 5
    assert [e.id for e in BFCLEnv(subset="10-12").entries] == ["multi_turn_base_10", "multi_turn_base_11"]
    assert [e.id for e in BFCLEnv(subset=["multi_turn_base_7", 4]).entries] == ["multi_turn_base_7",
                                                                                 "multi_turn_base_4"]
    assert len(load_category("miss_param")) == 200
    for bad in [0, 201, "5-5", "multi_turn_nope", [500], True]:
        with pytest.raises(ValueError):
            BFCLEnv(subset=bad)
    with pytest.raises(ValueError, match="unknown category"):
        BFCLEnv(category="parallel")
    with pytest.raises(ValueError, match="functions"):
        BFCLEnv(functions="some")


def test_path_functions_are_a_smaller_prompt_the_expert_still_solves():
    env = BFCLEnv(subset=3, functions="path")
    env.reset(seed=0)
    assert len(env.tool_schemas()) < len(BFCLEnv(subset=3).tool_schemas())
    assert [play(env, s, lambda e: e.expert_action())[0] for s in range(3)] == [1.0] * 3


def test_every_fifth_scenario_is_held_out_in_every_category():
    # by hand: entry N is held out when N % 5 == 3, so of 0..12 the eval split holds 3 and 8 (and 13 is the next)
    assert BFCLEnv(split="eval").task_ids(limit=3) == ["multi_turn_base_3", "multi_turn_base_8", "multi_turn_base_13"]
    assert BFCLEnv().task_ids(limit=5) == ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2",
                                           "multi_turn_base_4", "multi_turn_base_5"]
    for category in ("base", "miss_func", "miss_param", "long_context"):
        train, held = BFCLEnv(category=category).task_ids(), BFCLEnv(category=category, split="eval").task_ids()
        assert (len(train), len(held)) == (160, 40) and not set(train) & set(held)
        assert sorted(train + held) == sorted(e.id for e in load_category(category))
        # entry N of every category is one scenario: the same numbers are held out in each
        assert [int(i.rsplit("_", 1)[1]) for i in held] == list(range(3, 200, 5))


def test_an_eval_split_never_plays_a_train_entry():
    train = set(BFCLEnv().task_ids())
    env = BFCLEnv(split="eval")
    played = {env.reset(seed=seed)[1]["task_id"] for seed in range(200)}
    assert played == set(env.task_ids()) and not played & train  # seed % 40: every held-out entry, five times


def test_subset_works_within_the_split_and_refuses_the_other_splits_entries():
    assert BFCLEnv(subset=4, split="eval").task_ids() == [f"multi_turn_base_{n}" for n in (3, 8, 13, 18)]
    assert BFCLEnv(subset="150-160", split="eval").task_ids() == ["multi_turn_base_153", "multi_turn_base_158"]
    with pytest.raises(ValueError, match=r"subset item 3 \(multi_turn_base_3\) is in the eval split, not 'train'"):
        BFCLEnv(subset=[3])
    with pytest.raises(ValueError, match="holds no entry of the train split"):
        BFCLEnv(subset="3-4")
    with pytest.raises(ValueError, match="between 1 and the eval split's 40 entries"):
        BFCLEnv(subset=41, split="eval")
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        BFCLEnv(split="test")


def test_check_env_checks_the_split_and_heldout_kwargs_picks_the_eval_one():
    from agentrl.evaluation import heldout_kwargs

    result = next(r for r in check_env("agentrl/BFCL-v0") if r.name == "split")
    assert result.ok and result.message.startswith("160 train and 40 eval tasks, none shared"), result.message
    assert heldout_kwargs("agentrl/BFCL-v0", {"subset": 3}) == {"subset": 3, "split": "eval"}
    assert heldout_kwargs("agentrl/BFCL-v0", {"split": "train"}) == {"split": "train"}  # named: kept
    # a list of train entries has no eval counterpart: the check says so, as held-out evaluation would fail
    result = next(r for r in check_env("agentrl/BFCL-v0", subset=[0, 1]) if r.name == "split")
    assert not result.ok and "multi_turn_base_0" in result.message and "in the train split" in result.message
