"""TextArena games (Tower of Hanoi, FrozenLake, Sokoban) through the real textarena package: check_env at
two knob values, exact horizons, the experts, the game's own reward and rules, and TextArena's global
`random` kept to itself."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("textarena", reason="textarena is not installed (pip install 'agentrl[textarena]')")

import agentrl  # noqa: E402
from agentrl.adapters.textarena_games import HanoiEnv, hanoi_next_move  # noqa: E402
from agentrl.checker import check_env  # noqa: E402


def call(name, **arguments):
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def play(env, seed, noise=0.0):
    env.reset(seed=seed)
    steps, rewards = [], []
    while True:
        obs, reward, terminated, truncated, info = env.step(env.expert_action(noise))
        steps.append(obs)
        rewards.append(info["step_reward"])
        if terminated or truncated:
            return reward, len(steps), terminated, rewards


@pytest.mark.parametrize("env_id, kwargs", [
    ("agentrl/TA-TowerOfHanoi-v0", {"disks": 1}), ("agentrl/TA-TowerOfHanoi-v0", {"disks": 5}),
    ("agentrl/TA-FrozenLake-v0", {"size": 3}), ("agentrl/TA-FrozenLake-v0", {"size": 8}),
    ("agentrl/TA-Sokoban-v0", {"size": 5}), ("agentrl/TA-Sokoban-v0", {"size": 7, "boxes": 2}),
])
def test_check_env_passes(env_id, kwargs):
    assert [(r.name, r.message) for r in check_env(env_id, **kwargs) if not r.ok] == []


@pytest.mark.parametrize("disks, moves", [(1, 1), (2, 3), (3, 7), (4, 15), (5, 31)])
def test_hanoi_expert_takes_exactly_two_to_the_n_minus_one_moves(disks, moves):
    env = agentrl.make("agentrl/TA-TowerOfHanoi-v0", disks=disks)
    reward, n, terminated, step_rewards = play(env, seed=disks)
    assert (reward, n, terminated) == (1.0, moves, True)
    assert env.max_turns == moves + 2  # optimal + slack
    assert sum(step_rewards) == pytest.approx(1.0)  # the game's completion went from 0 to 1


def test_hanoi_three_disks_follows_the_textbook_sequence():
    env = HanoiEnv(disks=3)
    env.reset(seed=0)
    seen = []
    for _ in range(7):
        action = env.expert_action()
        seen.append(action.split('"source": "')[1][0] + action.split('"target": "')[1][0])
        env.step(action)
    assert seen == ["AC", "AB", "CB", "AC", "BA", "BC", "AC"]


def test_hanoi_next_move_from_a_position_off_the_optimal_path():
    # disk 3 on A, disks 2 and 1 on B: move 3 to C, then 1 to A, 2 to C, 1 to C (four moves, by hand)
    peg_of = {3: "A", 2: "B", 1: "B"}
    sequence = []
    while (m := hanoi_next_move(peg_of, 3, "C")) is not None:
        disk = min(d for d, p in peg_of.items() if p == m[0])
        peg_of[disk] = m[1]
        sequence.append(m)
    assert sequence == [("A", "C"), ("B", "A"), ("B", "C"), ("A", "C")]


def test_illegal_move_is_the_games_warning_and_costs_a_turn():
    env = HanoiEnv(disks=3)
    env.reset(seed=0)
    env.step(call("move", source="A", target="C"))  # disk 1 onto C
    obs, reward, terminated, truncated, info = env.step(call("move", source="A", target="C"))  # disk 2 onto 1
    assert "invalid move" in obs and "larger disk on a smaller disk" in obs
    assert not terminated and info["malformed"] == 0  # a well-formed call: the game judged it, not the parser
    obs, *_ = env.step(call("move", source="A", target="C"))  # a second in a row: still only a warning
    assert not env._ended and env.state_key() == ((3, 2), (), (1,))


def test_textarenas_own_rule_ends_the_game_on_a_second_illegal_move():
    env = HanoiEnv(disks=3, error_allowance=1)
    env.reset(seed=0)
    env.step(call("move", source="A", target="C"))
    env.step(call("move", source="A", target="C"))
    obs, reward, terminated, truncated, _ = env.step(call("move", source="A", target="C"))
    assert terminated and not truncated and reward == 0.0 and "Invalid Move" in obs


def test_bad_argument_never_reaches_the_game():
    env = HanoiEnv(disks=2)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("move", source="A", target="D"))
    assert info["malformed"] == 1 and obs.startswith("error: bad arguments for move")
    assert env.game.state.turn == 0 and env.state_key() == ((2, 1), (), ())


def test_truncation_scores_the_game_completion_only_with_partial_credit():
    for partial, expected in [(False, 0.0), (True, 1 / 3)]:  # disk 3 placed on C, disks 2 and 1 not: 1/3
        env = HanoiEnv(disks=3, slack=0, partial_credit=partial)
        env.reset(seed=0)
        # four optimal moves put disk 3 on C; three legal moves of disk 1 between B and A use up the 7 turns
        for action in ["AC", "AB", "CB", "AC", "BA", "AB", "BA"]:
            _, reward, terminated, truncated, _ = env.step(call("move", source=action[0], target=action[1]))
        assert truncated and not terminated and reward == pytest.approx(expected)


@pytest.mark.parametrize("size, moves", [(3, 4), (4, 6), (6, 10)])
def test_frozenlake_horizon_is_exactly_the_corner_to_corner_distance(size, moves):
    env = agentrl.make("agentrl/TA-FrozenLake-v0", size=size)
    for seed in range(5):
        reward, n, terminated, _ = play(env, seed)
        assert (reward, n, terminated) == (1.0, moves, True)


def test_frozenlake_hole_loses_and_partial_credit_is_the_games_fraction():
    for partial in (False, True):
        env = agentrl.make("agentrl/TA-FrozenLake-v0", size=4, partial_credit=partial)
        for seed in range(20):  # find a board with a hole next to the start
            env.reset(seed=seed)
            grid = env.game.state.game_state["grid"]
            if grid[1][0] == "H":
                break
        else:
            pytest.fail("no 4x4 board among 20 with a hole below the start")
        obs, reward, terminated, truncated, _ = env.step(call("move", direction="down"))
        assert terminated and "hole" in obs
        # the game's fraction: one step of the six from corner to corner, 1/6
        assert reward == (pytest.approx(1 / 6) if partial else 0.0)


def test_sokoban_expert_solves_within_the_budget():
    env = agentrl.make("agentrl/TA-Sokoban-v0", size=6, boxes=2)
    for seed in range(4):
        reward, n, terminated, _ = play(env, seed)
        assert reward == 1.0 and terminated and n <= 18


def test_noisy_experts_are_reproducible_and_cost_something():
    for env in [HanoiEnv(disks=4), agentrl.make("agentrl/TA-FrozenLake-v0", size=6)]:
        first = [play(env, s, noise=0.5) for s in range(8)]
        assert first == [play(env, s, noise=0.5) for s in range(8)]
        assert sum(r[0] for r in first) < 8


def test_global_random_is_left_as_it_was():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    env = agentrl.make("agentrl/TA-FrozenLake-v0", size=5)
    play(env, seed=4)
    assert random.random() == expected


def test_the_horizon_sweeps_hanoi_family_builds_the_adapters_turn_budget():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from horizon_sweep import FAMILIES

    fam = FAMILIES["hanoi"]
    for disks, slack in [(2, 2), (3, 2), (4, 5)]:
        assert fam.slack(disks) == slack
        env = agentrl.make(fam.env_id, **fam.env_kwargs(disks, slack))
        assert env.max_turns == fam.max_turns(disks, slack) == 2**disks - 1 + slack
    assert FAMILIES["vault"].env_kwargs(3, 1) == {"locks": 3, "slack": 1}


def test_hanoi_random_start_draws_new_legal_puzzles_and_the_expert_solves_each():
    env = HanoiEnv(disks=3, slack=0, start="random")
    starts = set()
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        towers = env._towers()
        assert sorted(d for p in towers.values() for d in p) == [1, 2, 3]
        assert all(p == sorted(p, reverse=True) for p in towers.values())  # larger below smaller
        assert towers["C"] != [3, 2, 1]  # never the solved position
        assert f"A: {towers['A']}" in obs and "from where they stand" in obs  # the board shown is the one drawn
        starts.add(info["state_key"])
        reward, n, terminated, _ = play(env, seed)
        assert reward == 1.0 and terminated and n <= 7  # no position is further than 2**3 - 1 moves from the goal
    assert len(starts) >= 15  # of the 26 positions other than the solved one
    env.reset(seed=3)
    first = env._towers()
    env.reset(seed=3)
    assert env._towers() == first  # the episode's seed decides the puzzle
    with pytest.raises(ValueError, match="start must be 'tower'"):
        HanoiEnv(start="anywhere")


def test_the_sweeps_new_families_build_their_envs_at_every_default_horizon():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from horizon_sweep import FAMILIES

    for name in ("hanoi-varied", "frozenlake"):
        fam = FAMILIES[name]
        for n in fam.horizons:
            env = agentrl.make(fam.env_id, **fam.env_kwargs(n, fam.slack(n)))
            assert env.max_turns == fam.max_turns(n, fam.slack(n))
    assert FAMILIES["hanoi-varied"].env_kwargs(2, 2) == {"disks": 2, "slack": 2, "start": "random"}
    assert FAMILIES["frozenlake"].max_turns(5, 2) == 2 * 4 + 2
