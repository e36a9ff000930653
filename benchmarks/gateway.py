"""The gateway against the native rollout, and training runs through it (issue: "Your agent, unchanged").

Speed: the example agent (examples/agent/calc_agent.py: the openai client, its `add` tool, its reward) through
the gateway, against the same task written as an `AgentEnv` (`CalcEnv` below: the same tool schema, prompt,
turns and reward) through `agentrl.rollout`, with the same warm-started tiny policy, the same seeds and
sampling, rounds alternated after a warm-up of each. ratio = episodes/s through the gateway / episodes/s
natively, the median of the paired rounds, at two model sizes:

- SmolLM2-135M-Instruct (the real model `agentrl models fetch` loads; untrained on this task, it answers
  in one turn), 32 sessions in flight: the headline `ratio`, where the model's work is what a user pays for;
- the tiny policy warm-started on the agent's demonstrations (0.24M parameters, two calls an episode),
  64 sessions in flight: a generate costs about what a call's HTTP does, so this is the gateway's worst
  case; `per_call_ms` says what a call costs outside the model (the openai SDK's side and the gateway's).

Training: `agentrl train --agent examples/agent/calc_agent.py:solve --agent.demos DEMOS` (the README's
command) for several seeds of grpo and one of turn-ppo; held-out pass rate before and after.

    python benchmarks/gateway.py            # 5 tiny / 3 SmolLM2 rounds; 3 grpo seeds x 30 updates, turn-ppo x 30
    python benchmarks/gateway.py --quick    # 2 tiny / 1 SmolLM2 round; 1 grpo seed x 8 updates (~5 minutes)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "agent"))

from calc_agent import TOOLS, tasks  # noqa: E402

from agentrl.config import AgentConfig, SamplingConfig, SFTConfig, TinyModelConfig, TrainConfig  # noqa: E402
from agentrl.core import AgentEnv  # noqa: E402
from agentrl.engines.torch import for_policy  # noqa: E402
from agentrl.gateway import Agent, AgentRunner  # noqa: E402
from agentrl.policy import Policy  # noqa: E402
from agentrl.rollout import rollout  # noqa: E402
from agentrl.stages.warm_start import warm_start_from_data  # noqa: E402

AGENT = str(ROOT / "examples" / "agent" / "calc_agent.py")


class CalcEnv(AgentEnv):
    """calc_agent's task as an env: the same tool and prompt; a turn without a tool call is the final answer."""

    max_turns = 4

    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    tools = [add]

    def tool_schemas(self):
        return TOOLS  # the agent's own schema, so that both prompts are the same text

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task, self.final = tasks(seed), None
        return self.task["question"], {}

    def step(self, action):
        calls = self.tool_format.parse(action, TOOLS)  # the gateway hands the agent only well-formed calls
        self.final = None if any(c.error is None for c in calls) else action.strip()
        return super().step(action)

    def is_terminal(self):
        return self.final is not None

    def verify(self):
        return float(self.final == str(self.task["answer"]))


