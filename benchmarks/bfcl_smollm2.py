"""SmolLM2-135M-Instruct on a slice of BFCL's base multi-turn category, judged by BFCL's own checker.

No training: the fetched model (`agentrl models fetch smollm2-135m-instruct`) plays each entry once, greedily
(BFCL's own inference samples at temperature 0.001), through agentrl's rollout and its Hermes call format (the
model's chat template ignores ``tools=``, so agentrl writes the schemas and the format into the system prompt).
BFCL's full prompts (20-40 functions, 9,000-21,000 characters of schema) are long for a 135M model, so the env
runs with ``functions=path`` (only the functions each entry's solution uses) on the base category's shortest
entries, bfcl_tiny.py's four and the next two. ``steps_per_turn`` is cut from BFCL's 20 to 5 to bound the run's
time; each entry's ``calling_steps_max`` says whether any episode came near it.

The baseline, measured in the same run: the env's scripted expert (BFCL's ground-truth calls), played through the
same rollout, the same prompts and SmolLM2's tokenizer (its actions encoded and decoded as the model's are). It
should pass every entry; if it does, the prompt, the call format's round trip and the checker work, and what
the model scores is the model's. ``ratio`` is SmolLM2's pass rate over the expert's.

    nice -n 10 python benchmarks/bfcl_smollm2.py            # 6 entries, one episode each (~11 min at load ~5)
    nice -n 10 python benchmarks/bfcl_smollm2.py --quick    # entry 144 only (~3 min); JSON to bfcl_smollm2_quick.json

Last line: one JSON object, also written to benchmarks/results/bfcl_smollm2.json (``--quick``:
bfcl_smollm2_quick.json). Per entry: passed, the policy's turns, its calls and malformed calls, the most calling
steps in one user turn, BFCL's verdict (``error_type``, ``error_message``), a one-line reason, and each turn's
action and observation, cut short.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402

from agentrl.config import SamplingConfig  # noqa: E402
from agentrl.core import Episode  # noqa: E402
from agentrl.engines import get_engine_spec  # noqa: E402
from agentrl.engines.base import ScriptedEngine  # noqa: E402
from agentrl.policy import Policy  # noqa: E402
from agentrl.registry import make  # noqa: E402
from agentrl.rollout import rollout  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
ENV_ID = "agentrl/BFCL-v0"
# the base entries with the shortest prompts under functions=path (1,359-1,868 characters of schemas and first
# message, 2-3 user turns); the first four are bfcl_tiny.py's
ENTRIES = [144, 91, 100, 115, 105, 57]
QUICK_ENTRIES = [144]
CUT = 240  # characters of each action and observation kept in the JSON


def make_envs(entries: list[int], steps_per_turn: int) -> list[Any]:
    """One env per entry; seed i plays entries[i] (the env plays entry seed % len(subset))."""
    kwargs = {"category": "base", "subset": entries, "functions": "path", "steps_per_turn": steps_per_turn}
    return [make(ENV_ID, **kwargs) for _ in entries]


def calls_per_turn(ep: Episode, env: Any) -> list[int]:
    """The calls each action wrote (well-formed or not), as the env's parser reads them."""
    return [len(env.tool_format.parse(t.action, env.tool_schemas())) for t in ep.turns]


def calling_steps_max(calls: list[int]) -> int:
    """The most calling actions in a row, i.e. in one user turn (an answer without a call ends the user turn)."""
    best = run = 0
    for n in calls:
        run = run + 1 if n else 0
        best = max(best, run)
    return best


def reason(ep: Episode, verdict: dict[str, Any], calls: list[int]) -> str:
    """Why an episode failed, in one line: what the policy did, then BFCL's verdict."""
    if ep.passed:
        return "passed"
    if ep.error:
        return f"env error: {ep.error}"
    bfcl = f"BFCL: {verdict.get('error_type')}: {str(verdict.get('error_message'))[:160]}"
    if not any(calls):
        return f"no tool call in any of its {ep.num_turns} turns (answered every user turn in text); {bfcl}"
    if ep.malformed_calls == sum(calls):
        return f"every call it wrote was malformed ({ep.malformed_calls}); {bfcl}"
    if ep.truncated:
        return f"truncated (step limit or turn budget); {bfcl}"
    return f"wrong calls or state; {bfcl}"


def record(eps: list[Episode], envs: list[Any], entries: list[int]) -> list[dict[str, Any]]:
    rows = []
    for ep, env, entry in zip(eps, envs, entries):
        verdict = dict(env.verdict or {})
        calls = calls_per_turn(ep, env)
        rows.append({
            "entry": env.entry.id, "index": entry, "user_turns": len(env.entry.ground_truth),
            "ground_truth_calls": sum(len(t) for t in env.entry.ground_truth), "passed": ep.passed,
            "reward": ep.reward, "turns": ep.num_turns, "calls": sum(calls), "malformed_calls": ep.malformed_calls,
            "calling_steps_max": calling_steps_max(calls), "terminated": ep.terminated, "truncated": ep.truncated,
            "prompt_tokens": len(ep.prompt_ids), "action_tokens": ep.num_action_tokens, "verdict": verdict,
            "why": reason(ep, verdict, calls),
            "actions": [{"action": t.action[:CUT], "calls": c, "malformed": t.malformed,
                         "observation": t.observation[:CUT]} for t, c in zip(ep.turns, calls)],
        })
    return rows


