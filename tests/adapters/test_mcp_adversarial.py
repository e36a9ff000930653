"""The MCP surfaces against an adversary (issue 46, findings 5 and 6): `MCPEnv`'s client facing planted servers,
and `agentrl serve-env --mcp` facing a client that leaves.

Each planted server is a few lines of Python written into tmp_path that speaks JSON-RPC over stdio by hand, so that
it can do what the SDK's servers never would: answer 5 MB, never answer, page forever, name its tools oddly, send
an array for a schema, write garbage, leave a child behind. Every bound is set small (a 64 KiB message limit, a
connect timeout of 1.5 s); every process a test starts sleeps 30 s at most and is killed at the end regardless.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the [mcp] extra (in .[dev]) installs the MCP SDK")

from agentrl.adapters.mcp_tools import MCPEnv, MCPServerError, MCPServerSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

SERVER = textwrap.dedent('''
    import json, os, subprocess, sys, time

    mode, pid_file = sys.argv[1], sys.argv[2]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # stays in the server's group
    with open(pid_file, "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    if mode == "hang_at_start":
        time.sleep(30)  # reads nothing, answers nothing
    if mode == "garbage_at_start":
        print("server starting, version 1.0", flush=True)

    def tools(cursor):
        if mode == "pages_forever":
            n = int(cursor or 0)
            return {"tools": [{"name": f"t{n}", "inputSchema": {"type": "object"}}], "nextCursor": str(n + 1)}
        if mode == "many_tools":
            return {"tools": [{"name": f"t{n}", "inputSchema": {"type": "object"}} for n in range(600)]}
        if mode == "array_schema":
            return {"tools": [{"name": "look", "inputSchema": []}]}
        if mode.startswith("names:"):
            return {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in json.loads(mode[6:])]}
        return {"tools": [{"name": n, "inputSchema": {"type": "object", "properties": {}}} for n in ("big", "small")]}

    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        method, params = message.get("method"), message.get("params") or {}
        if method == "initialize":
            result = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "planted", "version": "0"}}
        elif method == "tools/list":
            result = tools(params.get("cursor"))
        elif method == "tools/call" and mode == "garbage_answer":
            sys.stdout.write("Traceback (most recent call last): oops\\n")
            sys.stdout.flush()
            continue
        elif method == "tools/call":
            size = 5 * 1024 * 1024 if params["name"] == "big" else 2
            result = {"content": [{"type": "text", "text": "x" * size}], "isError": False}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\\n")
        sys.stdout.flush()
''')


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead and waiting for its parent to read its status, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


@pytest.fixture
def planted(tmp_path):
    """planted(mode, **spec) -> an MCPEnv on a planted server; every process it started is killed at the end."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads process states from /proc")
    script = tmp_path / "planted_server.py"
    script.write_text(SERVER)
    made: list[tuple[MCPEnv, Path]] = []

    def make(mode: str, offered=None, **spec) -> tuple[MCPEnv, Path]:
        pid_file = tmp_path / f"pids{len(made)}"
        server_spec = MCPServerSpec(command=(sys.executable, str(script), mode, str(pid_file)), name=f"planted {mode}",
                                    **spec)

        class Planted(MCPEnv):
            server = server_spec
            mcp_tools = offered

            def verify(self) -> float:
                return 0.0

        env = Planted()
        made.append((env, pid_file))
        return env, pid_file

    yield make
    for env, pid_file in made:
        env.close()
        if pid_file.exists():
            for pid in map(int, pid_file.read_text().split()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def call(name: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {}}) + "</tool_call>"


