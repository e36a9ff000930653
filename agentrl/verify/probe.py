"""The verifier probe: what does an environment's verifier wrongly accept?

>>> result = run_verifier_probe("agentrl/Math-v0", seeds=(0,))
>>> result.ok, result.wrongly_accepted
(True, [])

For each seed it resets the environment, submits adversarial answers through the environment's
own submit tool, and records the terminal reward. Generic attacks (derived from the reference
answer and the prompt): an empty answer, a format-only answer, the prompt echoed back, code that
compiles and does nothing, a correct-looking answer with wrong content, an over-long answer,
several answers at once, and unicode look-alikes. An environment adds its own (type confusions
where equality is right and where it is not, harness attacks) with ``probe_attacks() ->
{name: (answer, should_accept)}``; the same name replaces a generic attack, and
``should_accept=None`` marks a row as information only (a mutant that may be equivalent). It must provide
``probe_reference()`` (the correct answer, which must be accepted, or the probe is meaningless).

Leaks: the probe searches what the policy would read for the answer. The reference answer and its
normalised forms (whitespace collapsed, case folded; a number also as integer, fraction and decimal)
are looked for, as a whole token, in the prompt of every probed episode, in the answer of every tool
called with uninformative arguments derived from its schema (each tool at least once per seed, also
those the scripted expert never calls), and in the answers to the attacks. An answer that echoes the
reference the action itself carried is no leak, nor is the last observation of an episode (no action
follows it, so the policy never reads it), nor a reference of fewer than 4 characters in a prompt
(where a short number appears by chance). The scripted expert's own episode is searched for what the
environment declares with ``probe_secrets()`` (``[(text, scope)]``, scope ``"prompt"`` or ``"all"``):
its actions carry the solution, so a calculator that answers its expression does its job.
A hit means the policy could read the answer: a training bug.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from agentrl.core import AgentEnv, Tool, parse_tool_calls
from agentrl.registry import make
from agentrl.verify.base import perturb

__all__ = ["ProbeResult", "ProbeRow", "generic_attacks", "print_result", "run_verifier_probe"]

_LOOKALIKE = str.maketrans({"0": "O", "1": "l", "3": "З", "5": "Ƽ", "a": "а", "e": "е", "o": "о", "c": "с", "p": "р",
                            "x": "х", "i": "і"})


@dataclass(frozen=True)
class ProbeRow:
    attack: str
    seed: int
    should_accept: bool | None  # None: informational (e.g. a mutant that may be equivalent)
    reward: float
    note: str = ""

    @property
    def accepted(self) -> bool:
        return self.reward > 0.0

    @property
    def wrongly_accepted(self) -> bool:
        return self.accepted and self.should_accept is False

    @property
    def wrongly_rejected(self) -> bool:
        return not self.accepted and self.should_accept is True


@dataclass
class ProbeResult:
    env_id: str
    rows: list[ProbeRow] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    tools_called: set[str] = field(default_factory=set)  # every tool the probe ran, on any seed

    @property
    def wrongly_accepted(self) -> list[ProbeRow]:
        return [r for r in self.rows if r.wrongly_accepted]

    @property
    def wrongly_rejected(self) -> list[ProbeRow]:
        return [r for r in self.rows if r.wrongly_rejected]

    @property
    def ok(self) -> bool:
        """Nothing wrong was accepted and no answer leaked (wrong rejections are warnings)."""
        return not self.wrongly_accepted and not self.leaks


def generic_attacks(reference: str, prompt: str) -> dict[str, tuple[str, bool]]:
    """Attacks every verifier must reject, built from the reference answer and the prompt."""
    wrong = perturb(reference)
    attacks = {
        "empty answer": ("", False),
        "format only": ("<answer></answer>", False),
        "prompt echoed back": (prompt, False),
        "compiles, does nothing": ("pass", False),
        "correct-looking, wrong content": (wrong, False),
        "over-long answer": (wrong + " " + "9" * 100_000, False),
        "several answers at once": (f"{wrong}\n{reference}", False),
    }
    lookalike = reference.translate(_LOOKALIKE)
    if lookalike != reference:
        attacks["unicode look-alikes"] = (lookalike, False)
    return attacks


def _submit_action(env: AgentEnv, answer: str) -> str:
    if hasattr(env, "probe_submit"):
        return env.probe_submit(answer)
    tool = env._tools.get("submit")
    if tool is None:
        raise TypeError(f"{env.name}: the verifier probe needs a `submit` tool or a probe_submit(answer) method")
    fields = list(tool.params.model_fields)
    if len(fields) != 1:
        raise TypeError(f"{env.name}: submit takes {fields}; define probe_submit(answer) to say how to submit one "
                        "answer")
    return "<tool_call>" + json.dumps({"name": "submit", "arguments": {fields[0]: answer}}) + "</tool_call>"


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def reference_forms(reference: str) -> list[str]:
    """The reference answer as a leak may spell it: normalised, and a number in each exact form.

    >>> reference_forms("7/2"), reference_forms(" SELECT  x   FROM t ")
    (['3.5', '7/2'], ['select x from t'])
    """
    forms = {_norm(reference)}
    try:
        value = Fraction(reference.strip())
    except (ValueError, ZeroDivisionError):
        value = None
    if value is not None:
        forms.add(str(value))  # "7/2", "-3"
        if value.denominator == 1:
            forms.add(f"{value.numerator}.0")
        elif 10**12 % value.denominator == 0:  # a finite decimal
            forms.add(format(float(value), "g"))
    return sorted(f for f in forms if f)


def _found(text: str, forms: Sequence[str]) -> str | None:
    """The first form that occurs in `text` as a whole token (not inside a longer number or word)."""
    norm = _norm(text)
    for form in forms:
        if re.search(rf"(?<![\w.]){re.escape(form)}(?!\w|\.\d)", norm):
            return form
    return None


_SAMPLES: dict[str, list[Any]] = {"integer": [0, 1, 2], "number": [0.0, 1.0, 0.5], "string": ["", "a", "0"],
                                  "boolean": [False, True], "array": [[]], "object": [{}], "null": [None]}


def _uninformative_arguments(tool: Tool, k: int) -> dict[str, Any]:
    """The k-th set of arguments built from the tool's schema alone (it knows nothing of the task)."""
    params = tool.schema["function"]["parameters"]
    args = {}
    for name in params.get("required", []):
        prop = params.get("properties", {}).get(name, {})
        options = prop.get("enum") or _SAMPLES.get(
            prop.get("type") or next((o.get("type") for o in prop.get("anyOf", []) if o.get("type")), "string"), [""])
        args[name] = options[k % len(options)]
    return args


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _explore(env: AgentEnv, seed: int, called: set[str]) -> list[tuple[str, str, str]]:
    """Call every tool once from the start of the episode with uninformative arguments (the next set
    if the tool rejects one): [(where, action, observation)] of the answers the policy would read."""
    seen = []
    for name, tool in env._tools.items():
        for k in range(3):
            env.reset(seed=seed)
            action = _call(name, _uninformative_arguments(tool, k))
            obs, _, terminated, truncated, info = env.step(action)
            if not info["malformed"]:
                called.add(name)
                if not (terminated or truncated):
                    seen.append((f"the answer of tool {name!r} called with "
                                 f"{json.dumps(_uninformative_arguments(tool, k))}", action, obs))
                break
    return seen


