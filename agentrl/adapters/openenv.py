"""`OpenEnvEnv`: an `AgentEnv` that plays an episode on any OpenEnv environment server.

    agentrl check-env agentrl.adapters.openenv:OpenEnvEnv --kw url=http://127.0.0.1:8000
    agentrl train --env.id agentrl.adapters.openenv:OpenEnvEnv --env-kw url=http://127.0.0.1:8000 --model ...

Each instance holds one WebSocket session (OpenEnv's ``/ws``, through the package's own
`GenericEnvClient`), so a rollout's many envs are many independent sessions on the server. Two
kinds of server are understood, told apart by ``GET /schema``:

- **an agentrl env served by `agentrl serve-env`** (its observation schema carries ``x-agentrl``):
  the policy's text goes through unchanged and the served env parses its tool calls; system prompt,
  tools, turn budget, ``terminated``/``truncated``, ``step_reward``, ``state_key`` and the malformed
  count come back as the env produced them, so an episode is the one the env gives locally.
- **any other OpenEnv env**: its Action schema becomes one tool, ``act``, whose arguments are the
  action's fields; the observation's text is its one string field (or `observation_field`, or the
  whole observation as JSON). OpenEnv has ``done`` but no truncation: ``done`` is ``terminated``,
  and running out of `max_turns` is ``truncated``. Per-step rewards go to ``info["step_reward"]``;
  the episode's reward (agentrl's terminal reward ``R``) is their sum, the episode's return.

A server that stops answering (it died, the network dropped, it hangs past `timeout` seconds) is
an `EnvError` that names the server, the episode and the turn: the rollout ends that episode as
errored and the trainer saves the batch, and no call waits longer than `timeout`. The next
`reset` opens a fresh session, as it does when the server closed an idle one between episodes.

`agentrl serve-env` asks every client for the token it printed at start: `token`, by default the
``AGENTRL_ENV_TOKEN`` environment variable (better than an env kwarg, which a run's logged config
would show). It travels as ``Authorization: Bearer`` on HTTP and as the WebSocket URL's password
(HTTP Basic, which OpenEnv's client sends from the URL), and never appears in an error message.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any, Literal

from pydantic import ConfigDict, ValidationError, create_model

from agentrl.core import AgentEnv, EnvError, Tool

PROTOCOL = 1  # agentrl.adapters.serve.PROTOCOL; kept here so that a client never imports the server's stack
TOKEN_ENV = "AGENTRL_ENV_TOKEN"  # agentrl.adapters.serve.TOKEN_ENV, for the same reason
_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                               "object": dict}


def _client_class() -> Any:
    """OpenEnv's own client, imported when a session opens (the optional extra; importing it takes seconds)."""
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as e:
        raise ImportError(f"the OpenEnv adapter needs openenv-core: pip install 'agentrl[openenv]' ({e})") from e
    return GenericEnvClient


class _Rejected(Exception):
    """A generic OpenEnv server refused an action's arguments (its VALIDATION_ERROR)."""


class StateKey(str):
    """A served env's state key, as the text of its ``repr``: a rollout stores ``repr(key)``, so the
    key repr()s to that text and the store holds what the env gives locally."""

    def __repr__(self) -> str:
        return str(self)


def _http_json(url: str, timeout: float, token: str | None = None) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as r:  # noqa: S310 (the user names the server)
        return json.loads(r.read())


def _field_type(prop: dict[str, Any]) -> Any:
    """A JSON-schema property as a Python type, for validating the policy's arguments before they travel;
    what this cannot express is typed `Any` here and left to the server to validate."""
    if "enum" in prop and all(isinstance(v, (str, int, bool)) for v in prop["enum"]):
        return Literal[tuple(prop["enum"])]
    kind = prop.get("type")
    return _JSON_TYPES.get(kind, Any) if isinstance(kind, str) else Any


