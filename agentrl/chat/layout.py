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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.chat import ToolFormat, convert, detect_format, get_format

_PROBE_TOOL = "agentrl_probe_tool_7f3a"


class ChatFormat:
    """Token ids for a tool-using conversation, derived from the tokenizer's chat template.

    ``tool_format`` names the call format (``hermes``, ``qwen3-coder``, ...; see `agentrl.chat`);
    by default it is detected from the template's source.
    """

    _A, _O = "\x00ACTION\x00", "\x00OBSERVATION\x00"

    def __init__(self, tokenizer: Any, tool_format: str | ToolFormat | None = None):
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template; agentrl needs one to lay out turns")
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        if isinstance(tool_format, ToolFormat):
            self.tool_format = tool_format
        else:
            self.tool_format = get_format(tool_format) if tool_format else detect_format(tokenizer.chat_template)
        self.template_renders_tools = self._renders_tools()
        msgs = [{"role": "user", "content": "U"}, {"role": "assistant", "content": self._A},
                {"role": "tool", "content": self._O}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if self._A not in text or self._O not in text:
            raise ValueError("the chat template dropped the assistant or tool message; cannot derive the turn layout")
        between = text[text.index(self._A) + len(self._A) :]
        self.obs_prefix, _, self.obs_suffix = between.partition(self._O)
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

    def _renders_tools(self) -> bool:
        """Does the template put ``tools=`` into the prompt? Rendered with a probe tool, not guessed."""
        probe = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}
        try:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": "U"}], tools=[probe],
                                                      tokenize=False, add_generation_prompt=True)
        except Exception:  # a template that cannot take tools at all
            return False
        return _PROBE_TOOL in text

    def encode(self, text: str) -> list[int]:
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
        return self.tokenizer.apply_chat_template(self.messages(observation, tools, system),
                                                  tools=(tools or None) if self.template_renders_tools else None,
                                                  tokenize=False, add_generation_prompt=True)

    def prompt_ids(self, observation: str, tools: list[dict[str, Any]], system: str | None = None) -> list[int]:
        return self.encode(self.prompt_text(observation, tools, system))

    def observation_ids(self, observation: str, ended_with_eos: bool) -> list[int]:
        prefix = self.obs_prefix
        if ended_with_eos and self.eos_text and prefix.startswith(self.eos_text):
            prefix = prefix[len(self.eos_text) :]  # the action already closed its message
        return self.encode(prefix + observation + self.obs_suffix)

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
    wrapper missed) shows here as a text difference."""
    tok = chat.tokenizer
    msgs: list[dict[str, str]] = chat.messages(observation, tools, system)
    built = list(episode.prompt_ids)
    retokenised = 0
    for turn in episode.turns:
        action_ids = list(turn.action_ids)
        built += action_ids + list(turn.obs_ids)
        text = chat.decode(action_ids)
        canonical = chat.encode(text)
        retokenised += action_ids not in (canonical, canonical + [chat.eos_id])
        msgs += [{"role": "assistant", "content": text}, {"role": "tool", "content": turn.observation}]
    rendered = tok.apply_chat_template(msgs, tools=(tools or None) if chat.template_renders_tools else None,
                                       tokenize=False, add_generation_prompt=True)
    ours = tok.decode(built, skip_special_tokens=False)
    text_equal = rendered == ours
    first = None
    if not text_equal:
        i = next((k for k, (a, b) in enumerate(zip(rendered, ours)) if a != b), min(len(rendered), len(ours)))
        first = f"at char {i}: template {rendered[max(0, i - 40):i + 40]!r} vs rollout {ours[max(0, i - 40):i + 40]!r}"
    return Rerender(text_equal, text_equal and chat.encode(rendered) == built, retokenised, first)
