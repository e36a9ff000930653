"""Code-v0 rollouts with the real sandbox: concurrent environment steps against the serial loop.

Every `run_tests` and `submit` of Code-v0 starts a sandboxed judge and candidate (~0.1 s of mostly
waiting on subprocesses), so a rollout of Code-v0 is tool-bound. The policy is the scripted expert
(noisy, so that episodes mix test runs, wrong submissions and right ones): the model is not what is
measured here, the environment steps are. Both arms roll out the same seeds; their episodes
(tokens, rewards, turns) must be equal, which is checked.

    python benchmarks/code_rollout.py                    # 48 episodes, 3 repeats, the sandbox's fork server on
    python benchmarks/code_rollout.py --fork-server off  # every run starts fresh interpreters (the A/B)
    python benchmarks/code_rollout.py --quick            # 16 episodes, 1 repeat

Last line: one JSON object; `ratio` is concurrent / serial episodes per second (the issue asks
>= 1.7 on 2 cores). Both arms' CPU seconds are recorded too, in this process and in the sandbox
processes (those a fork server forked count through the server), and `cpu_bound_ratio`: the serial
wall time over the concurrent arm's CPU work spread over every core, the most any schedule could
reach here (with `loadavg`: other jobs' load lowers both). Also written to
benchmarks/results/code_rollout.json (`code_rollout_fork_server_off.json` for `--fork-server off`).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # per-file bars for a few-MB model are noise here

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402

from agentrl.chat.layout import ChatFormat  # noqa: E402
from agentrl.config import TinyModelConfig  # noqa: E402
from agentrl.engines import ScriptedEngine  # noqa: E402
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make  # noqa: E402
from agentrl.rollout import rollout  # noqa: E402
from agentrl.stages.sft import expert_texts  # noqa: E402
from agentrl.verify.sandbox import LocalSandbox, fork_server_cpu_seconds  # noqa: E402


def run(chat: ChatFormat, seeds: list[int], workers: str, noise: float,
        sandbox: LocalSandbox) -> tuple[float, list[tuple], float, float]:
    """Wall seconds, the episodes, and CPU seconds of this process and of the sandbox processes."""
    envs = [make("agentrl/Code-v0", sandbox=sandbox) for _ in seeds]
    # the expert's slips draw from each env's own seeded generator, so both arms play the same actions
    engine = ScriptedEngine(lambda row: chat.action_ids(envs[row].expert_action(noise)), chat.eos_id)
    c0, s0, t0 = os.times(), fork_server_cpu_seconds(), time.perf_counter()
    episodes, _ = rollout(envs, seeds, engine, chat, workers=workers)
    seconds, c1, s1 = time.perf_counter() - t0, os.times(), fork_server_cpu_seconds()
    errored = [e for e in episodes if e.error]
    assert not errored, errored[0].error
    # a fresh launcher is waited for by us, so its CPU shows in our children's; one a fork server forked is
    # reaped by the server (before the run returns), so its CPU shows in the server's children's
    own = c1.user - c0.user + c1.system - c0.system
    children = c1.children_user - c0.children_user + c1.children_system - c0.children_system + s1 - s0
    return seconds, [(e.token_ids(), e.reward, e.num_turns) for e in episodes], own, children


def main() -> None:
    ap = parser(__doc__, quick="16 episodes, 1 repeat")
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--noise", type=float, default=0.5, help="the expert's slip rate (mixes test runs and retries)")
    ap.add_argument("--workers", default="thread:64", help="the concurrent arm's rollout.env_workers")
    ap.add_argument("--fork-server", choices=["on", "off"], default="on",
                    help="the sandbox's fork server (off: every run starts fresh interpreters, as before it)")
    ap.add_argument("--out", default="/tmp/agentrl-bench-code-rollout")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.repeats = 16, 1

    build_tiny_policy(expert_texts(make("agentrl/Code-v0"), range(40), noise=0.3), args.out,
                      TinyModelConfig(vocab_size=2048), seed=0)
    chat = Policy.load(args.out).chat
    seeds = list(range(args.episodes))
    sandbox = LocalSandbox(require_isolation=True, fork_server=args.fork_server == "on")
    run(chat, seeds[:4], args.workers, args.noise, sandbox)  # warm-up: imports, the first sandbox start

    serial_s, concurrent_s, cpu, serial_cpu = [], [], [], []
    for _ in range(args.repeats):
        s, ref, s_own, s_children = run(chat, seeds, "serial", args.noise, sandbox)
        c, got, own, children = run(chat, seeds, args.workers, args.noise, sandbox)
        assert got == ref, "concurrent steps changed the episodes"
        serial_s.append(s)
        concurrent_s.append(c)
        cpu.append((own, children))
        serial_cpu.append((s_own, s_children))
    s, c = statistics.median(serial_s), statistics.median(concurrent_s)
    own, children = (statistics.median(x) for x in zip(*cpu))
    s_own, s_children = (statistics.median(x) for x in zip(*serial_cpu))
    cores = len(os.sched_getaffinity(0))
    # the most any schedule could get from these cores: the serial wall time over the time the
    # concurrent arm's CPU work needs with every core busy
    bound = s / ((own + children) / cores)
    turns = sum(t for _, _, t in ref)
    ratio = s / c
    print(f"{args.episodes} Code-v0 episodes ({turns} turns, pass rate {sum(r for _, r, _ in ref) / len(ref):.2f}): "
          f"serial {s:.2f} s = {args.episodes / s:.1f} episodes/s, {args.workers} {c:.2f} s = {args.episodes / c:.1f} "
          f"episodes/s -> {ratio:.2f}x")
    result = {"benchmark": "code_rollout", "episodes": args.episodes, "turns": turns, "repeats": args.repeats,
              "noise": args.noise, "workers": args.workers, "cpus": os.cpu_count(), "quick": args.quick,
              "fork_server": args.fork_server, "fork_server_used": sandbox.fork_server,
              "serial_s": round(s, 3), "concurrent_s": round(c, 3),
              "serial_episodes_per_s": round(args.episodes / s, 2),
              "concurrent_episodes_per_s": round(args.episodes / c, 2),
              "loadavg": [round(x, 2) for x in os.getloadavg()], "cores": cores,
              "concurrent_cpu_s": {"rollout_process": round(own, 3), "sandbox_processes": round(children, 3)},
              "serial_cpu_s": {"rollout_process": round(s_own, 3), "sandbox_processes": round(s_children, 3)},
              "sandbox_cpu_ms_per_episode": round(1000 * children / args.episodes, 1),
              "sandbox_cpu_ms_per_turn": round(1000 * children / turns, 1),
              "cpu_bound_ratio": round(bound, 2), "ratio": round(ratio, 2)}
    print(f"serial arm CPU: {s_own:.2f} s in the rollout process, {s_children:.2f} s in sandbox processes "
          f"({1000 * s_children / turns:.0f} ms a turn)")
    print(f"concurrent arm CPU: {own:.2f} s in the rollout process, {children:.2f} s in sandbox processes "
          f"({1000 * children / turns:.0f} ms a turn); {cores} cores allow at most {bound:.2f}x")
    # the A/B's other arm has a file of its own; a quick run goes beside either, never over it
    report("code_rollout" if args.fork_server == "on" else "code_rollout_fork_server_off", result, args.quick)


if __name__ == "__main__":
    main()