class OpenEnvEnv(AgentEnv):
    """An OpenEnv server's environment, one WebSocket session per instance (see the module docstring).

    `url`: the server (http://, https://, ws:// or wss://). `timeout`: seconds to wait for any answer.
    `max_turns`: the turn budget (default: a served agentrl env's own, else 16). `system_prompt`:
    shown to the policy (default: a served agentrl env's own, else the server's description).
    `observation_field`: which observation field is the text (default: its only string field).
    `token`: the server's token (default: the ``AGENTRL_ENV_TOKEN`` environment variable; none if unset).
    """

    def __init__(self, url: str, timeout: float = 30.0, max_turns: int | None = None,
                 system_prompt: str | None = None, observation_field: str | None = None, token: str | None = None):
        if not isinstance(url, str) or url.split("://", 1)[0] not in ("http", "https", "ws", "wss"):
            raise ValueError(f"OpenEnvEnv: url must start with http://, https://, ws:// or wss://, got {url!r}")
        if not timeout > 0:
            raise ValueError(f"OpenEnvEnv: timeout must be > 0 seconds, got {timeout}")
        _client_class()  # without the extra, say so before anything else
        self.url, self.timeout = url.rstrip("/"), float(timeout)
        self._token = (token if token is not None else os.environ.get(TOKEN_ENV)) or None  # "": none, whatever is set
        http = "http" + self.url[2:] if self.url.startswith("ws") else self.url
        try:
            schema = _http_json(f"{http}/schema", self.timeout, self._token)
            meta = _http_json(f"{http}/metadata", self.timeout, self._token)
        except urllib.error.HTTPError as e:
            detail = self._redact(e.read().decode("utf-8", "replace")[:300])
            hint = ""
            if e.code == 401:
                hint = (f"; set {TOKEN_ENV} to the token `agentrl serve-env` printed (or pass token=)" if self._token
                        is None else "; the token given is not the server's")
            raise EnvError(f"OpenEnv server {self.url} refused /schema: HTTP {e.code} {detail}{hint}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise EnvError(f"OpenEnv server {self.url}: cannot read its /schema and /metadata ({e}); is it running?"
                           ) from e
        self.served = schema.get("observation", {}).get("x-agentrl")  # an agentrl env behind `serve-env`, or None
        if self.served is not None and self.served.get("protocol") != PROTOCOL:
            raise EnvError(f"OpenEnv server {self.url} speaks agentrl protocol {self.served.get('protocol')}, this "
                           f"client {PROTOCOL}: install the same agentrl version on both sides")
        self.remote_name = str(self.served["env"] if self.served else meta.get("name", "openenv"))
        self._action_schema, self._description = schema.get("action", {}), str(meta.get("description") or "")
        if self.served is not None:
            budget = max_turns or int(self.served["max_turns"])
            self.system_prompt = system_prompt if system_prompt is not None else self.served["system_prompt"]
        else:
            budget = max_turns or 16
            self.system_prompt = system_prompt if system_prompt is not None else self._description or None
            self.observation_field = observation_field or self._text_field(schema.get("observation", {}))
        super().__init__(max_turns=budget)
        self._init_tools()
        self._client: Any = None
        self._return = 0.0
        self._remote_ended = False

    # -- what the policy sees ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"openenv:{self.remote_name}"

    def tool_schemas(self) -> list[dict[str, Any]]:
        return list(self.served["tools"]) if self.served is not None else super().tool_schemas()

    def _init_tools(self) -> None:
        """The tools are built per instance from the server's schema (and rebuilt after a pickle)."""
        self._tools = {} if self.served is not None else {"act": self._act_tool()}

    def _act_tool(self) -> Tool:
        schema = self._action_schema
        props = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
        required = set(schema.get("required", []))
        fields = {k: (_field_type(v), ... if k in required else v.get("default")) for k, v in props.items()}
        params = create_model("act_args", __config__=ConfigDict(extra="forbid"), **fields)
        about = self._description or schema.get("description") or ""
        return Tool("act", f"Take one action in the environment {self.remote_name}. {about}".strip(), params,
                    self._send_action)

    @staticmethod
    def _text_field(obs_schema: dict[str, Any]) -> str | None:
        strings = [k for k, v in obs_schema.get("properties", {}).items()
                   if v.get("type") == "string" and k not in ("metadata",)]
        return strings[0] if len(strings) == 1 else None

    def _render(self, obs: dict[str, Any]) -> str:
        if self.observation_field is not None:
            if self.observation_field not in obs:
                raise EnvError(f"{self._where()}: the observation has no field {self.observation_field!r} "
                               f"(fields: {', '.join(obs)})")
            return str(obs[self.observation_field])
        return json.dumps(obs, sort_keys=True, default=str)

    # -- the session -----------------------------------------------------------------------------

    def _where(self) -> str:
        return f"env {self.name} (OpenEnv server {self.url}), episode {self._episode}, turn {self._turn}"

    def _redact(self, text: str) -> str:
        return text.replace(self._token, "<token>") if self._token else text

    def _client_url(self) -> str:
        """The URL OpenEnv's client connects to: with the token as its password, which the WebSocket client sends
        as HTTP Basic authorization (the client takes no headers)."""
        if not self._token:
            return self.url
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://agentrl:{self._token}@{rest}"

    def _call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        """One request on the session; every way the server can fail is an `EnvError` naming it, except
        a rejected action of a generic env (`_Rejected`: the session is alive, the policy erred)."""
        fresh = self._client is None
        try:
            if self._client is None:
                client = _client_class()(base_url=self._client_url(), connect_timeout_s=self.timeout,
                                          message_timeout_s=self.timeout).sync()
                self._client = client
                client.connect()
            return getattr(self._client, what)(*args, **kwargs)
        except Exception as e:
            if what == "reset" and not fresh and type(e).__name__.startswith("ConnectionClosed"):
                # the server closed a session that sat idle between episodes: a new episode needs no old session
                self._abandon()
                return self._call(what, *args, **kwargs)
            # the client raises RuntimeError("Server error: <message> (code: <WSErrorCode>)") for an error answer
            text = self._redact(str(e))
            if isinstance(e, RuntimeError) and text.startswith("Server error:"):
                if "(code: VALIDATION_ERROR)" in text and self.served is None:
                    raise _Rejected(text.removeprefix("Server error: ")) from None
                self._abandon()
                raise EnvError(f"{self._where()}: the server answered {what}() with an error: "
                               f"{text.removeprefix('Server error: ')}") from e
            self._abandon()
            why = (f"no answer within {self.timeout:g} s" if isinstance(e, TimeoutError) else
                   f"{type(e).__name__}: {text}")
            if fresh and type(e).__name__.startswith("ConnectionClosed"):
                # OpenEnv's server answers a session past its limit with CAPACITY_REACHED and closes it; the
                # client reads that answer only as the closed socket of the next request
                why += ("; it closed a new session at once, as it does at its session limit (agentrl serve-env "
                        "--max-sessions: a training run holds one session per rollout env and per held-out env)")
            cause = None if text != str(e) else e  # a cause whose text holds the token is not chained
            raise EnvError(f"{self._where()}: {what}() failed, the server is gone or not answering ({why})") from cause

    def _abandon(self) -> None:
        """Drop a session that failed without waiting on it (a hung server would hold a clean close)."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client._stop_loop()  # the sync wrapper's event-loop thread; its socket goes with the loop
            except Exception:
                pass

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_client"] = None  # a worker process opens its own session
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_tools()

    # -- the gymnasium API -----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._return, self._remote_ended = 0.0, False
        kwargs: dict[str, Any] = {} if seed is None else {"seed": int(seed)}
        if options:
            kwargs["options"] = options
        result = self._call("reset", **kwargs)
        obs = result.observation
        if self.served is not None:
            return str(obs.get("text", "")), dict(obs.get("info") or {})
        return self._render(obs), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.served is None:  # the `act` tool, through AgentEnv's parsing and counting
            return super().step(action)
        if self._ended:
            raise EnvError(f"{self._where()}: step() called after the episode ended; call reset()")
        if not isinstance(action, str):
            raise EnvError(f"{self._where()}: step() takes the action text, got {type(action).__name__}")
        self._turn += 1
        result = self._call("step", {"text": action})
        obs = result.observation
        terminated, truncated = bool(obs.get("terminated")), bool(obs.get("truncated"))
        if not (terminated or truncated) and self._turn >= self.max_turns:  # a tighter budget than the server's
            truncated = True
        self._ended = terminated or truncated
        self._malformed = int(obs.get("malformed_calls", 0))
        key = obs.get("state_key")
        info = {"turn": self._turn, "malformed_calls": self._malformed, "malformed": int(obs.get("malformed", 0)),
                "tool_timeouts": int(obs.get("tool_timeouts", 0)), "step_reward": float(obs.get("step_reward", 0.0)),
                "state_key": None if key is None else StateKey(key)}
        return str(obs.get("text", "")), float(result.reward or 0.0), terminated, truncated, info

    # -- a generic OpenEnv env: the `act` tool and the return as R ------------------------------

    def _send_action(self, **arguments: Any) -> str:
        if self._remote_ended:
            return "error: the episode has already ended; this action was not sent"
        try:
            result = self._call("step", arguments)
        except _Rejected as e:  # the server refused the arguments: the policy's mistake, counted as such
            raise ValidationError.from_exception_data("act_args", [
                {"type": "value_error", "loc": ("action",), "input": arguments, "ctx": {"error": ValueError(str(e))}}
            ]) from None
        reward = float(result.reward or 0.0)
        self._return += reward
        self.add_step_reward(reward)
        if result.done:
            self._remote_ended = True
            self.finish()
        return self._render(result.observation)

    def verify(self) -> float:
        return self._return