def pids_of(pid_file: Path) -> list[int]:
    deadline = time.monotonic() + 5
    while not (pid_file.exists() and len(pid_file.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [int(p) for p in pid_file.read_text().split()]


# -- finding 5: the client --------------------------------------------------------------------------------------------


def test_an_answer_over_the_message_limit_is_skipped_as_it_streams_and_read_as_an_error(planted):
    env, _ = planted("normal", max_message_bytes=64 * 1024, max_result_chars=1000, call_timeout=10)
    env.reset(seed=0)
    started = time.monotonic()
    obs, *_, info = env.step(call("big"))  # 5 MB of text: 80 times the limit
    assert time.monotonic() - started < 3
    assert obs.startswith("error: the server's answer was over 65536 bytes") and "ask for less" in obs
    assert info["malformed"] == 0 and info["tool_timeouts"] == 0
    assert env.step(call("small"))[0] == "xx"  # the session read past the skipped answer and goes on


def test_a_server_that_never_answers_initialize_is_stopped_with_its_group(planted):
    env, pid_file = planted("hang_at_start", connect_timeout=1.5)
    started = time.monotonic()
    with pytest.raises(MCPServerError, match="did not start and list its tools within 1.5 s"):
        env.reset(seed=0)
    assert time.monotonic() - started < 5
    assert gone_within(pids_of(pid_file), 3)  # the server and the child it started, without env.close()


def test_closing_an_env_stops_its_servers_whole_process_group(planted):
    env, pid_file = planted("normal")
    env.reset(seed=0)
    pids = pids_of(pid_file)
    assert all(alive(p) for p in pids)
    env.close()  # the server exits on its closed stdin; the child it left in its group goes too
    assert gone_within(pids, 3)


@pytest.mark.parametrize(("mode", "said"), [
    ("pages_forever", "goes on past 64 pages"),
    ("many_tools", "lists more than 512 tools"),
])
def test_the_tool_list_is_bounded_at_connect(planted, mode, said):
    env, pid_file = planted(mode, connect_timeout=10)
    started = time.monotonic()
    with pytest.raises(MCPServerError, match=said) as refused:
        env.reset(seed=0)
    assert time.monotonic() - started < 5 and f"planted {mode} could not be started" in str(refused.value)
    assert gone_within(pids_of(pid_file), 3)


@pytest.mark.parametrize(("names", "said"), [
    (["ok", ""], "a tool named ''"),
    (["ok", "a b"], "a tool named 'a b'"),
    (["ok", "x</tool_call>"], "a tool named 'x</tool_call>'"),
    (["ok", "t" * 65], f"a tool named '{'t' * 65}'"),
    (["ok", "dup", "dup"], "2 tools named 'dup'"),
])
def test_tool_names_a_call_cannot_carry_are_refused_at_connect(planted, names, said):
    env, pid_file = planted("names:" + json.dumps(names))
    with pytest.raises(MCPServerError, match=f"planted names.* offers {said}"):
        env.reset(seed=0)
    assert gone_within(pids_of(pid_file), 3)  # a server whose tools are refused is not kept
    env, _ = planted("names:" + json.dumps(names), offered=["ok"])  # a tool the env leaves out is no concern
    env.reset(seed=0)
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["ok"]


@pytest.mark.parametrize(("mode", "said"), [
    ("array_schema", r"its answer is not valid MCP \(ListToolsResult: tools.0.inputSchema: "),
    ("garbage_at_start", r"it wrote to stdout a line that is not an MCP message \('server starting, version 1.0'\)"),
])
def test_a_server_that_breaks_the_protocol_at_connect_is_one_line_naming_it(planted, mode, said):
    env, _ = planted(mode, connect_timeout=10)
    started = time.monotonic()
    with pytest.raises(MCPServerError, match=f"planted {mode} could not be started: {said}") as refused:
        env.reset(seed=0)
    assert time.monotonic() - started < 5
    assert "\n" not in str(refused.value) and "ExceptionGroup" not in str(refused.value)


def test_a_garbage_answer_to_a_call_is_an_error_naming_the_server(planted):
    env, _ = planted("garbage_answer", call_timeout=2)
    env.reset(seed=0)
    started = time.monotonic()
    with pytest.raises(MCPServerError, match="planted garbage_answer.*not an MCP message .'Traceback") as failed:
        env.step(call("small"))
    assert time.monotonic() - started < 4 and "ExceptionGroup" not in str(failed.value)


# -- finding 6: serve-env --mcp and a client that leaves -----------------------------------------------------------

BLOCKING_ENV = '''
import time

import agentrl


class Blocking(agentrl.AgentEnv):
    """One tool, which blocks for 30 s."""

    def block(self) -> str:
        """Block."""
        time.sleep(30)
        return "late"

    tools = [block]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Go.", {}

    def verify(self) -> float:
        return 0.0
'''


class StdioClient:
    """`agentrl serve-env blocking.py:Blocking --mcp ...` as a subprocess, spoken to line by line."""

    def __init__(self, cwd: Path, *flags: str):
        (cwd / "blocking.py").write_text(BLOCKING_ENV)
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl", "serve-env", "blocking.py:Blocking", "--mcp",
                                      *flags], cwd=cwd, env={**os.environ, "PYTHONPATH": path},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.ids = 0

    def send(self, method: str, params: dict | None = None, notify: bool = False) -> None:
        message = {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}
        if not notify:
            self.ids += 1
            message["id"] = self.ids
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def answer(self, timeout: float = 30) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"no answer within {timeout} s"
        return json.loads(self.proc.stdout.readline())

    def start(self) -> None:
        self.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "adversary", "version": "0"}})
        assert "result" in self.answer()
        self.send("notifications/initialized", notify=True)
        self.send("tools/call", {"name": "reset", "arguments": {"seed": 0}})
        assert self.answer()["result"]["content"][0]["text"] == "Go."

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def test_serve_env_mcp_exits_when_its_client_closes_stdin_while_a_tool_blocks(tmp_path):
    client = StdioClient(tmp_path)
    try:
        client.start()
        client.send("tools/call", {"name": "block", "arguments": {}})
        time.sleep(0.5)  # the tool is blocking now
        client.proc.stdin.close()  # the client goes
        started = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            client.proc.wait(5)
        assert client.proc.returncode == 0 and time.monotonic() - started < 5
    finally:
        client.kill()


def test_serve_env_mcp_answers_a_hanging_tool_with_a_timeout(tmp_path):
    client = StdioClient(tmp_path, "--tool-timeout", "0.5")
    try:
        client.start()
        started = time.monotonic()
        client.send("tools/call", {"name": "block", "arguments": {}})
        text = client.answer(timeout=10)["result"]["content"][0]["text"]
        assert "tool 'block' ran past its 0.5 s limit" in text and time.monotonic() - started < 3
    finally:
        client.kill()
