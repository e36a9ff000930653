"""One agent episode seen from the model's side: chat calls in, token ids and an `Episode` out.

The gateway owns tokenisation. A call's messages are rendered through the model's own chat template;
where that rendering extends what the session's model has been given so far (the previous call's
prompt ids, then the completion ids exactly as sampled), only the extension is encoded and the
episode goes on as one sequence. Anything else (the agent dropped, summarised or rewrote its history,
a sub-agent spoke with another system prompt) opens a new segment (`Turn.segment_context`) that is
trained on exactly its own context. A sampled id is never decoded and encoded again.

Nothing here knows about HTTP: a wire format (`agentrl.gateway.openai_api`) turns its requests into
`Call`s and a `Reply` back into its own response.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat import ToolCall
from agentrl.chat.layout import ChatFormat
from agentrl.core import Episode, Turn
from agentrl.engines.base import Generation

TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # what an OpenAI function name may be


TURN_KINDS = ("action", "summary")  # agentrl.core.Turn.kind


class CallError(ValueError):
    """A call the session cannot serve, said as the client should read it; `code` is OpenAI's error code."""

    def __init__(self, message: str, code: str = "invalid_request_error", param: str | None = None,
                 status: int = 400):
        super().__init__(message)
        self.code, self.param, self.status = code, param, status


