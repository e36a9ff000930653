"""`check_env`: does an environment follow the `AgentEnv` contract? A flat list of small checks.

Each check takes a fresh-enough env and raises `AssertionError` with a message that says what is
wrong, or returns a note worth reading when it passes (e.g. whether the env has a scripted expert);
`check_env` runs them all and reports every failure, not just the first.

>>> from agentrl.envs.vault import VaultEnv
>>> [r.name for r in check_env(VaultEnv(locks=2)) if not r.ok]
[]
"""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentrl.core import AgentEnv, EnvError
from agentrl.registry import make
from agentrl.verify.sandbox import isolation_of

GARBAGE = "this is not a tool call"
BROKEN_CALL = "<tool_call>{not json}</tool_call>"


def _garbage(env: AgentEnv) -> str:
    """An action the env must refuse as malformed. In an env whose policy answers a user in plain text
    (``answers_in_text = True``: BFCL's multi-turn suite, where a reply without a call ends the user's
    turn) text is an answer, not a mistake, so a broken call stands in for it."""
    return BROKEN_CALL if getattr(env, "answers_in_text", False) else GARBAGE


@dataclass
class CheckResult:
    name: str
    ok: bool
    message: str = ""


def _roll(env: AgentEnv, seed: int, actions: Callable[[AgentEnv], str], limit: int = 1000) -> list[tuple[Any, ...]]:
    obs, info = env.reset(seed=seed)
    trace: list[tuple[Any, ...]] = [(obs,)]
    for _ in range(limit):
        obs, reward, terminated, truncated, info = env.step(actions(env))
        trace.append((obs, reward, terminated, truncated, info.get("step_reward"), repr(info.get("state_key"))))
        if terminated or truncated:
            return trace
    raise AssertionError(f"episode did not end within {limit} steps although max_turns = {env.max_turns}")


def has_expert(env: AgentEnv) -> bool:
    """Does `env` implement `expert_action(noise)`? Asked after a reset, as the warm start will call it
    (an override that raises NotImplementedError counts as none). The env is left reset on seed 0."""
    if type(env).expert_action is AgentEnv.expert_action:
        return False
    try:
        env.reset(seed=0)
        env.expert_action(0.0)
    except NotImplementedError:
        return False
    return True


NO_EXPERT = ("the environment has no scripted expert (expert_action(noise) is not implemented), so there are no "
             "demonstrations to warm-start the tiny policy from: `agentrl train` needs --model (a folder or hub id), "
             "e.g. one fine-tuned on your own demonstrations with `agentrl sft --data demos.jsonl --env.id ENV --out "
             "warm/` (format: README, 'Write your own environment'), or implement expert_action")


def _expert(env: AgentEnv) -> Callable[[AgentEnv], str] | None:
    return (lambda e: e.expert_action(0.3)) if has_expert(env) else None


def check_is_agent_env(env: AgentEnv) -> None:
    assert isinstance(env, AgentEnv), f"{type(env).__name__} does not subclass agentrl.AgentEnv"


def check_tools(env: AgentEnv) -> None:
    schemas = env.tool_schemas()
    assert schemas, "the environment declares no tools"
    names = [s["function"]["name"] for s in schemas]
    assert len(names) == len(set(names)), f"tool names repeat: {names}"
    json.dumps(schemas)  # must be serialisable: chat templates render it
    for s in schemas:
        assert s["function"]["description"], f"tool {s['function']['name']!r} has no description (write a docstring)"


def check_reset(env: AgentEnv) -> None:
    out = env.reset(seed=0)
    assert isinstance(out, tuple) and len(out) == 2, "reset() must return (observation, info)"
    obs, info = out
    assert isinstance(obs, str) and obs, f"reset() observation must be non-empty text, got {obs!r}"
    assert isinstance(info, dict), f"reset() info must be a dict, got {type(info).__name__}"


def check_step(env: AgentEnv) -> None:
    env.reset(seed=0)
    out = env.step(_garbage(env))
    assert isinstance(out, tuple) and len(out) == 5, "step() must return (obs, reward, terminated, truncated, info)"
    obs, reward, terminated, truncated, info = out
    assert isinstance(obs, str), f"step() observation must be text, got {type(obs).__name__}"
    assert isinstance(reward, float), f"step() reward must be a float, got {type(reward).__name__}"
    assert isinstance(terminated, bool) and isinstance(truncated, bool), "terminated and truncated must be bools"
    assert isinstance(info, dict) and "malformed_calls" in info, "info must count malformed_calls"


