"""OpenEnv both ways, against the package's own server and client on 127.0.0.1: an agentrl env served by
`agentrl serve-env` and consumed back through `OpenEnvEnv` gives the episodes the env gives directly; a
generic OpenEnv env (an `openenv.core` Environment written here, served by `create_fastapi_app`) is
played through its `act` tool; a server that dies or hangs mid-episode is an `EnvError` naming it, in
bounded time."""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("openenv.core", reason="openenv-core is not installed (pip install 'agentrl[openenv]')")

from openenv.core.env_server import Environment, create_fastapi_app  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402

from agentrl.adapters.openenv import OpenEnvEnv  # noqa: E402
from agentrl.adapters.serve import bind  # noqa: E402
from agentrl.checker import check_env  # noqa: E402
from agentrl.core import EnvError  # noqa: E402
from agentrl.engines import ScriptedEngine  # noqa: E402
from agentrl.registry import make
from agentrl.rollout import rollout  # noqa: E402

START_TIMEOUT = 90  # seconds for `agentrl serve-env` to print its address (importing OpenEnv takes seconds)
TOKEN = "test-token-0123456789"  # the servers' token: `serve-env` and `OpenEnvEnv` both read AGENTRL_ENV_TOKEN


@pytest.fixture(autouse=True)
def _token(monkeypatch):
    monkeypatch.setenv("AGENTRL_ENV_TOKEN", TOKEN)


def clue(lock):
    return f"<tool_call>{json.dumps({'name': 'clue', 'arguments': {'lock': lock}})}</tool_call>"


class Server:
    """`agentrl serve-env ...` in a subprocess on an ephemeral port; stopped (killed if need be) at the end."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl", "serve-env", *args, "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "AGENTRL_ENV_TOKEN": TOKEN})
        deadline = time.monotonic() + START_TIMEOUT
        line = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline()
                break
        if "serving" not in line:
            self.stop()
            raise RuntimeError(f"serve-env did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.url = line.split(" at ", 1)[1].split()[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a test may have paused it
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def vault_server():
    server = Server("agentrl/Vault-v0", "--kw", "locks=2", "--kw", "slack=0")
    yield server
    server.stop()


def test_served_vault_round_trip_gives_the_same_episodes(vault_server, vault_policy):
    chat = vault_policy.chat
    seeds = [5, 5, 6, 7]
    direct = [make("agentrl/Vault-v0", locks=2, slack=0) for _ in seeds]
    played: dict[int, list[str]] = {row: [] for row in range(len(seeds))}
    # row 0: the expert; row 1: garbage (truncated, every turn malformed); row 2: a clue forever; row 3: a noisy expert
    script = {0: lambda: direct[0].expert_action(), 1: lambda: "hello", 2: lambda: clue(1),
              3: lambda: direct[3].expert_action(0.5)}

    def act_direct(row):
        played[row].append(script[row]())
        return chat.action_ids(played[row][-1])

    local, _ = rollout(direct, seeds, ScriptedEngine(act_direct, chat.eos_id), chat)
    remote_envs = [OpenEnvEnv(vault_server.url, timeout=20) for _ in seeds]
    replay = {row: list(actions) for row, actions in played.items()}
    remote, _ = rollout(remote_envs, seeds, ScriptedEngine(lambda row: chat.action_ids(replay[row].pop(0)),
                                                           chat.eos_id), chat)
    for env in remote_envs:
        env.close()

    assert [e.error for e in remote] == [None] * len(seeds)
    assert (local[0].reward, local[0].terminated, local[1].truncated) == (1.0, True, True)  # the rows are what they say
    assert local[1].malformed_calls == local[1].num_turns == 4
    for a, b in zip(local, remote):
        assert b.prompt_ids == a.prompt_ids  # system prompt, tools and task text came through the server unchanged
        assert (b.reward, b.terminated, b.truncated, b.num_turns) == (a.reward, a.terminated, a.truncated, a.num_turns)
        for ta, tb in zip(a.turns, b.turns):
            assert (tb.action, tb.observation, tb.step_reward, tb.state_key, tb.malformed) == \
                   (ta.action, ta.observation, ta.step_reward, ta.state_key, ta.malformed)
            assert (tb.action_ids, tb.obs_ids, tb.context_len) == (ta.action_ids, ta.obs_ids, ta.context_len)
    assert all(not replay[row] for row in replay)  # every recorded action was played back


def test_check_env_passes_on_the_adapter(vault_server):
    env = OpenEnvEnv(vault_server.url, timeout=20)
    failed = [(r.name, r.message) for r in check_env(env) if not r.ok]
    env.close()
    assert failed == []


def test_adapter_pickles_into_a_fresh_session(vault_server):
    env = OpenEnvEnv(vault_server.url, timeout=20)
    env.reset(seed=3)
    clone = pickle.loads(pickle.dumps(env))  # a process pool's worker: no socket travels, a new session opens
    obs, _ = clone.reset(seed=3)
    assert obs == make("agentrl/Vault-v0", locks=2, slack=0).reset(seed=3)[0]
    env.close()
    clone.close()


def test_a_session_past_the_servers_limit_is_an_env_error_that_says_so():
    server = Server("agentrl/Vault-v0", "--kw", "locks=2", "--max-sessions", "1")
    try:
        first, second = OpenEnvEnv(server.url, timeout=20), OpenEnvEnv(server.url, timeout=20)
        first.reset(seed=0)
        # the client reads the server's CAPACITY_REACHED answer, or only the socket it closed after it
        with pytest.raises(EnvError, match=r"reset\(\) (failed.*at its session limit .*--max-sessions|with an error: "
                           r".*CAPACITY_REACHED)"):
            second.reset(seed=0)
        first.close()
    finally:
        server.stop()


def test_a_server_that_hangs_then_dies_mid_episode_is_an_env_error_naming_it():
    server = Server("agentrl/Vault-v0", "--kw", "locks=2")
    try:
        env = OpenEnvEnv(server.url, timeout=2)
        env.reset(seed=1)
        env.step(clue(1))
        server.proc.send_signal(signal.SIGSTOP)  # alive but silent: the socket stays open
        started = time.monotonic()
        with pytest.raises(EnvError, match="no answer within 2 s") as err:
            env.step(clue(2))
        assert time.monotonic() - started < 8
        assert server.url in str(err.value) and "episode 0, turn 2" in str(err.value)
        server.proc.kill()  # now dead: the socket is gone
        server.proc.wait(10)
        started = time.monotonic()
        with pytest.raises(EnvError, match=f"reset.*{server.url}|{server.url}.*reset"):
            env.reset(seed=2)  # a fresh session cannot open either, and says so
        assert time.monotonic() - started < 8
    finally:
        server.stop()


def test_rollout_marks_episodes_errored_when_the_server_dies(vault_policy):
    chat = vault_policy.chat
    server = Server("agentrl/Vault-v0", "--kw", "locks=2")
    try:
        envs = [OpenEnvEnv(server.url, timeout=5) for _ in range(3)]
        calls = []

        def act(row):
            calls.append(row)
            # every row has begun and one is on its second turn (its first step is done): the server dies
            if set(calls) == {0, 1, 2} and len(calls) > 3 and server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait(10)
            return chat.action_ids(clue(1))

        started = time.monotonic()
        # lockstep: no row runs ahead (and finishes) while a slow server still answers the others' resets
        episodes, _ = rollout(envs, [0, 1, 2], ScriptedEngine(act, chat.eos_id), chat, schedule="lockstep")
        assert time.monotonic() - started < 30
        assert all(e.error is not None and server.url in e.error for e in episodes), [e.error for e in episodes]
        assert sum(e.num_turns for e in episodes) >= 1  # what was played before the death is kept
    finally:
        server.stop()


def test_an_unreachable_server_is_named_at_construction():
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(EnvError, match=f"127.0.0.1:{port}.*is it running"):
        OpenEnvEnv(f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(ValueError, match="url must start with"):
        OpenEnvEnv("127.0.0.1:8000")


# -- a generic OpenEnv environment, written against openenv.core's own base classes ---------------


class GuessAction(Action):
    guess: int = Field(ge=0, le=9, description="your guess, 0-9")


class GuessObservation(Observation):
    message: str


class GuessNumber(Environment):
    """Guess a digit; each wrong guess costs 0.1, the right one pays 1 and ends the episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State()
        self.target = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.target = (seed or 0) % 10
        self._state = State(episode_id=episode_id)
        return GuessObservation(message="Guess the digit.", reward=0.0)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        if action.guess == self.target:
            return GuessObservation(message="right", reward=1.0, done=True)
        return GuessObservation(message="higher" if action.guess < self.target else "lower", reward=-0.1)

    @property
    def state(self):
        return self._state


