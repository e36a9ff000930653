"""`MCPEnv`: tools served by a real MCP server subprocess (written here with the `mcp` SDK), end to end.

The server keeps state (a key-value store per process), has a slow tool, a tool that raises and a tool
that kills the server; the env asks for a sum through the server's `add` and an answer through a tool of
its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the [mcp] extra (in .[dev]) installs the MCP SDK")

from agentrl.adapters.mcp_tools import MCPEnv, MCPServerError, MCPServerSpec  # noqa: E402

SERVER = textwrap.dedent('''
    import os, sys, time
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("arith")
    memory = {}

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @app.tool()
    def remember(key: str, value: str) -> str:
        """Store a value under a key."""
        memory[key] = value
        return "stored"

    @app.tool()
    def recall(key: str) -> str:
        """The value stored under a key."""
        return memory.get(key, "nothing stored")

    @app.tool()
    async def slow(seconds: float) -> str:
        """Wait, then answer (the server answers other requests meanwhile)."""
        import asyncio
        await asyncio.sleep(seconds)
        return "done"

    @app.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @app.tool()
    def broken() -> str:
        """Always fails."""
        raise ValueError("the tool broke")

    @app.tool()
    def die() -> str:
        """Ends the server."""
        print("server: dying on purpose", file=sys.stderr, flush=True)
        os._exit(3)

    if __name__ == "__main__":
        if os.environ.get("HANG_AT_START"):
            with open(os.environ["HANG_AT_START"], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(3600)
        app.run()
''')

ENV = textwrap.dedent('''
    import sys
    from agentrl.adapters.mcp_tools import MCPEnv, MCPServerSpec

    class SumEnv(MCPEnv):
        """Compute a + b with the server's add tool, then answer."""

        server = MCPServerSpec(command=(sys.executable, SERVER_PATH), call_timeout=10)
        mcp_tools = ["add"]
        max_turns = 4

        def answer(self, value: int) -> str:
            """Submit the final answer."""
            self.given = value
            self.finish()
            return "submitted"

        tools = [answer]

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.a, self.b = (int(x) for x in self.np_random.integers(10, 99, size=2))
            self.given, self.sum = None, None
            return f"Compute {self.a} + {self.b}.", {}

        def verify(self):
            return float(self.given == self.a + self.b)

        def expert_action(self, noise=0.0):
            import json
            if self.turn == 0:
                call = {"name": "add", "arguments": {"a": self.a, "b": self.b}}
            else:
                value = self.a + self.b + (1 if self.np_random.random() < noise else 0)
                call = {"name": "answer", "arguments": {"value": value}}
            return "<tool_call>" + json.dumps(call) + "</tool_call>"