def check_malformed_call_is_observation(env: AgentEnv) -> None:
    env.reset(seed=0)
    for bad in [_garbage(env), BROKEN_CALL, '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>']:
        obs, _, _, _, info = env.step(bad)
        assert isinstance(obs, str) and obs, f"a malformed call must be answered with an explanation, got {obs!r}"
        assert info.get("malformed", 0) >= 1, f"a malformed call ({bad!r}) was not counted in info['malformed']"
        if env._ended:
            env.reset(seed=0)


def check_turn_budget_truncates(env: AgentEnv) -> None:
    trace = _roll(env, 0, _garbage)
    *_, (obs, reward, terminated, truncated, *_rest) = trace
    assert truncated and not terminated, "running out of turns must give truncated=True, terminated=False"
    assert len(trace) - 1 == env.max_turns, f"truncated after {len(trace) - 1} turns, max_turns is {env.max_turns}"


def check_step_after_end_raises(env: AgentEnv) -> None:
    _roll(env, 0, _garbage)
    try:
        env.step(_garbage(env))
    except EnvError:
        return
    raise AssertionError("step() after the episode ended must raise (call reset() first)")


def check_determinism(env: AgentEnv) -> None:
    """Reset twice with one seed, step the same actions, compare everything."""
    actor = _expert(env) or _garbage
    for seed in (1, 2):
        env.reset(seed=1000 + seed)  # the expert's own randomness comes from the env's seed too
        a = _roll(env, seed, actor)
        b = _roll(env, seed, actor)
        assert a == b, f"seed {seed}: two episodes with the same seed and actions differ"


THREADS = 4  # copies at once: enough to show a shared-state race, few enough for a small server's sessions
THREAD_HINT = ("the default rollout workers are threads (rollout.env_workers thread:64), so separate env instances "
               "step at once: guard state that instances share (a module-level object of a library, a shared file) "
               "with a lock, as agentrl's TextWorld adapter does, or run this env with rollout.env_workers process:N")


def check_threads(env: AgentEnv) -> str | None:
    """Copies of the env, each playing its own seed in a thread, all at once (twice), give the episodes that
    each plays alone. Passing cannot prove thread safety (a race may not show in 16 episodes); failing
    means the env, or a library under it, shares state between instances."""
    try:
        copies = [pickle.loads(pickle.dumps(env)) for _ in range(THREADS)]  # how a process pool copies it too
    except Exception as e:  # any failure to copy only means this check cannot run
        return f"skipped: the env cannot be pickled ({type(e).__name__}: {e}), so it runs in threads only"
    actor = _expert(env) or _garbage
    start = threading.Barrier(THREADS)

    def play(i: int) -> list[tuple[Any, ...]]:
        start.wait()
        return _roll(copies[i], 100 + i, actor)

    try:
        alone = [_roll(c, 100 + i, actor) for i, c in enumerate(copies)]
        with ThreadPoolExecutor(THREADS) as pool:
            for _ in range(2):
                futures = [pool.submit(play, i) for i in range(THREADS)]
                for i, future in enumerate(futures):
                    try:
                        together = future.result()
                    except Exception as e:
                        raise AssertionError(f"seed {100 + i} raised {type(e).__name__}: {e} when {THREADS} copies "
                                             f"played at once, not when it played alone: {THREAD_HINT}") from e
                    assert together == alone[i], (f"seed {100 + i}: the episode differs when {THREADS} copies play "
                                                  f"at once: {THREAD_HINT}")
    finally:
        for c in copies:  # a copy may hold a session, a game or a process of its own
            try:
                c.close()
            except Exception:  # closing is best effort; the check's verdict is above
                pass
    return None


def check_expert(env: AgentEnv) -> str:
    """Not a requirement; says plainly what the env's expert (or its absence) enables."""
    if not has_expert(env):
        return "none: " + NO_EXPERT
    return ("yes: `agentrl train` without --model builds the tiny policy and warm-starts it by SFT on this expert's "
            "noisy demonstrations (--sft.noise; auto judges it by the warm start's own pass rate)")


def check_expert_finishes(env: AgentEnv) -> str | None:
    if _expert(env) is None:
        return "skipped: no scripted expert"
    trace = _roll(env, 7, lambda e: e.expert_action(0.0))
    assert trace[-1][1] > 0, f"the noise-free expert scored {trace[-1][1]} on seed 7"
    return None