def speed(policy: Policy, rounds: int, episodes: int, max_new_tokens: int = 48) -> dict:
    chat = policy.chat
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    agent = Agent(AgentConfig(entry=f"{AGENT}:solve"))
    seeds = list(range(episodes))
    out = {"gateway": [], "native": []}
    tokens = {"gateway": [], "native": []}
    turns = {"gateway": [], "native": []}
    in_flight, breaks = 0.0, []
    with AgentRunner(agent) as runner:
        def gateway_round() -> tuple[float, list]:
            t0 = time.perf_counter()
            eps, stats = runner.rollout(for_policy(policy, sampling, seed=1), chat, seeds, max_context=2048)
            nonlocal in_flight
            in_flight = max(in_flight, stats.extra["gateway/sessions_in_flight_max"])
            breaks.append(stats.extra["gateway/prefix_break_rate"])
            return time.perf_counter() - t0, eps

        def native_round() -> tuple[float, list]:
            envs = [CalcEnv() for _ in seeds]
            t0 = time.perf_counter()
            eps, _ = rollout(envs, seeds, for_policy(policy, sampling, seed=1), chat, max_context=2048,
                             max_new_tokens=sampling.max_new_tokens)
            return time.perf_counter() - t0, eps

        gateway_round(), native_round()  # warm-up: first calls of each path are cold
        for r in range(rounds):
            for name, fn in (("gateway", gateway_round), ("native", native_round))[:: 1 if r % 2 == 0 else -1]:
                seconds, eps = fn()
                assert not any(e.error for e in eps), [e.error for e in eps if e.error][:1]
                out[name].append(len(eps) / seconds)
                tokens[name].append(sum(e.num_action_tokens for e in eps))
                turns[name].append(sum(e.num_turns for e in eps))
                print(f"  round {r}: {name} {len(eps) / seconds:.1f} episodes/s "
                      f"({tokens[name][-1]} action tokens, {turns[name][-1]} turns)", flush=True)
    ratios = [g / n for g, n in zip(out["gateway"], out["native"])]
    return {"episodes_per_s": {k: round(statistics.median(v), 2) for k, v in out.items()},
            "paired_ratios": [round(x, 3) for x in ratios], "ratio": round(statistics.median(ratios), 3),
            "action_tokens": {k: sum(v) for k, v in tokens.items()}, "turns": {k: sum(v) for k, v in turns.items()},
            "tokens_within": round(abs(sum(tokens["gateway"]) / sum(tokens["native"]) - 1), 3),
            "sessions_in_flight": int(in_flight), "prefix_break_rate": max(breaks), "episodes_per_round": episodes}


def per_call_costs(policy: Policy, calls: int = 200) -> dict:
    """CPU milliseconds one call costs outside the model, measured alone with a scripted engine: the openai SDK's
    request and response (the agent's side) and the gateway's (HTTP, checks, the template, the reply)."""
    import httpx
    import openai

    from agentrl.config import GatewayConfig
    from agentrl.engines.base import Generation
    from agentrl.gateway import Gateway
    from agentrl.gateway.server import Server, build_app

    chat = policy.chat
    ids = chat.action_ids("42")

    class Fixed:  # an engine that answers at once: what is left is the call's own cost
        sampling = None

        def open(self, prompts):
            class S:
                turn_level, started = True, []

                def add(self, rows, prompts): ...
                def extend(self, chunks, rows=None): ...
                def drop(self, rows): ...

                def start(self, rows):
                    self.started = list(rows)

                def collect(self):
                    return [(r, Generation(ids, [0.0] * len(ids), "eos")) for r in self.started]
            return S()

    gw = Gateway(GatewayConfig(batch_wait=0.0))
    gw.open_rollout(Fixed(), chat, max_context=2048)
    server = Server(build_app(gw)).start()
    http = httpx.Client()
    messages = [{"role": "user", "content": tasks(0)["question"]}]
    body = json.dumps({"messages": messages, "tools": TOOLS})
    headers = {"authorization": f"Bearer {gw.token}", "content-type": "application/json"}

    def raw() -> None:
        http.post(f"{server.url}/sessions/{gw.open_session(group_id=0, task_id='t')}/v1/chat/completions",
                  content=body, headers=headers)

    def sdk() -> None:
        name = gw.open_session(group_id=0, task_id="t")
        client = openai.OpenAI(base_url=f"{server.url}/sessions/{name}/v1", api_key=gw.token, max_retries=0,
                               http_client=http)
        client.chat.completions.create(model="p", messages=messages, tools=TOOLS)

    out = {}
    for name, fn in (("raw_http", raw), ("openai_sdk", sdk)):
        for _ in range(20):
            fn()
        c0 = time.process_time()
        for _ in range(calls):
            fn()
        out[name] = round((time.process_time() - c0) / calls * 1000, 2)
    server.stop()
    gw.close()
    return out