def play_expert(policy: Policy, entries: list[int], steps_per_turn: int) -> tuple[list[dict[str, Any]], float]:
    """The scripted expert through the same rollout and tokenizer as the model: each action is the expert's
    text in the model's call format, encoded to the model's ids and decoded back by the rollout."""
    envs = make_envs(entries, steps_per_turn)
    chat = policy.chat
    engine = ScriptedEngine(lambda row: chat.action_ids(chat.expert_text(envs[row].expert_action(0.0))), chat.eos_id)
    t0 = time.perf_counter()
    eps, _ = rollout(envs, list(range(len(entries))), engine, chat, workers="serial")
    return record(eps, envs, entries), time.perf_counter() - t0


def play_model(policy: Policy, entries: list[int], steps_per_turn: int, max_new_tokens: int) -> dict[str, Any]:
    """One greedy episode per entry, all entries in one batch."""
    envs = make_envs(entries, steps_per_turn)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens)
    engine = get_engine_spec("torch").load()(policy, sampling, seed=0)
    context = getattr(policy.model.config, "max_position_embeddings", 2048)
    t0 = time.perf_counter()

    def ended(done: int, total: int) -> None:
        print(f"  smollm2: {done}/{total} episodes ended after {time.perf_counter() - t0:.0f}s", flush=True)

    eps, stats = rollout(envs, list(range(len(entries))), engine, policy.chat, max_context=context,
                         max_new_tokens=max_new_tokens, workers="serial", on_episode=ended)
    seconds = time.perf_counter() - t0
    return {"rows": record(eps, envs, entries), "seconds": round(seconds, 1), "action_tokens": stats.action_tokens,
            "tokens_per_s": round(stats.action_tokens / seconds, 2), "generate_calls": stats.generate_calls,
            "context": context}


def pass_rate(rows: list[dict[str, Any]]) -> float:
    return sum(r["passed"] for r in rows) / len(rows)


def main() -> None:
    p = parser(__doc__, quick=f"entry {QUICK_ENTRIES} only (a few minutes)")
    p.add_argument("--entries", default=None, help="comma-separated base entry indices (default: the six "
                   "shortest under functions=path)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="per turn; a call is 25-60 SmolLM2 tokens, "
                   "two calls ~100; prose runs to the cap, and the cap is most of the run's time")
    p.add_argument("--steps-per-turn", type=int, default=5, help="BFCL's is 20; 5 bounds the run's time and is "
                   "more than the 1-3 calls per user turn these entries' solutions make")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--json", default=None, help="default: benchmarks/results/bfcl_smollm2[_quick].json")
    a = p.parse_args()
    entries = ([int(x) for x in a.entries.split(",")] if a.entries else QUICK_ENTRIES if a.quick else ENTRIES)
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    policy = Policy.load(MODEL)  # fetched on first use (agentrl models fetch)
    load_s = time.perf_counter() - t0
    print(f"{MODEL}: loaded in {load_s:.1f}s, call format {policy.chat.tool_format.name}, template renders tools: "
          f"{policy.chat.template_renders_tools}", flush=True)

    expert, expert_s = play_expert(policy, entries, a.steps_per_turn)
    print(f"expert (baseline): {sum(r['passed'] for r in expert)}/{len(expert)} in {expert_s:.1f}s", flush=True)
    model = play_model(policy, entries, a.steps_per_turn, a.max_new_tokens)
    for r in model["rows"]:
        print(f"  {r['entry']}: {'pass' if r['passed'] else 'fail'}, {r['turns']} turns, {r['calls']} calls, "
              f"{r['malformed_calls']} malformed; {r['why']}", flush=True)
    expert_rate, model_rate = pass_rate(expert), pass_rate(model["rows"])
    ratio = round(model_rate / expert_rate, 3) if expert_rate else None
    print(f"smollm2 {model_rate:.3f} vs expert {expert_rate:.3f} on {len(entries)} entries: ratio {ratio}")
    result = {
        "benchmark": "bfcl_smollm2", "model": MODEL, "quick": a.quick,
        "env": f"{ENV_ID} (base, functions=path, steps_per_turn={a.steps_per_turn})", "entries": entries,
        "baseline": "the env's scripted expert (BFCL's ground truth) through the same rollout and tokenizer",
        "ratio": ratio, "smollm2_pass_rate": model_rate, "expert_pass_rate": expert_rate,
        "smollm2_passed": sum(r["passed"] for r in model["rows"]), "episodes": len(entries),
        "sampling": {"temperature": 0.0, "max_new_tokens": a.max_new_tokens},
        "call_format": policy.chat.tool_format.name, "template_renders_tools": policy.chat.template_renders_tools,
        "smollm2": model, "expert": {"rows": expert, "seconds": round(expert_s, 2)},
        "load_seconds": round(load_s, 1), "total_seconds": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "threads": a.threads, "load_before": round(load_before, 2),
    }
    report("bfcl_smollm2", result, a.quick, path=a.json)  # adds the machine and the command


if __name__ == "__main__":
    main()
