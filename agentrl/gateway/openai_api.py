"""OpenAI's chat-completions wire format over the gateway: requests checked, errors in OpenAI's shape.

    POST /sessions/{session}/v1/chat/completions     messages, tools, tool_choice, temperature, top_p,
                                                     max_tokens / max_completion_tokens, stop, n=1, stream
    GET  /v1/models, /sessions/{session}/v1/models   the one model served

A client points its base URL at ``http://HOST:PORT/sessions/{session}/v1`` and its API key at the run's
token. Anything this format cannot honour is refused with a 4xx naming the field, never ignored in a
way that changes what the model is asked (``n`` > 1, a JSON-schema ``response_format``); fields that only
tune sampling are accepted and the run's sampling decides (the loss corrects for the distribution that
sampled, so a client cannot change it mid-run; `gateway/sampling_overridden` counts the calls that asked).
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrl.gateway.session import TURN_KINDS, Call, CallError, Reply, check_tools

KIND_KEY = "agentrl_kind"  # in a request's `metadata`: what the call is (TURN_KINDS)


class ChatRequest(BaseModel):
    """The fields of a chat-completions request that the gateway reads; others are accepted and ignored
    (clients send `user`, `parallel_tool_calls`, `seed`, `store`, ...). Of `metadata` (OpenAI's: string values)
    it reads one key, `agentrl_kind`: "summary" marks an agent's own summariser's call."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        if isinstance(v, list) and (len(v) > 4 or not all(isinstance(s, str) and s for s in v)):
            raise ValueError("stop takes up to 4 non-empty strings")
        if isinstance(v, str) and not v:
            raise ValueError("stop must not be empty")
        return v

    @field_validator("n")
    @classmethod
    def _one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("n must be 1: each sample is a session of its own (a group is G sessions on one task)")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if v is not None and v.get("type", "text") != "text":
            raise ValueError(f"response_format {str(v.get('type'))[:40]!r} is not served: agentrl does not constrain "
                             "decoding (ask for JSON in the prompt, or offer a tool)")
        return v

    def to_call(self) -> Call:
        tools = self.tools or []
        check_tools(tools, self.tool_choice)
        for i, m in enumerate(self.messages):
            if not isinstance(m, dict) or "role" not in m:
                raise CallError(f"messages[{i}] must be an object with a role", param=f"messages[{i}]")
        limit = self.max_completion_tokens or self.max_tokens
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        kind = (self.metadata or {}).get(KIND_KEY, "action")
        if kind not in TURN_KINDS:
            raise CallError(f"metadata.{KIND_KEY} is {str(kind)[:40]!r}: one of {', '.join(TURN_KINDS)}",
                            param=f"metadata.{KIND_KEY}")
        return Call(list(self.messages), tools, self.tool_choice or "auto", limit, stop, kind)

    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p}


def error_body(message: str, code: str = "invalid_request_error", param: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object: the SDKs read `message`, `type`, `param`, `code`."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def parse_request(raw: bytes) -> ChatRequest:
    """A request body, refused with a `CallError` naming what is wrong."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CallError(f"the body is not valid JSON ({getattr(e, 'msg', e)})", code="invalid_json") from None
    except RecursionError:
        raise CallError("the body is nested too deeply", code="invalid_json") from None
    except ValueError as e:  # an integer past Python's digit limit
        raise CallError(f"the body holds a value that cannot be read ({str(e)[:80]})", code="invalid_json") from None
    if not isinstance(data, dict):
        raise CallError(f"the body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        raise CallError(f"{where}: {err['msg'].removeprefix('Value error, ')}" if where else err["msg"],
                        param=where) from None


def completion(reply: Reply, model: str, call_id: str) -> dict[str, Any]:
    """A chat.completion object for `reply`."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.calls:
        message["tool_calls"] = [_tool_call(i, n, a) for i, n, a in reply.calls]
    return {"id": call_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish, "logprobs": None}],
            "usage": _usage(reply)}


def chunks(reply: Reply, model: str, call_id: str, usage: bool) -> list[str]:
    """The same completion as server-sent events: the torch engine samples whole actions, so the stream is the
    role, the content, each call and the finish, then ``[DONE]``."""
    base = {"id": call_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        return f"data: {json.dumps(body)}\n\n"

    out = [event({"role": "assistant", "content": ""})]
    if reply.content:
        out.append(event({"content": reply.content}))
    for k, (i, n, a) in enumerate(reply.calls):
        out.append(event({"tool_calls": [{"index": k, **_tool_call(i, n, a)}]}))
    out.append(event({}, reply.finish))
    if usage:
        out.append(f"data: {json.dumps({**base, 'choices': [], 'usage': _usage(reply)})}\n\n")
    out.append("data: [DONE]\n\n")
    return out


def models(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "agentrl"}]}


def _tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _usage(reply: Reply) -> dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}
