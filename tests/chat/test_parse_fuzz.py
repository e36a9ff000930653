"""Property test of `AgentEnv.step` over hostile action strings: it never raises (except `EnvError`
from a tool that raises), and ``info["malformed_calls"]`` equals the number of malformed or unclosed
calls the strategy wrote.

The expected count is this file's own reckoning: every piece of an action is drawn together with
what it is (text, a good call, a malformed call, an unclosed call at the end), so the oracle never
asks the parser. Random text never holds ``<`` and garbage bodies never hold ``"``, so that no piece
can become a tag or a well-formed call by accident.

The same reckoning then runs for every family in `agentrl.chat.FORMATS`, its calls written by the
family's own `render`: good ones, and well-written ones the env must refuse (an unknown tool, a missing
or mistyped argument).
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.chat import FORMATS, ToolFormat, get_format
from agentrl.core import AgentEnv, EnvError

TOOLS = ("add", "echo", "boom", "submit")


class Fuzz(AgentEnv):
    max_turns = 1_000_000  # one step per example: the budget must never end an episode here

    def add(self, x: int) -> str:
        """Add an integer (its value is not echoed: a 4,000-digit int must not reach str())."""
        self.calls.append("add")
        return "added"

    def echo(self, text: str) -> str:
        """Say how long the text was."""
        self.calls.append("echo")
        return f"{len(text)} characters"

    def boom(self) -> str:
        """A tool with a bug."""
        raise KeyError("bug")

    def submit(self, answer: int) -> str:
        """End the episode."""
        self.calls.append("submit")
        self.finish()
        return "submitted"

    tools = [add, echo, boom, submit]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.calls: list[str] = []
        return "go", {}

    def verify(self) -> float:
        return 0.0


# Characters random text is drawn from: JSON's own punctuation, escapes, controls, non-ASCII, but
# never "<" (no piece may become a tag by accident).
CHARS = "abcxyz019 _-+.,:;!?'\"\\/{}[]()\n\t\r\x00\x7f\u00e9\u4f60\u2028\U0001f600>="
NO_QUOTE = CHARS.replace('"', "")  # without '"' no object with a string "name" can form
BAD_KINDS = ["truncated", "garbage", "deep", "deep-args", "deep-string-args", "huge-int", "huge-int-string-args",
             "unknown", "wrong-type", "missing", "extra", "not-object", "no-name", "args-not-object"]
# What an action is made of; hypothesis draws this list (and shrinks it), a seeded Random the content
PIECES = ["text", "stray-closer", "good", "bad"]


def text(rnd: random.Random, chars: str = CHARS, n: int = 40) -> str:
    return "".join(rnd.choice(chars) for _ in range(rnd.randint(0, n)))


def an_int(rnd: random.Random) -> int:
    if rnd.random() < 0.1:  # up to 4,000 digits: still below the conversion limit, so a valid int
        return rnd.choice([-1, 1]) * rnd.randrange(10 ** rnd.randint(1, 4000))
    return rnd.randint(-10**6, 10**6)


def tag(body: str, space: str = "") -> str:
    return f"<tool_call>{space}{body}{space}</tool_call>"


def good_arguments(rnd: random.Random) -> tuple[str, dict]:
    name = rnd.choice(TOOLS)
    return name, {"add": lambda: {"x": an_int(rnd)}, "echo": lambda: {"text": text(rnd)}, "boom": dict,
                  "submit": lambda: {"answer": an_int(rnd)}}[name]()


def good_call(rnd: random.Random) -> tuple[str, str]:
    name, args = good_arguments(rnd)
    as_string = rnd.random() < 0.3  # some models write the arguments as a JSON string
    body = json.dumps({"name": name, "arguments": json.dumps(args) if as_string else args},
                      ensure_ascii=rnd.random() < 0.5)
    return tag(body, rnd.choice(["", " ", "\n"])), f"good:{name}"


def bad_call(rnd: random.Random) -> tuple[str, str]:
    """A call that must be answered with an error and counted, one of many kinds."""
    kind, k = rnd.choice(BAD_KINDS), rnd.randint(1, 5000)
    wrong = rnd.choice(["abc", 1.5, None, [1], {"a": 1}])
    if kind == "truncated":  # a strict prefix of a JSON object is never valid JSON
        body = json.dumps({"name": rnd.choice(TOOLS), "arguments": {"x": an_int(rnd)}})
        body = body[: rnd.randrange(len(body))]
    elif kind == "garbage":
        body = text(rnd, NO_QUOTE)
    elif kind == "deep":  # past the decoder's recursion limit, or a list: malformed either way
        body = "[" * k + "]" * k
    elif kind == "deep-args":
        body = '{"name": "echo", "arguments": {"text": ' + "[" * k + "]" * k + "}}"
    elif kind == "deep-string-args":
        body = json.dumps({"name": "add", "arguments": "[" * k + "]" * k})
    elif kind == "huge-int":  # over Python's 4,300-digit int conversion limit
        body = '{"name": "add", "arguments": {"x": ' + "7" * rnd.randint(4301, 6000) + "}}"
    elif kind == "huge-int-string-args":
        body = json.dumps({"name": "add", "arguments": '{"x": ' + "9" * rnd.randint(4301, 6000) + "}"})
    elif kind == "unknown":
        body = json.dumps({"name": rnd.choice(["", "Add", "add ", "submit_", "eval", text(rnd) + "!"]),
                           "arguments": {}})
    elif kind == "wrong-type":
        name, param = rnd.choice([("add", "x"), ("submit", "answer"), ("echo", "text")])
        value = wrong if name != "echo" else rnd.choice([1, 2.5, None, [], {}])
        body = json.dumps({"name": name, "arguments": {param: value}})
    elif kind == "missing":
        body = json.dumps({"name": rnd.choice(["add", "echo", "submit"]), "arguments": {}})
    elif kind == "extra":
        body = json.dumps({"name": "boom", "arguments": {text(rnd): an_int(rnd)}})
    elif kind == "not-object":
        body = json.dumps(rnd.choice([[an_int(rnd)], text(rnd), None, an_int(rnd)]))
    elif kind == "no-name":
        body = json.dumps({"name": rnd.choice([an_int(rnd), None, [text(rnd)]]), "arguments": {}})
    else:
        body = json.dumps({"name": "add", "arguments": rnd.choice([[an_int(rnd)], an_int(rnd), None])})
    return tag(body), "bad"


def action(pieces: list[str], unclosed: bool, rnd: random.Random) -> tuple[str, list[str]]:
    """The action text and, piece by piece, what each piece is."""
    made = []
    for piece in pieces:
        if piece == "text":
            made.append((text(rnd), "text"))
        elif piece == "stray-closer":  # ignored: nothing was opened
            made.append(("</tool_call>", "text"))
        else:
            made.append(good_call(rnd) if piece == "good" else bad_call(rnd))
    if unclosed:  # open to the end: garbage or a whole call without its closing tag
        body = text(rnd, NO_QUOTE) if rnd.random() < 0.5 else good_call(rnd)[0].removesuffix("</tool_call>")
        made.append((body, "unclosed") if body.startswith("<tool_call>") else ("<tool_call>" + body, "unclosed"))
    return "".join(t for t, _ in made), [kind for _, kind in made]


def expected(kinds: list[str]) -> tuple[int, bool, list[str]]:
    """(malformed calls, whether a raising tool runs, the tools that run), by this test's own reckoning."""
    calls = [k for k in kinds if k != "text"]
    if not calls:
        return 1, False, []  # no call at all is one malformed action
    malformed = sum(k in ("bad", "unclosed") for k in calls)
    ran: list[str] = []
    for k in calls:
        if k.startswith("good:"):
            name = k.removeprefix("good:")
            if name == "boom":
                return malformed, True, ran
            ran.append(name)
            if name == "submit":
                break  # later calls are not run (but the malformed ones were counted above)
    return malformed, False, ran