@dataclass(frozen=True)
class Call:
    """One chat call, in the wire format's terms already checked for shape (`openai_api`).

    `messages` are OpenAI chat messages; `tools` OpenAI function schemas. `max_tokens` None: the run's
    own cap; `stop`: strings that end the completion where they first appear. `kind`: what the agent says the
    call is (`TURN_KINDS`): "summary" for its own summariser's calls, which `rollout.context.mask_summary` leaves
    out of the loss as it does an env's summaries."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    kind: str = "action"


@dataclass
class Plan:
    """What the engine must do for a call: continue a row with `extension`, or (re)admit it with `context`."""

    context: list[int]  # every id the model is given before this action
    extension: list[int] | None  # ids to append to a row that holds the rest already; None: admit `context`
    new_segment: bool  # the history was rewritten: this action trains on `context`, a segment of its own


@dataclass(frozen=True)
class Reply:
    """The completion as the wire format sends it back."""

    content: str | None
    calls: list[tuple[str, str, dict[str, Any]]]  # (id, name, arguments) of each well-formed call
    finish: str  # stop | length | tool_calls
    prompt_tokens: int
    completion_tokens: int


# -- messages: OpenAI's shape -> what the chat template renders ----------------------------------------


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (OpenAI's multi-part form)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise CallError(f"{where}.content[{k}]: only text parts are served, got {str(kind)[:40]!r}",
                                param=f"{where}.content")
            if not isinstance(part.get("text"), str):
                raise CallError(f"{where}.content[{k}].text must be a string", param=f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise CallError(f"{where}.content must be a string, a list of text parts or null", param=f"{where}.content")


def check_tools(tools: Sequence[dict[str, Any]], tool_choice: Any) -> list[str]:
    """The offered tools' names, each checked (a name the model could not write back, or twice, is refused),
    and `tool_choice` checked against them."""
    names: list[str] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise CallError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", param="tools")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise CallError(f"tools[{i}].function.name {str(name)[:80]!r} must match {TOOL_NAME.pattern}",
                            param="tools")
        if name in names:
            raise CallError(f"tools[{i}]: the tool {name!r} is offered twice", param="tools")
        params = fn.get("parameters", {})
        if params is not None and not isinstance(params, dict):
            raise CallError(f"tools[{i}].function.parameters must be a JSON schema object", param="tools")
        names.append(name)
    if isinstance(tool_choice, dict):
        chosen = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice.get("function"), dict) \
            else None
        if chosen not in names:
            raise CallError(f"tool_choice names the tool {str(chosen)[:80]!r}, which is not among the tools offered "
                            f"({', '.join(names) or 'none'})", param="tool_choice")
    elif tool_choice not in (None, "auto", "none", "required"):
        raise CallError(f"tool_choice must be auto, none, required or a named function, got {str(tool_choice)[:40]!r}",
                        param="tool_choice")
    elif tool_choice == "required" and not names:
        raise CallError("tool_choice is required but no tools are offered", param="tool_choice")
    return names


# -- one session -------------------------------------------------------------------------------------


class AgentSession:
    """The calls of one episode, laid out as an `Episode` (one call = one turn).

    `plan(call)` says what the engine must run for a call; `record(gen)` takes what it sampled and says
    what to send back. The episode's sequence is the first call's prompt, then each action and the ids
    that the next call appended; a call that does not extend the running sequence opens a segment.
    """

    def __init__(self, chat: ChatFormat, *, name: str, row: int, group_id: int, task_id: str, seed: int | None,
                 version: int, env_id: str = "agent", check_ids: bool = False):
        self.chat, self.name, self.row = chat, name, row
        self.episode = Episode(prompt_ids=[], env_id=env_id, task_id=task_id, group_id=group_id, seed=seed,
                               policy_version=version)
        self.version = version
        self.seq: list[int] = []  # the ids of the running segment: its context and the last action
        self.layout = 0  # where the next action starts in the episode's layout (`Episode.token_ids`)
        self.engine_holds = 0  # how many of `seq`'s ids the engine's row holds (0: no row)
        self.issued: dict[str, str] = {}  # what the session sent back -> the exact text the model wrote
        self.pending: tuple[Call, Plan, list[dict[str, str]]] | None = None
        self.pending_state_key: str | None = None  # the state_key hook's answer for the pending call
        self.prefix_breaks = 0
        self.check_ids = check_ids  # compare each context with the template's own encoding (the drift metric)
        self.ids_checked = self.ids_drift = 0
        self.ended = False
        self.transcript: list[dict[str, Any]] = []  # the last call's messages and the reply: what `verify` reads

    @property
    def calls(self) -> int:
        return len(self.episode.turns)

    # -- a call in -----------------------------------------------------------------------------------

    def messages(self, call: Call) -> list[dict[str, str]]:
        """`call.messages` as the template renders them: content as text, an assistant's calls in the model's
        own format (the exact text it wrote, where the session sent them), the tools in the system prompt
        when the template would drop ``tools=``."""
        out: list[dict[str, str]] = []
        open_calls: set[str] | None = None  # ids the last assistant message's calls carry (tool replies answer them)
        for i, m in enumerate(call.messages):
            where = f"messages[{i}]"
            role = m.get("role")
            if role == "developer":
                role = "system"
            if role not in ("system", "user", "assistant", "tool"):
                raise CallError(f"{where}.role must be system, developer, user, assistant or tool, got "
                                f"{str(role)[:40]!r}", param=f"{where}.role")
            content = _text(m.get("content"), where)
            if role == "assistant":
                content, ids = self._assistant_text(m, content, where)
                open_calls = ids
            elif role == "tool":
                if open_calls is None:
                    raise CallError(f"{where}: a tool message must answer an assistant message with tool_calls",
                                    param=f"{where}.role")
                reply_to = m.get("tool_call_id")
                if open_calls and reply_to is not None and reply_to not in open_calls:
                    raise CallError(f"{where}.tool_call_id {str(reply_to)[:80]!r} answers no call of the assistant "
                                    "message before it", param=f"{where}.tool_call_id")
            else:
                open_calls = None
            out.append({"role": role, "content": content})
        if not out:
            raise CallError("messages must not be empty", param="messages")
        if call.tools and not self.chat.template_renders_tools:
            system = self.chat.system_text(out[0]["content"] if out[0]["role"] == "system" else None, call.tools)
            out = [{"role": "system", "content": system or ""}] + (out[1:] if out[0]["role"] == "system" else out)
        return out

    def _assistant_text(self, m: dict[str, Any], content: str, where: str) -> tuple[str, set[str] | None]:
        """An assistant message's text as the model would have written it, and the ids of its calls (None: no
        calls). A message this session sent back is the exact text sampled; any other (a few-shot example, a
        message the agent made up) is its content followed by its calls in the model's format."""
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise CallError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
        parsed, ids = [], set()
        for k, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise CallError(f"{where}.tool_calls[{k}] needs a function with a string name",
                                param=f"{where}.tool_calls")
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except (json.JSONDecodeError, RecursionError):
                    raise CallError(f"{where}.tool_calls[{k}].function.arguments is not valid JSON",
                                    param=f"{where}.tool_calls") from None
            if not isinstance(args, dict):
                raise CallError(f"{where}.tool_calls[{k}].function.arguments must be a JSON object",
                                param=f"{where}.tool_calls")
            parsed.append((fn["name"], args))
            if isinstance(c.get("id"), str):
                ids.add(c["id"])
        key = _issued_key(content, [i for i in (c.get("id") for c in calls if isinstance(c, dict))
                                    if isinstance(i, str)])
        exact = self.issued.get(key)
        if exact is not None:
            return exact, ids if calls else None
        if not parsed:
            return content, None
        try:
            written = self.chat.tool_format.render(parsed)
        except ValueError as e:
            raise CallError(f"{where}.tool_calls: {e}", param=f"{where}.tool_calls") from None
        return content + written, ids

    def plan(self, call: Call) -> Plan:
        """What the engine runs for `call`: an extension of the session's row, or a (new) segment's context."""
        if self.ended:
            raise CallError(f"session {self.name!r} has ended", code="session_ended", status=409)
        if self.pending is not None:
            raise CallError(f"session {self.name!r} has a call in flight: a session is one conversation, its calls "
                            "come one at a time", code="call_in_flight", status=409)
        msgs = self.messages(call)
        rendered = self.chat.render(msgs, call.tools)
        given = self.chat.tokenizer.decode(self.seq, skip_special_tokens=False) if self.seq else None
        if given is not None and rendered.startswith(given) and len(rendered) > len(given):
            extension = self.chat.encode(rendered[len(given):])
            plan = Plan(self.seq + extension, extension, new_segment=False)
        else:
            plan = Plan(self.chat.encode(rendered), None, new_segment=bool(self.episode.turns))
        if self.check_ids:
            self.ids_checked += 1
            self.ids_drift += self.chat.encode(rendered) != plan.context
        self.pending = (call, plan, msgs)
        return plan

    def record(self, gen: Generation) -> Reply:
        """The pending call's action: laid into the episode, and what goes back to the client."""
        assert self.pending is not None, "record() without plan()"
        call, plan, msgs = self.pending
        self.pending = None
        ids, logprobs, finish = list(gen.ids), list(gen.logprobs), gen.finish
        cut = len(ids)
        if call.max_tokens is not None and call.max_tokens < cut:
            cut, finish = call.max_tokens, "length"
        if call.stop:
            cut = min(cut, _stop_cut(self.chat, ids[:cut], call.stop))
            finish = "stop" if cut < len(ids) and finish != "length" else finish
        ids, logprobs = ids[:cut], logprobs[:cut]
        ep = self.episode
        if not ep.turns:
            ep.prompt_ids = list(plan.context)
            self.layout = len(plan.context)
        elif plan.new_segment:
            self.prefix_breaks += 1
            ep.turns[-1].obs_ids = []
        else:
            ep.turns[-1].obs_ids = list(plan.extension or [])
            self.layout += len(plan.extension or [])
        if ep.turns:
            ep.turns[-1].observation = _new_content(msgs)
        text = self.chat.decode(ids)
        shown = text  # what the client reads: the text before a stop string, as OpenAI leaves it out
        if call.stop:
            at = min((text.find(s) for s in call.stop if s in text), default=-1)
            shown = text[:at] if at >= 0 else text
        parsed = [] if call.tool_choice == "none" else self.chat.tool_format.parse(shown, call.tools)
        good = [c for c in parsed if c.error is None and c.name is not None]
        ep.turns.append(Turn(self.layout, ids, logprobs, [], action=text, malformed=len(parsed) - len(good),
                             hidden=gen.hidden, segment_context=list(plan.context) if plan.new_segment else None,
                             policy_version=self.version, kind=call.kind))
        self.layout += len(ids)
        self.seq = plan.context + ids
        # the engine's row holds every sampled id unless the reply cut some (max_tokens, stop)
        self.engine_holds = len(self.seq) if cut == len(gen.ids) else 0
        reply_calls = [(f"call_{self.name}_{len(ep.turns)}_{k}", c.name, c.arguments) for k, c in enumerate(good)]
        content = _outside_calls(self.chat, shown, call.tools) if good else shown
        self.issued[_issued_key(content or "", [c[0] for c in reply_calls])] = text
        said: dict[str, Any] = {"role": "assistant", "content": content or None}
        if reply_calls:
            said["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                                  for i, n, a in reply_calls]
        self.transcript = list(call.messages) + [said]
        return Reply(content or None, reply_calls, "tool_calls" if good and finish != "length" else
                     ("length" if finish == "length" else "stop"), len(plan.context), len(ids))

    def cancel(self) -> None:
        """The pending call's client left: nothing was laid into the episode, the engine's row is stale."""
        self.pending = None
        self.engine_holds = 0

    def end(self, reward: float | None, *, truncated: bool = False, error: str | None = None) -> Episode:
        """Close the episode with its terminal reward (truncated: it ran out of time, judged as it stands)."""
        ep = self.episode
        self.ended = True
        if error is not None:
            ep.error = error
        elif not ep.turns:
            ep.error = f"session {self.name} ({ep.task_id}) ended without a single call to the model: nothing to train"
        ep.reward = float(reward or 0.0)
        ep.terminated, ep.truncated = not truncated and error is None, truncated
        return ep

    def add_step_reward(self, value: float, call: int | None = None) -> None:
        turns = self.episode.turns
        if not turns:
            raise CallError("a step reward needs a call to attach to; this session has none yet", param="call")
        k = len(turns) - 1 if call is None else call
        if not 0 <= k < len(turns):
            raise CallError(f"call {k} is not among this session's {len(turns)} calls", param="call")
        turns[k].step_reward += float(value)

    def set_state_key(self, key: str | None) -> None:
        """The state before the call just recorded (step-level grouping, gigpo)."""
        if self.episode.turns:
            self.episode.turns[-1].state_key = key


def _issued_key(content: str, call_ids: Sequence[str]) -> str:
    return json.dumps([content, sorted(call_ids)]) if call_ids else json.dumps([content])


def _new_content(msgs: list[dict[str, str]]) -> str:
    """What a call added after the last assistant message (the turn's observation, for reading)."""
    tail = []
    for m in reversed(msgs):
        if m["role"] == "assistant":
            break
        tail.append(m["content"])
    return "\n".join(reversed(tail))


def _outside_calls(chat: ChatFormat, text: str, tools: Sequence[dict[str, Any]]) -> str:
    """`text` without its well-formed call blocks (the reply's content beside its tool_calls)."""
    kept, pos = [], 0
    for block in chat.tool_format.blocks(text, tools):
        if all(c.error is None for c in block.calls):
            kept.append(text[pos:block.start])
            pos = block.end
    kept.append(text[pos:])
    return "".join(kept).strip()


def _stop_cut(chat: ChatFormat, ids: list[int], stops: Sequence[str]) -> int:
    """The fewest of `ids` whose text holds one of `stops` (all of them if none appears): the completion ends
    with the token that completes the stop string, as sampled."""
    text = chat.decode(ids)
    if not any(s in text for s in stops):
        return len(ids)
    lo, hi = 1, len(ids)  # the text of a prefix grows with the prefix: bisect for the first that holds a stop
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in chat.decode(ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo


__all__ = ["AgentSession", "Call", "CallError", "Plan", "Reply", "ToolCall", "check_tools"]