def check_expert_summary(env: AgentEnv) -> str | None:
    """Where the expert writes summaries (`expert_summary`, for warm starts under rollout.context summarize): the
    noise-free expert, asked for one halfway, keeps every fact the env says the task needs (`facts_kept`) and
    still finishes the task after it."""
    if _expert(env) is None or type(env).expert_summary is AgentEnv.expert_summary:
        return "skipped: the expert writes no summaries"
    env.reset(seed=7)
    kept, reward = None, 0.0
    for turn in range(env.max_turns):
        if turn == env.max_turns // 2:
            summary = env.expert_summary(0.0)
            assert isinstance(summary, str) and summary, f"expert_summary() must return text, got {summary!r}"
            kept = env.facts_kept(summary)
            assert kept is None or kept == 1.0, (f"the noise-free expert's summary keeps {kept} of the facts: "
                                                 f"{summary!r}")
        _, reward, terminated, truncated, _ = env.step(env.expert_action(0.0))
        if terminated or truncated:
            break
    assert reward > 0, f"the noise-free expert scored {reward} on seed 7 after summarising halfway"
    return None if kept is not None else "the env does not say which facts a summary keeps (facts_kept)"


def check_sandbox(env: AgentEnv) -> str | None:
    """For an env that runs policy-written code: which isolation holds it, and a failure if none
    does (the run would let candidates read your files and reach the network)."""
    iso = isolation_of(env)
    if iso is None:
        return "none needed: the env runs no sandbox"
    note = iso.summary() + ("; " + "; ".join(iso.reasons) if iso.reasons else "")
    assert iso.sufficient, f"{note} (set by AGENTRL_UNSAFE_UNISOLATED_SANDBOX=1, or a sandbox made by hand)"
    return note


SPLIT_SEEDS = 16  # seeds each split is reset on, to check that the tasks it serves are those it declares
SPLIT_HINT = ("a `split` argument (train | eval) and a `task_ids(limit=None)` method declare one, which held-out "
              "evaluation builds with split='eval' (docs/evaluation.md, 'Splits that mean unseen')")


def declares_split(env: Any) -> bool:
    """Does `env` declare a held-out split: a `split` attribute (``train`` or ``eval``) and a method
    ``task_ids(limit=None) -> list[str]`` that names its split's tasks as ``info["task_id"]`` at reset names them?"""
    return hasattr(env, "split") and callable(getattr(env, "task_ids", None))


def check_splits_disjoint(train: AgentEnv, held_out: AgentEnv, seeds: int = SPLIT_SEEDS) -> str:
    """One env's train and eval splits share no task: their declared task ids (the full sets: ids are named, not
    generated) do not overlap, and each split, reset on seeds 0..`seeds`-1, serves only tasks it declares. Raises
    AssertionError naming a shared id; the note counts the tasks and any first observation both samples open with
    (a small task space repeats its texts under different ids: reasoning-gym's two-term sums)."""
    for env, want in ((train, "train"), (held_out, "eval")):
        assert getattr(env, "split", None) == want, f"the {want} split's env says split={getattr(env, 'split', None)!r}"
    train_ids, eval_ids = train.task_ids(), held_out.task_ids()
    assert train_ids and eval_ids, f"a split declares no task ({len(train_ids)} train, {len(eval_ids)} eval)"
    train_set = set(train_ids)
    shared = [t for t in eval_ids if t in train_set]
    assert not shared, (f"task {shared[0]!r} is in both the train and the eval split ({len(shared)} of the eval "
                        f"split's {len(eval_ids)} tasks are)")
    declared = {"train": train_set, "eval": set(eval_ids)}
    opening: dict[str, set[str]] = {"train": set(), "eval": set()}
    for env, name in ((train, "train"), (held_out, "eval")):
        for seed in range(seeds):
            obs, info = env.reset(seed=seed)
            task = info.get("task_id")
            assert isinstance(task, str) and task, f"the {name} split's reset(seed={seed}) names no info['task_id']"
            where = " (a train task)" if name == "eval" and task in train_set else ""
            assert task in declared[name], (f"the {name} split served task {task!r}{where} on seed {seed}, which its "
                                            "task_ids() does not declare")
            opening[name].add(obs)
    note = (f"{len(train_ids):,} train and {len(eval_ids):,} eval tasks, none shared; {seeds} seeds of each serve "
            "its own")
    repeated = len(opening["train"] & opening["eval"])
    if repeated:
        note += (f"; {repeated} first observation(s) open episodes of both splits (different tasks, the same text: "
                 "a small task space)")
    return note


