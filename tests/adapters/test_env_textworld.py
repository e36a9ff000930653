"""TextWorld through the real textworld package: games generated from a seed and cached, check_env,
the walkthrough expert whose length is the quest length, the game's text as observations."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("textworld", reason="textworld is not installed (pip install 'agentrl[textworld]')")

import agentrl  # noqa: E402
from agentrl.adapters.textworld_games import TextWorldEnv, cache_folder, make_game_file  # noqa: E402
from agentrl.checker import check_env  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    # a fresh cache: the games are made here by TextWorld's generator and Inform 7, not read from a past run
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTRL_CACHE", str(tmp_path_factory.mktemp("agentrl-cache")))
        yield


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def play(env, seed, noise=0.0):
    env.reset(seed=seed)
    n = 0
    while True:
        _, reward, terminated, truncated, _ = env.step(env.expert_action(noise))
        n += 1
        if terminated or truncated:
            return reward, n, terminated


@pytest.mark.parametrize("quest_length", [1, 3])
def test_check_env_passes(quest_length):
    failed = [(r.name, r.message) for r in check_env("agentrl/TextWorld-v0", quest_length=quest_length, games=2)
              if not r.ok]
    assert failed == []


@pytest.mark.parametrize("quest_length", [1, 3])
def test_walkthrough_expert_wins_in_exactly_quest_length_commands(quest_length):
    env = agentrl.make("agentrl/TextWorld-v0", quest_length=quest_length, games=2)
    for seed in range(3):
        assert play(env, seed) == (1.0, quest_length, True)
    assert env.max_turns == quest_length + 4


def test_games_are_made_once_and_kept_in_the_cache():
    path = make_game_file(1, 3, 5, seed=0)
    assert path.parent == cache_folder() and path.exists() and path.with_suffix(".json").exists()
    stamp = path.stat().st_mtime_ns
    assert make_game_file(1, 3, 5, seed=0) == path and path.stat().st_mtime_ns == stamp


def test_a_command_the_game_does_not_know_is_its_answer_not_an_error():
    env = TextWorldEnv(quest_length=1, games=1)
    obs, _ = env.reset(seed=0)
    assert "TextWorld" in obs and "$$" not in obs  # the intro without the ASCII-art banner
    obs, reward, terminated, truncated, info = env.step(call("command", text="dance wildly"))
    assert obs and info["malformed"] == 0 and not (terminated or truncated)
    obs, *_ = env.step(call("command", text="   "))
    assert obs.startswith("the command is empty")


def test_not_winning_is_a_zero_and_slips_cost_turns():
    env = TextWorldEnv(quest_length=3, games=1, slack=0)
    env.reset(seed=0)
    for _ in range(env.max_turns):
        _, reward, terminated, truncated, _ = env.step(call("command", text="look"))
    assert truncated and not terminated and reward == 0.0
    noisy = [play(env, s, noise=0.9) for s in range(4)]
    assert noisy == [play(env, s, noise=0.9) for s in range(4)] and sum(r for r, *_ in noisy) < 4


def test_envs_in_a_thread_pool_load_and_play_games_at_once():
    # TextWorld parses a game's logic with one shared parser object: two envs loading at once (a thread pool,
    # the default rollout workers) corrupted its state (IndexError deep in tatsu) before loads were serialised
    from concurrent.futures import ThreadPoolExecutor

    envs = [TextWorldEnv(quest_length=1, games=2) for _ in range(12)]

    def episode(i):
        env = envs[i]
        return play(env, seed=i)

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(episode, range(12)))
    with ThreadPoolExecutor(12) as pool:  # twice: the second round loads games that other envs hold open
        again = list(pool.map(episode, range(12)))
    assert results == again
    assert all(reward == 1.0 and terminated for reward, _, terminated in results)


def test_a_pickled_copy_plays_its_own_game():
    # how a process pool (rollout.env_workers process:N) receives the env: the module and the running game stay behind
    import pickle

    env = TextWorldEnv(quest_length=1, games=2)
    first = play(env, seed=3)
    copy = pickle.loads(pickle.dumps(env))
    assert copy.game is None and copy.tw is env.tw
    assert play(copy, seed=3) == first


def test_the_eval_splits_games_come_from_generator_seeds_no_training_pool_reaches(monkeypatch):
    # by hand: game i of pool p is seed 1000 p + i; the eval split adds 2**31 = 2147483648. Named, not made:
    from agentrl.adapters import textworld_games

    monkeypatch.setattr(textworld_games, "make_game_file", lambda *a: pytest.fail("task_ids() made a game"))
    assert TextWorldEnv(quest_length=1, games=2).task_ids() == ["q1-r3-o5-s0", "q1-r3-o5-s1"]
    assert TextWorldEnv(quest_length=1, games=2, pool_seed=3).task_ids() == ["q1-r3-o5-s3000", "q1-r3-o5-s3001"]
    assert TextWorldEnv(quest_length=1, games=2, split="eval").task_ids() == ["q1-r3-o5-s2147483648",
                                                                               "q1-r3-o5-s2147483649"]
    largest = TextWorldEnv(quest_length=1, games=1000, pool_seed=2147482).task_ids()[-1]
    assert largest == "q1-r3-o5-s2147482999"  # the last training seed, below 2**31


def test_an_eval_split_plays_only_its_own_games():
    env = TextWorldEnv(quest_length=1, games=1, split="eval")  # one game: the smallest pool to generate
    train = set(TextWorldEnv(quest_length=1, games=4).task_ids())
    played = {env.reset(seed=seed)[1]["task_id"] for seed in range(20)}
    assert played == {"q1-r3-o5-s2147483648"} and not played & train
    assert (cache_folder() / "q1-r3-o5-s2147483648.z8").exists()


def test_split_arguments_are_checked_and_heldout_kwargs_picks_the_eval_split():
    from agentrl.evaluation import heldout_kwargs

    for bad, match in [({"split": "test"}, "split must be 'train' or 'eval'"),
                       ({"games": 1001}, "games must be 1-1000"),
                       ({"pool_seed": -1}, r"pool_seed must be an int in \[0, 2147482\]")]:
        with pytest.raises(ValueError, match=match):
            TextWorldEnv(**bad)
    assert heldout_kwargs("agentrl/TextWorld-v0", {"games": 2}) == {"games": 2, "split": "eval"}