def _reference_leaks(seed: int, reference: str, prompt: str,
                     answers: Sequence[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """[(place, leak)] where the reference answer can be read."""
    forms = reference_forms(reference)
    found = []
    if (form := _found(prompt, [f for f in forms if len(f) >= 4])) is not None:
        found.append(("prompt", f"seed {seed}: the reference answer {form[:60]!r} appears in the prompt"))
    for where, action, obs in answers:
        if (form := _found(obs, forms)) is not None and _found(action, [form]) is None:  # not an echo of the action
            found.append((where, f"seed {seed}: the reference answer {form[:60]!r} appears in {where}"))
    return found


def _leaks(env: AgentEnv, seed: int, called: set[str], max_turns: int = 32) -> list[tuple[str, str]]:
    """[(place, leak)] of declared secrets in the scripted expert's episode (see the module docstring)."""
    if not hasattr(env, "probe_secrets"):
        return []
    found = []
    obs, _ = env.reset(seed=seed)
    secrets = env.probe_secrets()
    seen = [("prompt", obs)]
    try:
        env.expert_action(0.0)
    except NotImplementedError:
        max_turns = 0  # no expert: the prompt is all there is to search
    for _ in range(max_turns):
        action = env.expert_action(0.0)
        calls = parse_tool_calls(action)
        if any(c.name == "submit" for c in calls):
            break
        obs, _, terminated, truncated, _ = env.step(action)
        called.update(c.name for c in calls if c.error is None and c.name in env._tools)
        seen.append(("all", obs))
        if terminated or truncated:
            break
    for text, scope in secrets:
        for where, o in seen:
            if text and text in o and (scope == "all" or where == "prompt"):
                place = "prompt" if where == "prompt" else "the observation of a tool the scripted expert called"
                found.append((place, f"seed {seed}: {text[:60]!r} appears in "
                              f"{'the prompt' if where == 'prompt' else 'the observation of a tool'}"))
                break
    return found


def run_verifier_probe(env_id: str | AgentEnv, seeds: Sequence[int] = (0, 1, 2),
                       env_kwargs: dict[str, Any] | None = None) -> ProbeResult:
    """Run the adversarial battery against `env_id`'s verifier (a registered id, ``module:Class``,
    or an env instance), and search what the policy reads for the answer. Raises `EnvError` if the
    verifier or a tool itself fails (also on the probe's uninformative arguments)."""
    env = make(env_id, **(env_kwargs or {})) if isinstance(env_id, str) else env_id
    for hook in ("probe_reference",):
        if not hasattr(env, hook):
            raise TypeError(f"{env.name}: the verifier probe needs {hook}() (the correct answer of the current "
                            "episode)")
    result = ProbeResult(env.name)
    for seed in seeds:
        prompt, _ = env.reset(seed=seed)
        reference = env.probe_reference()
        attacks = {"reference answer": (reference, True), **generic_attacks(reference, prompt)}
        if hasattr(env, "probe_attacks"):
            attacks.update(env.probe_attacks())
        answers = []
        for name, (answer, should_accept) in attacks.items():
            env.reset(seed=seed)
            action = _submit_action(env, answer)
            obs, reward, terminated, truncated, info = env.step(action)
            note = "" if terminated or truncated else "submit did not end the episode"
            result.rows.append(ProbeRow(name, seed, should_accept, float(reward), note))
            result.tools_called.update(c.name for c in parse_tool_calls(action) if c.name in env._tools
                                       and not info["malformed"])
            if not (terminated or truncated):
                answers.append((f"the answer to the attack {name!r}", action, obs))
        answers += _explore(env, seed, result.tools_called)
        places: dict[str, str] = {}  # one leak per place, whichever search saw it first
        for place, leak in _reference_leaks(seed, reference, prompt, answers) + _leaks(env, seed, result.tools_called):
            places.setdefault(place, leak)
        result.leaks += places.values()
    return result


def print_result(result: ProbeResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"verifier probe: {result.env_id}")
    for col in ("attack", "should", "accepted (seeds)", "verdict"):
        table.add_column(col)
    by_attack: dict[str, list[ProbeRow]] = {}
    for r in result.rows:
        by_attack.setdefault(r.attack, []).append(r)
    for name, rows in by_attack.items():
        n_acc = sum(r.accepted for r in rows)
        should = {True: "accept", False: "reject", None: "(info)"}[rows[0].should_accept]
        if any(r.wrongly_accepted for r in rows):
            verdict = "[bold red]WRONGLY ACCEPTED[/]"
        elif any(r.wrongly_rejected for r in rows):
            verdict = "[yellow]wrongly rejected[/]"
        elif rows[0].should_accept is None and n_acc:
            verdict = "[yellow]accepted: tests may be weak (or the variant is equivalent)[/]"
        else:
            verdict = "[green]ok[/]"
        table.add_row(name, should, f"{n_acc}/{len(rows)}", verdict)
    console = Console()
    console.print(table)
    if result.tools_called:
        console.print(f"tools called (each searched for the answer): {', '.join(sorted(result.tools_called))}")
    for leak in result.leaks:
        console.print(f"[bold red]LEAK (training bug):[/] {leak}")
    console.print("[green]nothing wrongly accepted[/]" if result.ok
                  else f"[bold red]{len(result.wrongly_accepted)} wrongly accepted, {len(result.leaks)} leaks[/]")