def check_split(env: AgentEnv, build: Callable[[str], AgentEnv] | None = None) -> str:
    """Where the env declares a split: its other split, built by `build(split)` from the same arguments (as held-out
    evaluation builds it), and `check_splits_disjoint` on the two."""
    if not declares_split(env):
        if hasattr(env, "split"):  # held-out evaluation builds it with split="eval" all the same
            return "unchecked: the env has a `split` but no task_ids() to name its tasks by; " + SPLIT_HINT
        return "none declared: held-out evaluation plays other seeds of the same tasks; " + SPLIT_HINT
    if env.split not in ("train", "eval"):
        raise AssertionError(f"split must be 'train' or 'eval', got {env.split!r}")
    if build is None:
        return "skipped: built from an instance without its arguments; give check_env the env's id or class"
    other_split = "eval" if env.split == "train" else "train"
    try:
        other = build(other_split)
    except Exception as e:  # the held-out evaluation would fail the same way: say so here
        raise AssertionError(f"the {other_split} split cannot be built from the same arguments, as held-out "
                             f"evaluation builds it: {type(e).__name__}: {e}") from e
    try:
        return check_splits_disjoint(*((env, other) if env.split == "train" else (other, env)))
    finally:
        other.close()


CHECKS = [
    check_is_agent_env,
    check_tools,
    check_reset,
    check_step,
    check_malformed_call_is_observation,
    check_turn_budget_truncates,
    check_step_after_end_raises,
    check_determinism,
    check_threads,
    check_expert,
    check_expert_finishes,
    check_expert_summary,
    check_sandbox,
    check_split,
]


def _split_builder(source: AgentEnv | str | type, kwargs: dict[str, Any],
                   env: AgentEnv) -> Callable[[str], AgentEnv] | None:
    """How to build `env` again with another split: from the id or class check_env was given, else from the
    registered spec `make` left on the env; None for an instance built by hand."""
    if isinstance(source, str):
        return lambda split: make(source, **{**kwargs, "split": split})
    if isinstance(source, type):
        return lambda split: source(**{**kwargs, "split": split})
    spec = getattr(env, "spec", None)
    if spec is not None and spec.id:
        return lambda split: make(spec.id, **{**(spec.kwargs or {}), "split": split})
    return None


def check_env(env: AgentEnv | str | type, **kwargs: Any) -> list[CheckResult]:
    """Run every check; `env` is an instance, a class, a registered id or `module:Class`. An env that declares a
    split is also built with the other split from the same arguments (`check_split`)."""
    source = env
    if isinstance(env, str):
        env = make(env, **kwargs)
    elif isinstance(env, type):
        env = env(**kwargs)
    build = _split_builder(source, kwargs, env)
    results = []
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            note = check_split(env, build) if check is check_split else check(env)
            results.append(CheckResult(name, True, note or ""))
        except Exception as e:  # a check that crashes is a failed check, with its reason
            msg = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
            results.append(CheckResult(name, False, msg))
        if name == "is_agent_env" and not results[-1].ok:
            break
    return results


@dataclass
class PromptReport:
    """What a model makes of an environment's first turn (`agentrl show-prompt`)."""

    model: str
    tool_format: str
    template_renders_tools: bool
    prompt: str  # the first prompt exactly as the model sees it
    prompt_tokens: int
    tools_named: dict[str, bool]  # tool name -> whether the prompt names it
    layout: Any = None  # the re-render check of one expert episode (agentrl.chat.layout.Rerender), if any
    expert_text: str | None = None  # the expert's first action, in the model's call format
    history: str = "append"  # how turns are laid out: append, or template (the template rewrites the history)


def prompt_report(env: AgentEnv | str, model: str, tool_format: str | None = None, seed: int = 0,
                  **kwargs: Any) -> PromptReport:
    """The first prompt of `env` (seed `seed`) for `model` (its tokenizer only: no weights are loaded),
    and, where the env has an expert, one expert episode laid out by the rollout and re-rendered
    through the template (the tokens trained on against the template's own layout)."""
    from transformers import AutoTokenizer

    from agentrl.chat.layout import ChatFormat, rerender_check
    from agentrl.engines.base import ScriptedEngine
    from agentrl.models import resolve
    from agentrl.rollout import rollout

    if isinstance(env, str):
        env = make(env, **kwargs)
    chat = ChatFormat(AutoTokenizer.from_pretrained(resolve(model)), tool_format)
    obs, _ = env.reset(seed=seed)
    tools = env.tool_schemas()
    prompt = chat.prompt_text(obs, tools, env.system_prompt)
    report = PromptReport(model, chat.tool_format.name, chat.template_renders_tools, prompt,
                          len(chat.encode(prompt)), {t["function"]["name"]: t["function"]["name"] in prompt
                                                     for t in tools}, history=chat.history)
    if has_expert(env):
        env.reset(seed=seed)
        report.expert_text = chat.expert_text(env.expert_action(0.0))
        engine = ScriptedEngine(lambda row: chat.action_ids(chat.expert_text(env.expert_action(0.0))), chat.eos_id)
        (episode,), _ = rollout([env], [seed], engine, chat, workers="serial")
        report.layout = rerender_check(chat, episode, obs, tools, env.system_prompt)
    return report