ENV = Fuzz()
ACTIONS_PER_EXAMPLE, EXAMPLES = 4, 2_500  # 10,000 action strings; hypothesis' own cost per example is ~2 ms here


def plans_from(raw: bytes) -> list[tuple[list[str], bool]]:
    """8 bytes per action: how many pieces, which pieces, whether it ends unclosed. One binary draw is
    ~20x cheaper than nested list strategies, and hypothesis still shrinks it (toward plain text)."""
    out = []
    for i in range(0, len(raw), 8):
        b = raw[i : i + 8]
        out.append(([PIECES[x % len(PIECES)] for x in b[1 : 1 + b[0] % 7]], bool(b[7] & 1)))
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
# The content comes from a seeded Random: each draw from hypothesis' own randoms() is a recorded
# choice, too slow for the ~100 draws an action takes.
@given(st.binary(min_size=8 * ACTIONS_PER_EXAMPLE, max_size=8 * ACTIONS_PER_EXAMPLE).map(plans_from),
       st.integers(0, 2**32 - 1).map(random.Random))
def test_step_never_raises_and_counts_every_malformed_call(plans, rnd):
    """Each example plays its actions as turns of one episode (a new one after an ending or a raising
    tool), so the episode's running count is checked as well as each step's."""
    ENV.reset(seed=0)
    episode_bad = 0
    for pieces, unclosed in plans:
        text, kinds = action(pieces, unclosed, rnd)
        n_bad, raises, ran = expected(kinds)
        ENV.calls.clear()
        if raises:
            with pytest.raises(EnvError, match="tool 'boom' raised KeyError"):
                ENV.step(text)
            ENV.reset(seed=0)
            episode_bad = 0
            continue
        obs, reward, terminated, truncated, info = ENV.step(text)
        episode_bad += n_bad
        assert isinstance(obs, str) and obs
        assert info["malformed"] == n_bad and info["malformed_calls"] == episode_bad, text[:300]
        assert ENV.calls == ran and terminated == ("submit" in ran) and not truncated
        if terminated:
            ENV.reset(seed=0)
            episode_bad = 0


