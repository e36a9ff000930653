"""The gateway's HTTP server: the wire formats' routes and agentrl's own, on uvicorn in a thread.

    POST /sessions                          open a session: {"group": ..., "task_id": ...} -> {"session", "base_url"}
    POST /sessions/{session}/reward         {"reward": R} ends the episode; {"step_reward": r, "call": k} does not
    GET  /health                            no token needed; says nothing but "ok"

Every other route needs ``Authorization: Bearer <token>`` (compared in constant time). A body is read up to
`gateway.max_body_bytes` and refused past it before it is parsed; every refusal is a 4xx with an
OpenAI-style error body, and nothing a client sends reaches another session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import threading
from collections.abc import Callable
from typing import Any

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as e:  # an optional extra: say which
    raise ImportError("the gateway needs starlette and uvicorn: pip install 'agentrl[gateway]'") from e

import agentrl.gateway.openai_api as openai_api
from agentrl.adapters.serve import HANDSHAKE_TIMEOUT, h11_with_head_timeout
from agentrl.gateway.service import Gateway
from agentrl.gateway.session import CallError

LOG = logging.getLogger(__name__)
STATUS_KINDS = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


def build_app(gateway: Gateway, on_session: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
              on_reward: Callable[[str, float], None] | None = None) -> Any:
    """The ASGI app (Starlette: routes and nothing in between, since every call of every session passes here).
    `on_session(body)` opens a session for ``POST /sessions`` (serve-policy: it knows the groups) and returns its
    record; `on_reward(session, reward)` takes a terminal reward (None: 404 for both, the in-process runner opens
    and ends its sessions itself)."""
    limit = gateway.cfg.max_body_bytes

    def refuse(e: CallError) -> JSONResponse:
        kind = STATUS_KINDS.get(e.status, "invalid_request_error")
        return JSONResponse(openai_api.error_body(str(e), e.code, e.param, kind), status_code=e.status)

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        """The token and the body's declared size checked before `handler` runs; a `CallError` becomes its 4xx."""
        async def endpoint(request: Request) -> Response:
            try:
                if not gateway.authorized(request.headers.get("authorization")):
                    raise CallError("missing or wrong API key: pass the run's token as the bearer token (the "
                                    "in-process agent is handed it; serve-policy prints it)", "invalid_api_key",
                                    status=401)
                length = request.headers.get("content-length")
                if length is not None and (not length.isdigit() or int(length) > limit):
                    raise CallError(f"the body is over gateway.max_body_bytes ({limit} bytes)", "body_too_large",
                                    status=413)
                return await handler(request)
            except CallError as e:
                return refuse(e)
        return endpoint

    async def body(request: Request) -> bytes:
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise CallError(f"the body is over gateway.max_body_bytes ({limit} bytes)", "body_too_large",
                                status=413)
            parts.append(chunk)
        return b"".join(parts)

    async def json_body(request: Request) -> dict[str, Any]:
        raw = await body(request)
        try:
            data = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            raise CallError("the body is not valid JSON", "invalid_json") from None
        if not isinstance(data, dict):
            raise CallError("the body must be a JSON object", "invalid_json")
        return data

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        return JSONResponse(openai_api.models(gateway.model_name))

    async def chat(request: Request) -> Response:
        session = request.path_params["session"]
        req = openai_api.parse_request(await body(request))
        call = req.to_call()
        reply = await gateway.complete(session, call, request.is_disconnected, req.sampling())
        call_id = f"chatcmpl-{session}-{gateway.stats.calls}"
        if req.stream:
            usage = bool((req.stream_options or {}).get("include_usage"))
            events = openai_api.chunks(reply, gateway.model_name, call_id, usage)

            async def gen() -> Any:
                for e in events:
                    yield e.encode()
            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse(openai_api.completion(reply, gateway.model_name, call_id))

    async def open_session(request: Request) -> Response:
        if on_session is None:
            raise CallError("this gateway opens its sessions itself (an in-process run)", "not_found", status=404)
        data = await json_body(request)
        return JSONResponse(await asyncio.to_thread(on_session, data), status_code=201)

    async def reward(request: Request) -> Response:
        session = request.path_params["session"]
        data = await json_body(request)
        unknown = set(data) - {"reward", "step_reward", "call"}
        if unknown:
            raise CallError(f"unknown fields {sorted(unknown)[:5]}: reward, step_reward, call", param="body")
        if ("reward" in data) == ("step_reward" in data):
            raise CallError("give exactly one of reward (ends the episode) and step_reward (one call's)",
                            param="reward")
        key = "reward" if "reward" in data else "step_reward"
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise CallError(f"{key} must be a finite number", param=key)
        if key == "step_reward":
            call = data.get("call")
            if call is not None and (isinstance(call, bool) or not isinstance(call, int)):
                raise CallError("call must be an integer (the call's index in the session, from 0)", param="call")
            gateway.step_reward(session, float(value), call)
            return JSONResponse({"session": session, "step_reward": float(value)})
        if on_reward is None:
            raise CallError("this gateway's agent returns its reward itself (an in-process run)", "not_found",
                            status=404)
        on_reward(session, float(value))
        return JSONResponse({"session": session, "reward": float(value), "ended": True})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return JSONResponse(openai_api.error_body(f"no route {request.method} {request.url.path[:200]}", "not_found",
                                                  kind=STATUS_KINDS.get(status, "invalid_request_error")),
                            status_code=status)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/sessions/{session}/v1/models", guarded(models), methods=["GET"]),
        Route("/sessions/{session}/v1/chat/completions", guarded(chat), methods=["POST"]),
        Route("/sessions", guarded(open_session), methods=["POST"]),
        Route("/sessions/{session}/reward", guarded(reward), methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})


class Server:
    """uvicorn serving `app` on a thread of its own; `base_url` once started. A context manager."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, max_connections: int = 4096):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: without, a response's head and body wait out the client's delayed ACK
        # on every call (docs/benchmarks.md, "The gateway")
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        # a client that opens a connection and never finishes its request is dropped after timeout_keep_alive;
        # limit_concurrency answers 503 past it instead of queueing without end
        # and one that never finishes its request head is closed after HANDSHAKE_TIMEOUT (serve-env's protocol)
        config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=5, limit_concurrency=max_connections,
                                h11_max_incomplete_event_size=64 * 1024, lifespan="off", http=h11_with_head_timeout())
        config.agentrl_handshake_timeout = HANDSHAKE_TIMEOUT
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="agentrl-gateway-http", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> Server:
        self.thread.start()
        for _ in range(400):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                raise RuntimeError("the gateway's HTTP server did not start (see the log above)")
            threading.Event().wait(0.01)
        raise RuntimeError("the gateway's HTTP server did not start within 4 s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
