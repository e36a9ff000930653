"""VaultMemory-v0: the expert plays it at every length, a seed gives the same episode twice, only the codes read
at the start open the doors at the end, and `facts_kept` / `expert_summary` say what a summary carries."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.checker import check_env
from agentrl.envs.vault_memory import VaultMemoryEnv, _call


def play(env: VaultMemoryEnv, seed: int, noise: float = 0.0, summarize_at: tuple[int, ...] = ()):
    obs, _ = env.reset(seed=seed)
    trace = [obs]
    while True:
        if env.turn in summarize_at:
            trace.append(env.expert_summary(noise))
        obs, reward, terminated, truncated, info = env.step(env.expert_action(noise))
        trace.append((obs, reward, terminated, truncated, info["state_key"]))
        if terminated or truncated:
            return reward, info["turn"], trace


@pytest.mark.parametrize("kw", [dict(patrols=12), dict(patrols=60), dict(doors=1, patrols=0, slack=0),
                                dict(doors=8, patrols=2)], ids=str)
def test_the_clean_expert_opens_the_vault_in_the_fewest_turns(kw):
    env = VaultMemoryEnv(**kw)
    for seed in range(5):
        assert play(env, seed)[:2] == (1.0, 2 * env.doors + env.patrols)


def test_registered_with_sixteen_turns_by_default():
    env = agentrl.make("agentrl/VaultMemory-v0")
    assert isinstance(env, VaultMemoryEnv) and play(env, 0)[1] == 16


@pytest.mark.parametrize("kw", [dict(), dict(doors=1, patrols=0, slack=0)], ids=str)
def test_check_env_passes(kw):
    failed = [(r.name, r.message) for r in check_env(VaultMemoryEnv, **kw) if not r.ok]
    assert failed == []


def test_a_seed_gives_the_same_episode_twice_and_the_noise_costs_something():
    env = VaultMemoryEnv(patrols=8)
    runs = [[play(env, s, noise=0.6, summarize_at=(4, 8)) for s in range(8)] for _ in range(2)]
    assert runs[0] == runs[1]
    assert sum(r for r, _, _ in runs[0]) < 8
    env.reset(seed=0)
    logs = env.log(3)
    env.step(_call("patrol", step=1))  # a wasted turn changes no later log: logs depend on the seed and step only
    env.reset(seed=0)
    assert env.log(3) == logs and len(logs.splitlines()) == env.log_lines


def test_only_the_code_read_at_the_start_opens_a_door():
    env = VaultMemoryEnv(doors=1, patrols=2)
    env.reset(seed=5)
    assert "not next" in env.step(_call("open", door=1, code=env.codes[0]))[0]  # the notes and the patrol first
    code = int(env.step(_call("note", door=1))[0].split()[3].rstrip("."))
    for step in (1, 2):
        obs = env.step(_call("patrol", step=step))[0]
        assert str(code) not in obs  # nothing after the note repeats its code
    assert "wrong code" in env.step(_call("open", door=1, code=code % 900 + 100))[0]
    obs, reward, terminated, _, info = env.step(_call("open", door=1, code=code))
    assert (reward, terminated, info["step_reward"]) == (1.0, True, 1.0)


def test_facts_kept_is_the_share_of_needed_codes_a_summary_holds():
    env = VaultMemoryEnv(doors=3, patrols=1)
    env.reset(seed=1)
    assert env.facts_kept("") == 1.0  # nothing read, nothing needed
    for door in (1, 2):
        env.step(_call("note", door=door))
    a, b, c = env.codes
    assert env.facts_kept(f"door 1 code {a}. door 2 code {b}.") == 1.0
    assert env.facts_kept(f"1: {a}") == 0.5
    assert env.facts_kept(f"door 1 code {a}1, {c}") == 0.0  # a code inside a longer number, a code not yet read
    env.step(_call("note", door=3))
    env.step(_call("patrol", step=1))
    env.step(_call("open", door=1, code=a))
    assert env.facts_kept(f"{b} {c}") == 1.0  # door 1 is open: its code is needed no more


def test_the_expert_summary_lists_the_codes_and_a_dropped_code_is_guessed_at():
    env = VaultMemoryEnv(doors=2, patrols=2)
    env.reset(seed=2)
    for _ in range(3):
        env.step(env.expert_action())
    summary = env.expert_summary()
    assert summary == f"door 1 code {env.codes[0]}. door 2 code {env.codes[1]}. next: patrol 2."
    assert env.facts_kept(summary) == 1.0
    assert [play(env, s, summarize_at=(3,))[0] for s in range(4)] == [1.0] * 4  # it keeps both and opens the vault
    kept = []
    for seed in range(48):  # noise 1 drops one code about one time in eight, and the expert then no longer holds it
        env.reset(seed=seed)
        env.step(_call("note", door=1))
        env.step(_call("note", door=2))
        env._known = dict(enumerate(env.codes, 1))
        kept.append(env.facts_kept(env.expert_summary(noise=1.0)))
        if kept[-1] < 1:
            assert len(env._known) == 1 and env.expert_summary().count("code") == 1  # gone for good
    assert set(kept) == {0.5, 1.0} and 1 <= kept.count(0.5) < 15


@pytest.mark.parametrize("kw, name", [(dict(doors=0), "doors"), (dict(doors=9), "doors"), (dict(patrols=-1), "patrols"),
                                      (dict(slack=-1), "slack"), (dict(log_lines=0), "log_lines"),
                                      (dict(doors=1.5), "doors"), (dict(patrols=True), "patrols")])
def test_values_outside_the_edges_are_refused_naming_the_parameter(kw, name):
    with pytest.raises(ValueError, match=f"VaultMemory: {name} must be"):
        VaultMemoryEnv(**kw)


def test_check_env_fails_an_expert_whose_summary_loses_a_code():
    class Forgetful(VaultMemoryEnv):
        def expert_summary(self, noise: float = 0.0) -> str:
            return f"next: {self.next_action()}."

    checks = {r.name: r for r in check_env(Forgetful)}
    assert checks["expert_summary"].ok is False and "keeps 0.0 of the facts" in checks["expert_summary"].message
    assert checks["expert_finishes"].ok  # the other checks do not see it