# -- every family: the same reckoning, with calls written by the family's own `render` -----------------------

# Calls that are well written in any family and still wrong for this env's tools: each is counted malformed.
# (Not echo(text=5): a family that writes values as text reads it back as "5", a string, which is right.)
FAMILY_BAD = [("eval", {}), ("add", {}), ("add", {"x": "abc"}), ("boom", {"y": 1})]
WORDS = "abcxyz019 .,!?\n"  # text between calls: no bracket, brace, "<" or quote, so never a call in any family


def family_action(fmt: ToolFormat, pieces: list[str], rnd: random.Random) -> tuple[str, list[str]]:
    made = []
    for piece in pieces:
        if piece in ("text", "stray-closer"):
            made.append((text(rnd, WORDS), "text"))
        elif piece == "good":
            name, args = good_arguments(rnd)
            made.append((fmt.render([(name, args)]), f"good:{name}"))
        else:
            made.append((fmt.render([rnd.choice(FAMILY_BAD)]), "bad"))
    return "".join(t for t, _ in made), [kind for _, kind in made]


@pytest.mark.parametrize("name", sorted(FORMATS))
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(plans=st.binary(min_size=8 * ACTIONS_PER_EXAMPLE, max_size=8 * ACTIONS_PER_EXAMPLE).map(plans_from),
       rnd=st.integers(0, 2**32 - 1).map(random.Random))
def test_each_family_steps_without_raising_and_counts_every_malformed_call(name, plans, rnd):
    env = Fuzz()
    env.tool_format = get_format(name)
    env.reset(seed=0)
    for pieces, _ in plans:
        text, kinds = family_action(env.tool_format, pieces, rnd)
        n_bad, raises, ran = expected(kinds)
        env.calls.clear()
        if raises:
            with pytest.raises(EnvError, match="tool 'boom' raised KeyError"):
                env.step(text)
            env.reset(seed=0)
            continue
        obs, reward, terminated, truncated, info = env.step(text)
        assert info["malformed"] == n_bad, text[:300]
        assert env.calls == ran and terminated == ("submit" in ran)
        if terminated:
            env.reset(seed=0)