''')


@pytest.fixture(scope="module")
def server_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "arith_server.py"
    path.write_text(SERVER)
    return path


@pytest.fixture(scope="module")
def env_file(server_path) -> Path:
    path = server_path.parent / "sum_env.py"
    path.write_text(f"SERVER_PATH = {str(server_path)!r}\n" + ENV)
    return path


def spec(server_path, **kw) -> MCPServerSpec:
    return MCPServerSpec(command=(sys.executable, str(server_path)), **kw)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def env_of(server_spec: MCPServerSpec, offered=None) -> MCPEnv:
    class Probe(MCPEnv):
        server = server_spec
        mcp_tools = offered

        def verify(self) -> float:
            return 0.0

    return Probe()


def test_mcp_server_tools_become_the_envs_tools_and_calls_go_through(server_path):
    env = env_of(spec(server_path, call_timeout=10))
    try:
        env.reset(seed=0)
        schemas = {s["function"]["name"]: s["function"] for s in env.tool_schemas()}
        assert set(schemas) == {"add", "remember", "recall", "slow", "pid", "broken", "die"}
        assert schemas["add"]["description"] == "Add two integers."
        assert schemas["add"]["parameters"]["required"] == ["a", "b"]  # the server's own schema
        obs, *_ = env.step(call("add", a=2, b=40))
        assert obs == "42"
        # state lives in the env's own server
        env.step(call("remember", key="k", value="v1"))
        assert env.step(call("recall", key="k"))[0] == "v1"
        # a tool that raises is an observation, not a crash
        obs, *_, info = env.step(call("broken"))
        assert obs.startswith("error:") and info["malformed"] == 0
        # arguments that break the server's schema: checked here, an observation, counted as malformed
        obs, *_, info = env.step(call("add", a="two", b=1))
        assert obs.startswith("error: bad arguments for add") and "a" in obs and info["malformed"] == 1
        obs, *_, info = env.step(call("add", a=1))
        assert "'b' is a required property" in obs and info["malformed"] == 1
    finally:
        env.close()


def test_mcp_envs_own_a_server_each_unless_shared(server_path):
    own = [env_of(spec(server_path, call_timeout=10)) for _ in range(2)]
    try:
        for e in own:
            e.reset(seed=0)
        own[0].step(call("remember", key="k", value="first"))
        assert own[1].step(call("recall", key="k"))[0] == "nothing stored"  # two servers, two states
    finally:
        for e in own:
            e.close()
    shared = [env_of(spec(server_path, call_timeout=10, share=True)) for _ in range(2)]
    try:
        for e in shared:
            e.reset(seed=0)
        assert shared[0].session is shared[1].session
        shared[0].step(call("remember", key="k", value="first"))
        assert shared[1].step(call("recall", key="k"))[0] == "first"
    finally:
        for e in shared:
            e.close()


def test_a_killed_mcp_server_is_an_env_error_naming_it_within_its_timeout(server_path):
    env = env_of(spec(server_path, call_timeout=5, name="arith-server"))
    env.reset(seed=0)
    t0 = time.perf_counter()
    with pytest.raises(MCPServerError) as died:
        env.step(call("die"))
    assert time.perf_counter() - t0 < 5 + 10  # its call timeout and the ping, not forever
    assert "arith-server" in str(died.value) and "episode 0, turn 1" in str(died.value)
    # the next call says the server is gone, with what it wrote on its way out
    with pytest.raises(MCPServerError, match="gone") as gone:
        env.step(call("add", a=1, b=2))
    assert "dying on purpose" in str(gone.value)
    # and a reset starts a fresh server: the env is usable again
    env.reset(seed=1)
    assert env.step(call("add", a=1, b=2))[0] == "3"
    env.close()


def test_a_slow_mcp_call_is_a_timeout_observation_while_the_server_answers(server_path):
    env = env_of(spec(server_path, call_timeout=1))
    try:
        env.reset(seed=0)
        obs, *_, info = env.step(call("slow", seconds=4))
        assert "ran past its 1 s limit" in obs and info["tool_timeouts"] == 1
        assert env.step(call("add", a=1, b=1))[0] == "2"  # the episode goes on
        # a server that answers nothing at all (stopped) is hung: an error naming it, within its timeout and the
        # probe's
        pid = int(env.step(call("pid"))[0])
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.perf_counter()
            with pytest.raises(MCPServerError, match="hangs"):
                env.step(call("add", a=1, b=1))
            assert time.perf_counter() - t0 < 1 + 2 * 5 + 3
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        env.close()
    with contextlib.suppress(ProcessLookupError):  # a session that hung is not always able to stop its server
        os.kill(pid, signal.SIGKILL)


def test_an_mcp_server_that_never_starts_is_an_error_within_its_connect_timeout(server_path, tmp_path):
    pid_file = tmp_path / "hung.pid"
    hung = spec(server_path, connect_timeout=3, env={"HANG_AT_START": str(pid_file)})
    env = env_of(hung)
    t0 = time.perf_counter()
    with pytest.raises(MCPServerError, match="did not start"):
        env.reset(seed=0)
    assert time.perf_counter() - t0 < 3 + 10
    with pytest.raises(ProcessLookupError):  # the hung server went with its session: agentrl owns what it starts
        os.kill(int(pid_file.read_text()), 0)
    with pytest.raises(MCPServerError, match="no tool 'nope'"):
        env_of(spec(server_path), offered=["nope"]).reset(seed=0)
    with pytest.raises(ValueError, match="command .* or a url"):
        MCPServerSpec()


def test_check_env_passes_on_an_mcp_env(env_file):
    from agentrl.checker import check_env

    results = check_env(f"{env_file}:SumEnv")
    failed = [r for r in results if not r.ok]
    assert results and not failed, failed


def test_a_few_updates_train_on_tools_served_by_an_mcp_server(env_file, tmp_path):
    from agentrl.config import TrainConfig
    from agentrl.stages.pipeline import train

    micro = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
             "max_position_embeddings": 256, "vocab_size": 300}
    cfg = TrainConfig(env={"id": f"{env_file}:SumEnv"}, algo="grpo", updates=2, out=str(tmp_path / "run"),
                      tiny=micro, rollout={"groups": 2, "group_size": 2, "sampling": {"max_new_tokens": 24}},
                      sft={"episodes": 16, "epochs": 1}, eval={"episodes": 4, "every": 0},
                      optim={"minibatches": 1}, checkpoint={"every": 0})
    summary = train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    assert len(steps) == 2 and all(r["rollout/episodes"] == 4 for r in steps)
    assert summary["final_pass_rate"] is not None


def test_mcp_env_of_docs_extending_runs_as_printed(server_path, tmp_path, monkeypatch):
    from test_extending import docs_blocks

    _registration, block = docs_blocks("An environment")
    (tmp_path / "arith_server.py").write_text(server_path.read_text())
    monkeypatch.chdir(tmp_path)  # the docs start the server by its relative path
    scope: dict = {}
    exec(block, scope)
    env = scope["SumEnv"]()
    try:
        env.reset(seed=0)
        assert {t["function"]["name"] for t in env.tool_schemas()} == {"add", "answer"}  # the server's, the env's
        total = env.step(call("add", a=env.a, b=env.b))[0]
        assert total == str(env.a + env.b)
        _, reward, terminated, _, _ = env.step(call("answer", value=int(total)))
        assert (reward, terminated) == (1.0, True)
    finally:
        env.close()


def test_mcp_serve_env_plays_an_episode_for_a_real_mcp_client(tmp_path):
    """`agentrl serve-env ENV --mcp` as a subprocess, driven by the SDK's own stdio client: the env's tools with
    their schemas plus reset, one episode through them, the verifier's reward at its end."""
    import asyncio
    import os
    import re

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])  # CI's mcp 2.0.0 too
    params = StdioServerParameters(command=sys.executable, cwd=str(root), env={**os.environ, "PYTHONPATH": path},
                                   args=["-m", "agentrl", "serve-env", "examples/custom_env.py:Arithmetic", "--mcp"])

    async def play() -> tuple[list[str], list[tuple[str, bool]]]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = [t.name for t in (await session.list_tools()).tools]
            said = []
            for name, args in [("calc", {"expression": "1+1"}), ("reset", {"seed": 3})]:
                r = await asyncio.wait_for(session.call_tool(name, args), 60)
                said.append((r.content[0].text, r.is_error))
            a, b, c = map(int, re.findall(r"\d+", said[-1][0])[:3])
            for name, args in [("calc", {"expression": f"{a}*{b}+{c}"}), ("answer", {"value": a * b + c}),
                               ("answer", {"value": 0})]:
                r = await asyncio.wait_for(session.call_tool(name, args), 60)
                said.append((r.content[0].text, r.is_error))
            return names, said

    names, said = asyncio.run(asyncio.wait_for(play(), 120))
    assert names == ["reset", "calc", "answer"]
    assert said[0] == ("no episode is running: call reset first", True) and said[1][0].startswith("Compute ")
    assert said[2][1] is False and "reward" not in said[2][0]
    assert said[3][1] is False and "episode ended: reward 1" in said[3][0]
    assert said[4] == ("no episode is running: call reset first", True)  # the episode is over


NOISY = '''
import agentrl