def train_run(demos: Path, algo: str, seed: int, updates: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "agentrl", "train", "--agent", f"{AGENT}:solve", "--agent.demos", str(demos),
           "--algo", algo, "--seed", str(seed), "--updates", str(updates), "--eval.every", "0", "--out", str(out),
           "--overwrite"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    breaks = [r["gateway/prefix_break_rate"] for r in rows if "gateway/prefix_break_rate" in r]
    run = {"algo": algo, "seed": seed, "updates": updates, "warm_start_pass_rate": summary["warm_start_pass_rate"],
           "final_pass_rate": summary["final_pass_rate"], "eval_episodes": summary["eval_episodes"],
           "prefix_break_rate_max": max(breaks), "seconds": round(time.perf_counter() - t0, 1)}
    print(f"  {algo} seed {seed}: {run['warm_start_pass_rate']:.3f} -> {run['final_pass_rate']:.3f} "
          f"({run['seconds']:.0f} s)", flush=True)
    return run


def main() -> None:
    ap = benchlib.parser(__doc__, quick="2 speed rounds, one grpo run of 8 updates")
    args = ap.parse_args()
    rounds, seeds, updates = (2, [0], 8) if args.quick else (5, [0, 1, 2], 30)
    work = Path(tempfile.mkdtemp(prefix="agentrl-gateway-bench-"))
    demos = work / "demos.jsonl"
    subprocess.run([sys.executable, str(ROOT / "examples/agent/write_demos.py"), "--out", str(demos)], check=True)
    cfg = TrainConfig(agent={"entry": f"{AGENT}:solve", "demos": str(demos)})
    folder = warm_start_from_data(demos, TinyModelConfig(), SFTConfig(), cfg.seed)
    print("speed, the tiny policy (the README's): 64 episodes a round, gateway vs native rollout", flush=True)
    tiny = speed(Policy.load(folder), rounds, 64)
    print(f"tiny: ratio {tiny['ratio']:.3f} (gateway {tiny['episodes_per_s']['gateway']} vs native "
          f"{tiny['episodes_per_s']['native']} episodes/s)", flush=True)
    tiny["per_call_ms"] = per_call_costs(Policy.load(folder))
    print(f"  per call, CPU: {tiny['per_call_ms']}", flush=True)
    try:
        from agentrl.models import ModelFetchError, fetch

        smol_dir = fetch("smollm2-135m-instruct")
    except (ImportError, ModelFetchError) as e:
        smol, why = None, f"SmolLM2-135M-Instruct could not be fetched here: {e}"
        print(why, flush=True)
    else:
        print("speed, SmolLM2-135M-Instruct: 32 episodes a round, 32-token actions", flush=True)
        smol = speed(Policy.load(smol_dir), max(1, rounds - 2), 32, max_new_tokens=32)
        print(f"smollm2: ratio {smol['ratio']:.3f} (gateway {smol['episodes_per_s']['gateway']} vs native "
              f"{smol['episodes_per_s']['native']} episodes/s)", flush=True)
    headline = smol or tiny
    fast = {"ratio": headline["ratio"], "ratio_model": "smollm2-135m-instruct" if smol else "tiny",
            "sessions_in_flight": headline["sessions_in_flight"],
            "prefix_break_rate": max(tiny["prefix_break_rate"], (smol or tiny)["prefix_break_rate"]),
            "tiny": tiny, "smollm2": smol if smol else {"skipped": why}}
    print("training through the gateway", flush=True)
    runs = [train_run(demos, "grpo", s, updates, work / f"grpo-{s}") for s in seeds]
    if not args.quick:
        runs.append(train_run(demos, "turn-ppo", 0, updates, work / "turn-ppo-0"))
    grpo = [r for r in runs if r["algo"] == "grpo"]
    gains = [r["final_pass_rate"] - r["warm_start_pass_rate"] for r in grpo]
    finals = [r["final_pass_rate"] for r in grpo]
    result = {**fast, "runs": runs, "grpo_gain_mean": round(statistics.mean(gains), 3),
              "grpo_final_spread": round(max(finals) - min(finals), 3), "quick": bool(args.quick)}
    benchlib.report("gateway", result, quick=args.quick)


if __name__ == "__main__":
    main()
