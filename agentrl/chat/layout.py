"""`ChatFormat`: a tool-using conversation as token ids, laid out by the model's own chat template.

The rollout lays an episode out turn by turn (the prompt once, then each action's sampled ids and
each observation's ids), so earlier turns are never decoded and re-encoded: the ids trained on are
the ids the model saw. Three things come from the tokenizer, found by rendering rather than by the
model's name:

- **the observation wrapper**: what the template puts between the end of an assistant message and
  the next assistant generation prompt (rendered once with placeholders);
- **whether the template renders ``tools=``**: Qwen2.5, Qwen3, Llama 3.1 and Mistral templates do;
  SmolLM2's and many older templates ignore them, and then the tool schemas and the call format go
  into the system prompt (`ToolFormat.instructions`), or the model would never hear of its tools;
- **the tool-call format** (`agentrl.chat.detect_format`, or ``tool_format=`` to choose): how this
  model family writes a call, which the environment parses and the expert's demonstrations are
  written in.

`rerender_check` is the proof: it renders a finished episode's messages through the template and
compares with the ids the rollout built.

The template is code that came with the model: it is rendered within bounds of time and size
(`agentrl.chat.template`), and text past `MAX_CHARS` is refused before it reaches the tokenizer.

Some templates rewrite the history as the conversation grows (Qwen3's drops the ``<think>`` of turns
before the last user message; others renumber or trim). A model served with such a template is given
the rewritten context, which is not the running sequence. ``history="template"`` lays each turn out by
rendering the conversation so far: where the rendering extends the running sequence, it is appended;
where it does not, the next action starts a new segment (`Turn.segment_context`) and is trained on
exactly that context (`agentrl.store.segment_batch`). ``history="auto"`` (the default) chooses
``template`` when a probe conversation shows the template rewriting its history, ``append`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.chat import ToolFormat, convert, detect_format, get_format
from agentrl.chat.template import MAX_CHARS, ChatTemplate

_PROBE_TOOL = "agentrl_probe_tool_7f3a"


class ChatFormat:
    """Token ids for a tool-using conversation, derived from the tokenizer's chat template.

    ``tool_format`` names the call format (``hermes``, ``qwen3-coder``, ...; see `agentrl.chat`);
    by default it is detected from the template's source.
    """

    _A, _O = "\x00ACTION\x00", "\x00OBSERVATION\x00"

    def __init__(self, tokenizer: Any, tool_format: str | ToolFormat | None = None, history: str = "auto"):
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template; agentrl needs one to lay out turns")
        self.tokenizer = tokenizer
        self._templates: dict[str, ChatTemplate] = {}  # by source: a tokenizer may hold one for tools and one without
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        if isinstance(tool_format, ToolFormat):
            self.tool_format = tool_format
        else:
            self.tool_format = get_format(tool_format) if tool_format else detect_format(tokenizer.chat_template)
        self.template_renders_tools = self._renders_tools()
        msgs = [{"role": "user", "content": "U"}, {"role": "assistant", "content": self._A},
                {"role": "tool", "content": self._O}]
        text = self._apply(msgs)
        if self._A not in text or self._O not in text:
            raise ValueError("the chat template dropped the assistant or tool message; cannot derive the turn layout")
        between = text[text.index(self._A) + len(self._A) :]
        self.obs_prefix, _, self.obs_suffix = between.partition(self._O)
        # a message that ends in a call's stop string may be closed otherwise (harmony: <|call|> ends it, no <|end|>)
        self.prefix_after = {stop: after for stop in self.tool_format.stop_strings
                             if (after := self._wrapper_after(self._A + stop)) not in (None, self.obs_prefix)}
        self.eos_text = tokenizer.eos_token or ""
        stops = {self.eos_id}
        # An action ends where the template ends an assistant message (the added token it writes right
        # after the text), whatever the tokenizer calls EOS: Qwen2.5's base models ship the ChatML
        # template with eos_token <|endoftext|>, and stopping at that alone runs an action past its
        # <|im_end|> into made-up turns. The tokenizer's EOS stays a stop.
        first = self.encode(self.obs_prefix)[:1]
        marker = tokenizer.convert_ids_to_tokens(first[0]) if first else None
        if marker in tokenizer.get_added_vocab() and self.obs_prefix.startswith(marker):
            self.eos_id, self.eos_text = first[0], marker
            stops.add(first[0])
        # stop at the end of a call where that end is one token (</tool_call>, <|eom_id|>, <|call|>):
        # nothing useful follows it in the same turn
        for text_stop in self.tool_format.stop_strings:
            ids = self.encode(text_stop)
            if len(ids) == 1 and ids[0] != tokenizer.unk_token_id:
                stops.add(ids[0])
        self.stop_ids = sorted(s for s in stops if s is not None)
        if history not in ("auto", "append", "template"):
            raise ValueError(f"history must be auto, append or template, got {history!r}")
        self.rewrites_history = self._rewrites_history()
        self.history = ("template" if self.rewrites_history else "append") if history == "auto" else history

    def _wrapper_after(self, action: str) -> str | None:
        """What the template writes between the assistant message `action` and the next tool message's
        content (None if it dropped either)."""
        msgs = [{"role": "user", "content": "U"}, {"role": "assistant", "content": action},
                {"role": "tool", "content": self._O}]
        text = self._apply(msgs)
        if action not in text or self._O not in text:
            return None
        return text[text.index(action) + len(action) :].partition(self._O)[0]

    def _renders_tools(self) -> bool:
        """Does the template put ``tools=`` into the prompt? Rendered with a probe tool, not guessed."""
        probe = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}
        try:
            text = self._apply([{"role": "user", "content": "U"}], [probe])
        except Exception:  # a template that cannot take tools at all
            return False
        return _PROBE_TOOL in text

    def _rewrites_history(self) -> bool:
        """Would laying turns out by appending part from the template's own rendering? Tried on a probe
        conversation of three tool turns whose actions reason in ``<think>`` and call a tool: the
        template may rewrite earlier turns (drop the reasoning, trim) or wrap observations in a way no
        fixed wrapper matches (numbered results)."""
        call = self.tool_format.render([("calc", {"expression": "1+1"})])
        msgs: list[dict[str, str]] = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        built = self.encode(self.render(msgs, []))
        for k in range(3):  # actions that end in text, and in a call (where a stop string may end them)
            content = f"<think>step {k}</think>A{k}" + (call if k % 2 else "")
            msgs = msgs + [{"role": "assistant", "content": content}, {"role": "tool", "content": f"O{k}"}]
            action = self.action_ids(content)
            built += action + self.following(action, f"O{k}")
            if self.tokenizer.decode(built, skip_special_tokens=False) != self.render(msgs, []):
                return True
        return False

    def render(self, messages: list[dict[str, str]], tools: list[dict[str, Any]]) -> str:
        """`messages` through the chat template, up to the next assistant generation prompt."""
        return self._apply(messages, (tools or None) if self.template_renders_tools else None)

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """What ``tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)``
        returns, rendered within the bounds of `ChatTemplate` (a `TemplateError` past them)."""
        source = self.tokenizer.get_chat_template(None, tools)
        template = self._templates.get(source)
        if template is None:
            template = self._templates[source] = ChatTemplate(source)
        return template.render(messages, tools, **self.tokenizer.special_tokens_map)

    def continuation(self, sequence: list[int], messages: list[dict[str, str]],
                     tools: list[dict[str, Any]]) -> tuple[list[int], list[int] | None]:
        """How the conversation `messages` (ending with a tool message) goes on from the ids `sequence`
        the model has been given: ``(ids to append, None)`` where the template's rendering extends
        `sequence`, or ``([], context)`` where it rewrote the history, `context` being the whole
        rendering (the next action's new segment)."""
        rendered = self.render(messages, tools)
        given = self.tokenizer.decode(sequence, skip_special_tokens=False)
        if rendered.startswith(given):
            return self.encode(rendered[len(given):]), None
        return [], self.encode(rendered)

    def encode(self, text: str) -> list[int]:
        if len(text) > MAX_CHARS:  # the tokenizer aborts the whole process on text of about 100 MB
            raise ValueError(f"{len(text):,} characters to encode, over the bound of {MAX_CHARS:,} "
                             "(agentrl.chat.template.MAX_CHARS)")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def system_text(self, system: str | None, tools: list[dict[str, Any]]) -> str | None:
        """The system message as the model gets it: with the tools and the call format spelled out
        when the template would drop ``tools=``."""
        if not tools or self.template_renders_tools:
            return system
        return (system + "\n\n" if system else "") + self.tool_format.instructions(tools)

    def messages(self, observation: str, tools: list[dict[str, Any]],
                 system: str | None = None) -> list[dict[str, str]]:
        """The first messages as the template gets them: the system message (see `system_text`), the task."""
        system = self.system_text(system, tools)
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": observation}]

    def prompt_text(self, observation: str, tools: list[dict[str, Any]], system: str | None = None) -> str:
        """The first prompt exactly as the model sees it (what `agentrl show-prompt` prints)."""
        return self.render(self.messages(observation, tools, system), tools)

    def prompt_ids(self, observation: str, tools: list[dict[str, Any]], system: str | None = None) -> list[int]:
        return self.encode(self.prompt_text(observation, tools, system))

    def observation_ids(self, observation: str, ended_with_eos: bool) -> list[int]:
        prefix = self.obs_prefix
        if ended_with_eos and self.eos_text and prefix.startswith(self.eos_text):
            prefix = prefix[len(self.eos_text) :]  # the action already closed its message
        return self.encode(prefix + observation + self.obs_suffix)

    def following(self, action_ids: list[int], observation: str) -> list[int]:
        """The observation's ids after an action that ended in `action_ids`, as the template closes that
        action's message: after the end-of-message token, after a call's stop string (which some
        templates let end the message), or after a cut-off action."""
        if action_ids and action_ids[-1] == self.eos_id:
            return self.observation_ids(observation, ended_with_eos=True)
        if self.prefix_after:
            text = self.decode(action_ids)
            for stop, prefix in self.prefix_after.items():
                if text.endswith(stop):
                    return self.encode(prefix + observation + self.obs_suffix)
        return self.observation_ids(observation, ended_with_eos=False)

    def action_ids(self, text: str) -> list[int]:
        """Token ids of a scripted action, ending in a stop token as a sampled one would."""
        ids = self.encode(text)
        if not ids or ids[-1] not in self.stop_ids:
            ids.append(self.eos_id)
        return ids

    def expert_text(self, text: str) -> str:
        """A scripted expert's action (written with Hermes calls, as `AgentEnv` experts are) in this
        model's own call format."""
        return text if self.tool_format.name == "hermes" else convert(text, get_format("hermes"), self.tool_format)

    def decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text.removesuffix(self.eos_text) if self.eos_text else text


@dataclass(frozen=True)
class Rerender:
    """How a finished episode's ids compare with its messages rendered through the chat template.

    ``text_equal``: the layout is the template's (the same text); ``ids_equal``: also the same ids.
    Text equal but ids not means the model sampled a tokenisation of its action other than the one
    the tokenizer would write (harmless here: the ids it sampled are the ids trained on, but a trainer
    that re-encoded the text would train on others). ``first_difference`` is the first character
    where the texts part, with the surrounding text of both."""

    text_equal: bool
    ids_equal: bool
    retokenised_actions: int  # actions whose sampled ids are not the tokenizer's encoding of their text
    first_difference: str | None = None


def rerender_check(chat: ChatFormat, episode: Any, observation: str, tools: list[dict[str, Any]],
                   system: str | None = None) -> Rerender:
    """Render `episode`'s conversation (`observation` is its task text) through the template and
    compare it with the ids the rollout built: the prompt, then per turn the action's ids and the
    observation's ids, up to the generation prompt after the last observation. A template that
    rewrites history (drops an earlier turn's ``<think>``, reorders, adds separators the observation
    wrapper missed) shows here as a text difference.

    With ``chat.history == "template"`` the rollout gives each action the template's rendering of the
    conversation before it (a new segment where the history was rewritten), so that is what is
    checked: every action's context against the rendering at that point."""
    tok = chat.tokenizer
    msgs: list[dict[str, str]] = chat.messages(observation, tools, system)
    built = list(episode.prompt_ids)
    retokenised = 0
    rendered = ours = ""
    for turn in episode.turns:
        if chat.history == "template":
            built = list(turn.segment_context) if turn.segment_context is not None else built
            rendered, ours = chat.render(msgs, tools), tok.decode(built, skip_special_tokens=False)
            if rendered != ours:
                break
        action_ids = list(turn.action_ids)
        built += action_ids + list(turn.obs_ids)
        text = chat.decode(action_ids)
        canonical = chat.encode(text)
        retokenised += action_ids not in (canonical, canonical + [chat.eos_id])
        msgs += [{"role": "assistant", "content": text}, {"role": "tool", "content": turn.observation}]
    else:
        if chat.history == "append":  # the whole conversation, the last observation included
            rendered, ours = chat.render(msgs, tools), tok.decode(built, skip_special_tokens=False)
    text_equal = rendered == ours
    ids_equal = text_equal and (chat.encode(rendered) == built if chat.history == "append" else not retokenised)
    first = None
    if not text_equal:
        i = next((k for k, (a, b) in enumerate(zip(rendered, ours)) if a != b), min(len(rendered), len(ours)))
        first = f"at char {i}: template {rendered[max(0, i - 40):i + 40]!r} vs rollout {ours[max(0, i - 40):i + 40]!r}"
    return Rerender(text_equal, ids_equal, retokenised, first)