class Noisy(agentrl.AgentEnv):
    """Prints on stdout in its constructor, its reset and its tool; its reset raises on seed 13."""

    def __init__(self):
        super().__init__()
        print("constructing Noisy")

    def shout(self, text: str) -> str:
        """Shout, and end the episode."""
        print("shouting", text)
        self.finish()
        return text.upper()

    tools = [shout]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        print("resetting")
        if seed == 13:
            raise RuntimeError("unlucky seed")
        return "Say something.", {}

    def verify(self):
        return 1.0


class HasReset(Noisy):
    def reset_tool(self) -> str:
        """A tool that takes the server's name."""
        return "no"

    reset_tool.__name__ = "reset"
    tools = [reset_tool]
'''


def test_mcp_serve_env_keeps_stdout_for_the_protocol_and_survives_a_raising_env(tmp_path):
    import asyncio
    import os
    import subprocess

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "noisy.py").write_text(NOISY)
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    params = StdioServerParameters(command=sys.executable, cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": path},
                                   args=["-m", "agentrl", "serve-env", "noisy.py:Noisy", "--mcp"])

    async def play() -> list[tuple[str, bool]]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            said = []
            for name, args in [("reset", {"seed": 13}), ("reset", {"seed": 1}), ("shout", {"text": "hi"})]:
                r = await asyncio.wait_for(session.call_tool(name, args), 60)
                said.append((r.content[0].text, r.is_error))
            return said

    said = asyncio.run(asyncio.wait_for(play(), 120))
    assert said[0] == ("the environment's reset raised RuntimeError: unlucky seed", True)
    assert said[1] == ("Say something.", False) and said[2][0].startswith("HI\n(the episode ended: reward 1")
    # an env tool named `reset` is refused before serving, naming the clash
    done = subprocess.run([sys.executable, "-m", "agentrl", "serve-env", "noisy.py:HasReset", "--mcp"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "has a tool named 'reset'" in done.stderr and done.stdout == ""
