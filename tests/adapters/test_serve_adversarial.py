"""`agentrl serve-env` against an adversary on 127.0.0.1: every door is bounded (issue 46, findings 2, 3 and 10).

The server runs in this process (`make_server` on an ephemeral loopback port, in a thread), with its timeouts set
to a second or less, so that each bound shows within a few seconds: clients that never speak, a tool that hangs,
a client that leaves mid-step, a web page's WebSocket, a request without the token, a step before any reset, a
request head that is never finished. Every socket read has a timeout; every hanging tool is released at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("openenv.core", reason="openenv-core is not installed (pip install 'agentrl[openenv]')")

from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from agentrl.adapters.openenv import OpenEnvEnv  # noqa: E402
from agentrl.adapters.serve import bind, make_server  # noqa: E402
from agentrl.core import AgentEnv, EnvError  # noqa: E402

TOKEN = "adversarial-test-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RELEASE = threading.Event()  # set when a test ends: a hanging tool's thread then ends at once (else after 10 s)


class Hangs(AgentEnv):
    """Echo, or hang until the test is over."""

    max_turns = 8

    def echo(self, text: str) -> str:
        """Say the text back."""
        return text

    def hang(self) -> str:
        """Answer only when released."""
        RELEASE.wait(10)
        return "released"

    tools = [echo, hang]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Say something.", {}

    def verify(self) -> float:
        return 0.0


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@contextlib.contextmanager
def served(token: str | None = TOKEN, **options):
    """The port of a served `Hangs` env, stopped (its hanging tools released) at the end."""
    RELEASE.clear()
    server = make_server(f"{__name__}:Hangs", token=token, **options)
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert server.started, "the server did not start within 30 s"
        yield sock.getsockname()[1]
    finally:
        RELEASE.set()
        server.should_exit = True
        thread.join(10)
        sock.close()


def session(port: int, headers: dict | None = None, **kw):
    return connect(f"ws://127.0.0.1:{port}/ws", open_timeout=5, additional_headers=AUTH if headers is None else headers,
                   **kw)


def ask(ws, kind: str, timeout: float = 5.0, **data) -> dict:
    ws.send(json.dumps({"type": kind, "data": data}))
    return json.loads(ws.recv(timeout=timeout))


def http(port: int, path: str, headers: dict | None = None, body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {},
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=5) as r:  # noqa: S310 (a loopback test server)
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# -- finding 2: one local client locks serve-env for everyone ------------------------------------------------------


def test_silent_clients_are_closed_after_the_idle_timeout_and_free_their_sessions():
    with served(max_sessions=20, idle_timeout=1.0) as port, contextlib.ExitStack() as stack:
        silent = [stack.enter_context(session(port)) for _ in range(20)]  # each holds an env, says nothing
        with session(port) as late:  # the lock is real while they sit there: refused before it can ask anything
            assert json.loads(late.recv(timeout=5))["data"]["code"] == "CAPACITY_REACHED"
        started = time.monotonic()
        for ws in silent:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd.code == 1001 and "idle for 1 s" in closed.value.rcvd.reason
        assert time.monotonic() - started < 4
        with session(port) as late:
            assert ask(late, "reset", seed=0)["data"]["observation"]["text"] == "Say something."


def test_a_hanging_tool_is_answered_with_a_timeout_observation():
    with served(tool_timeout=0.5) as port, session(port) as ws:
        ask(ws, "reset", seed=0)
        started = time.monotonic()
        answer = ask(ws, "step", text=call("hang"))
        assert time.monotonic() - started < 3
        observation = answer["data"]["observation"]
        assert "tool 'hang' ran past its 0.5 s limit" in observation["text"] and observation["tool_timeouts"] == 1
        assert ask(ws, "step", text=call("echo", text="still here"))["data"]["observation"]["text"] == "still here"


def test_a_client_that_leaves_mid_step_frees_its_session_at_once():
    with served(max_sessions=1, tool_timeout=30) as port:
        with session(port) as leaver:
            ask(leaver, "reset", seed=0)
            leaver.send(json.dumps({"type": "step", "data": {"text": call("hang")}}))
            time.sleep(0.3)  # the step is running: its tool waits for RELEASE
        started = time.monotonic()
        answer: dict = {}
        while time.monotonic() - started < 3:  # the only session, held by a tool that has not returned
            with session(port) as next_client:
                answer = ask(next_client, "reset", seed=0)
            if answer["type"] == "observation":
                break
            time.sleep(0.1)
        assert answer["type"] == "observation", answer
        assert time.monotonic() - started < 3 and not RELEASE.is_set()


# -- finding 3: any web page can drive a served env ------------------------------------------------------------------


def test_a_cross_site_websocket_is_refused():
    with served() as port:
        for origin in ("https://evil.example", "null", f"http://127.0.0.1.evil.example:{port}"):
            with pytest.raises(InvalidStatus) as refused:
                session(port, {**AUTH, "Origin": origin})
            assert refused.value.response.status_code == 403, origin
            assert b"cross-origin request" in refused.value.response.body
        assert http(port, "/schema", {**AUTH, "Origin": "https://evil.example"})[0] == 403
        # a DNS-rebinding page reaches the loopback port under its own name: refused by the Host header
        assert http(port, "/schema", {**AUTH, "Host": f"evil.example:{port}"})[0] == 403
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):  # a page of this machine may
            with session(port, {**AUTH, "Origin": origin}) as ws:
                assert ask(ws, "reset", seed=0)["type"] == "observation"


def test_every_request_and_handshake_needs_the_token():
    with served() as port:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
            for path in ("/schema", "/health", "/metadata", "/docs"):
                status, body = http(port, path, headers)
                assert status == 401 and "missing or wrong token" in body, (path, headers)
            assert http(port, "/reset", headers, b"{}")[0] == 401
            with pytest.raises(InvalidStatus) as refused:
                session(port, headers)
            assert refused.value.response.status_code == 401
        assert http(port, "/schema", AUTH)[0] == 200
        # a client that takes only a URL: the token as its password (HTTP Basic, sent by the WebSocket client)
        with connect(f"ws://agentrl:{TOKEN}@127.0.0.1:{port}/ws", open_timeout=5) as ws:
            assert ask(ws, "reset", seed=0)["type"] == "observation"
        # agentrl's own client: the token from its argument or AGENTRL_ENV_TOKEN, and a clear error without it
        with pytest.raises(EnvError, match="HTTP 401.*set AGENTRL_ENV_TOKEN"):
            OpenEnvEnv(f"http://127.0.0.1:{port}", timeout=5, token="")
        env = OpenEnvEnv(f"http://127.0.0.1:{port}", timeout=5, token=TOKEN)
        try:
            assert env.reset(seed=0)[0] == "Say something."
            assert env.step(call("echo", text="hi"))[0] == "hi"
        finally:
            env.close()
    with served(token=None) as port:  # --no-token: asked for, so granted
        assert http(port, "/schema")[0] == 200
        with session(port, {}) as ws:
            assert ask(ws, "reset", seed=0)["type"] == "observation"


def test_serve_env_refuses_a_network_address_without_allow_remote():
    out = subprocess.run([sys.executable, "-m", "agentrl", "serve-env", "agentrl/Vault-v0", "--host", "0.0.0.0",
                          "--port", "0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--allow-remote" in out.stderr and "serving" not in out.stdout


def test_serve_env_prints_a_fresh_token_that_a_client_needs():
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_ENV_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl", "serve-env", f"{os.path.abspath(__file__)}:Hangs",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        if select.select([proc.stdout], [], [], 60)[0]:
            line = proc.stdout.readline()
        found = re.search(r" at (http://\S+) .*; token ([A-Za-z0-9_-]{40,});", line)
        assert found, line
        url, token = found.groups()
        with pytest.raises(EnvError, match="AGENTRL_ENV_TOKEN"):
            OpenEnvEnv(url, timeout=5, token="")
        client = OpenEnvEnv(url, timeout=5, token=token)
        assert client.reset(seed=0)[0] == "Say something."
        client.close()
    finally:
        proc.kill()
        proc.wait(10)


# -- finding 10: a step of a never-reset episode; half-sent upgrades ------------------------------------------------


def test_a_step_before_any_reset_is_refused():
    with served() as port:
        with session(port) as ws:
            answer = ask(ws, "step", text=call("echo", text="played?"))
            assert answer["type"] == "error"
            assert "no episode is running: send reset before step" in answer["data"]["message"]
            assert ask(ws, "reset", seed=0)["type"] == "observation"  # and the session goes on
            assert ask(ws, "step", text=call("echo", text="now"))["data"]["observation"]["text"] == "now"
        status, body = http(port, "/step", {**AUTH, "Content-Type": "application/json"},
                            json.dumps({"action": {"text": call("echo", text="x")}}).encode())
        assert status == 409 and "over the WebSocket /ws only" in body


def test_half_sent_request_heads_are_closed_after_the_handshake_timeout():
    head = f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n{AUTH}".encode()
    with served(handshake_timeout=1.0) as port, contextlib.ExitStack() as stack:
        half = []
        for _ in range(20):
            s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            s.sendall(head[:60])
            half.append(s)
        trickle = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
        started = time.monotonic()
        for i in range(12):  # a byte every 0.25 s: each one would reset an idle timer
            try:
                trickle.sendall(head[i:i + 1])
            except OSError:
                break
            time.sleep(0.25)
        for s in [*half, trickle]:
            assert s.recv(1024) == b""  # closed by the server (recv times out after 5 s otherwise)
        assert time.monotonic() - started < 4
        with session(port) as ws:  # and a whole handshake is served
            assert ask(ws, "reset", seed=0)["type"] == "observation"


def test_the_client_reopens_a_session_the_server_closed_between_episodes():
    with served(idle_timeout=0.5) as port:
        env = OpenEnvEnv(f"http://127.0.0.1:{port}", timeout=5, token=TOKEN)
        try:
            env.reset(seed=0)
            assert env.step(call("echo", text="one"))[0] == "one"
            time.sleep(1.0)  # the server closes the silent session
            assert env.reset(seed=1)[0] == "Say something."
            assert env.step(call("echo", text="two"))[0] == "two"
        finally:
            env.close()