@pytest.fixture(scope="module")
def guess_url():
    import uvicorn

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_fastapi_app(GuessNumber, GuessAction, GuessObservation,
                                                              max_concurrent_envs=8), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the OpenEnv server did not start within 30 s"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def guess(value):
    return f"<tool_call>{json.dumps({'name': 'act', 'arguments': {'guess': value}})}</tool_call>"


def test_generic_env_is_played_through_its_action_schema(guess_url):
    env = OpenEnvEnv(guess_url, timeout=10, max_turns=5)
    (schema,) = env.tool_schemas()
    assert schema["function"]["name"] == "act"
    assert schema["function"]["parameters"]["required"] == ["guess"]
    assert env.reset(seed=13) == ("Guess the digit.", {})  # the observation's one string field is the text
    obs, reward, terminated, truncated, info = env.step(guess(1))
    assert (obs, reward, terminated, info["step_reward"]) == ("higher", 0.0, False, -0.1)
    # 12 passes the local type check (an int) but not the server's le=9: the policy's mistake, counted
    obs, *_, info = env.step(guess(12))
    assert "bad arguments for act" in obs and info["malformed"] == 1
    obs, *_, info = env.step("no call at all")
    assert "no tool call found" in obs and info["malformed_calls"] == 2
    obs, reward, terminated, truncated, info = env.step(guess(3))
    # R is the return: -0.1 for the wrong guess, +1 for the right one (rejected and malformed turns cost nothing)
    assert (obs, terminated, truncated, info["step_reward"]) == ("right", True, False, 1.0)
    assert reward == pytest.approx(0.9)
    env.close()


def test_generic_env_truncates_at_the_turn_budget(guess_url):
    env = OpenEnvEnv(guess_url, timeout=10, max_turns=2)
    env.reset(seed=7)
    assert env.step(guess(0))[2:4] == (False, False)
    obs, reward, terminated, truncated, _ = env.step(guess(1))
    assert (terminated, truncated) == (False, True) and reward == pytest.approx(-0.2)
    env.close()


def test_check_env_passes_on_a_generic_env(guess_url):
    env = OpenEnvEnv(guess_url, timeout=10, max_turns=4)
    failed = [(r.name, r.message) for r in check_env(env) if not r.ok]
    env.close()
    assert failed == []


def test_serve_env_refuses_a_bad_env_before_listening():
    out = subprocess.run([sys.executable, "-m", "agentrl", "serve-env", "agentrl/Vault-v0", "--kw", "locks=99",
                          "--port", "0"], capture_output=True, text=True, timeout=START_TIMEOUT)
    assert out.returncode == 2 and "locks must be between 1 and 32" in out.stderr
