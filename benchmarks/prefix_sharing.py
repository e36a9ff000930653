"""One prefill per group on a real model: the torch engine's rollout with `rollout.share_prefill` on and off.

    python benchmarks/prefix_sharing.py            # SmolLM2-135M-Instruct, 4 groups x 8, 3 runs per arm (~6 min)
    python benchmarks/prefix_sharing.py --quick    # 2 groups x 4, 1 run per arm (~1 min)

The task is vs_trl.py's one-turn Arithmetic under the model's own template: agentrl writes the tool schemas and
the call format into the system prompt, so a prompt is ~190 tokens of which the question is a few. A GRPO group's
G rows start from one prompt. With sharing, each distinct prompt (all but its last token) runs through the model
once and its keys and values are copied to its rows, and the system prompt common to all groups runs once;
without, every row's prompt runs (what HF `generate` does, and TRL with it).

Measured, arms alternating (on, off, on, ...) so that both see the same load: the rollout's wall seconds (median
of the runs), the prompt tokens each arm ran through the model and those sharing skipped (the engine's counts,
checked against the prompts' lengths), and the sampled tokens of the two arms compared episode by episode (every
row samples from its own stream, so they are the same up to a last-bit flip: `flipped`, as tool_latency.py counts
them). `ratio` = seconds without sharing / seconds with.

The bound: only the prefill can get cheaper. The unshared arm's prefill is measured apart (the same rollout with
one new token: prefill plus one sample), and `bound` = T_off / (T_off - prefill_off x saved / prompt tokens): the
ratio if the skipped tokens' share of the prefill were the whole saving and copying the keys cost nothing.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from benchlib import parser, report  # noqa: E402
from tool_latency import flipped  # noqa: E402
from vs_trl import OneTurnArithmetic  # noqa: E402

from agentrl.engines import SamplingConfig, TorchEngine  # noqa: E402
from agentrl.policy import Policy  # noqa: E402
from agentrl.rollout import rollout  # noqa: E402


def run(policy: Policy, seeds: list[int], share: bool, max_new: int) -> tuple[float, list[list[int]], object]:
    chat = policy.chat
    engine = TorchEngine(policy.model, SamplingConfig(temperature=1.0, max_new_tokens=max_new), chat.stop_ids,
                         chat.eos_id, chat.pad_id, seed=11)
    engine.share_prefill = share
    envs = [OneTurnArithmetic() for _ in seeds]
    t0 = time.perf_counter()
    episodes, stats = rollout(envs, seeds, engine, chat, workers="serial", schedule="lockstep")
    return time.perf_counter() - t0, [e.token_ids() for e in episodes], stats


def main() -> None:
    ap = parser(__doc__, quick="2 groups x 4, 1 run per arm")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3, help="timed rollouts per arm (after one warm-up of each)")
    a = ap.parse_args()
    if a.quick:
        a.groups, a.group_size, a.runs = 2, 4, 1
    torch.set_num_threads(torch.get_num_threads())
    policy = Policy.load(a.model)
    seeds = [100 + g for g in range(a.groups) for _ in range(a.group_size)]
    for share in (True, False):  # warm-up: the first forwards pay for allocation and kernel choice
        run(policy, seeds[: a.group_size], share, 2)
    times: dict[bool, list[float]] = {True: [], False: []}
    tokens, stats = {}, {}
    for _ in range(a.runs):
        for share in (True, False):
            seconds, tokens[share], stats[share] = run(policy, seeds, share, a.max_new_tokens)
            times[share].append(seconds)
    prefill_off = statistics.median(run(policy, seeds, False, 1)[0] for _ in range(a.runs))
    on, off = stats[True], stats[False]
    total = off.prefill_tokens
    if on.prefill_tokens + on.prefill_tokens_saved != total or off.prefill_tokens_saved:
        raise SystemExit(f"prefill counts disagree: on {on.prefill_tokens}+{on.prefill_tokens_saved}, off {total}")
    flips = flipped(tokens[True], tokens[False])
    t_on, t_off = statistics.median(times[True]), statistics.median(times[False])
    bound = t_off / max(t_off - prefill_off * on.prefill_tokens_saved / total, 1e-9)
    ratio = t_off / t_on
    print(f"{a.model}: {a.groups} groups x {a.group_size} rows, one turn of up to {a.max_new_tokens} tokens, "
          f"{a.runs} run(s) per arm")
    print(f"  prompt tokens run: {total} without sharing, {on.prefill_tokens} with ({on.prefill_tokens_saved} saved, "
          f"{on.prefill_tokens_saved / total:.0%})")
    print(f"  rollout seconds: {t_off:.2f} without, {t_on:.2f} with -> {ratio:.2f}x; the unshared prefill alone "
          f"{prefill_off:.2f} s, so the bound is {bound:.2f}x ({(ratio - 1) / (bound - 1):.0%} of the possible gain)"
          if bound > 1 else f"  rollout seconds: {t_off:.2f} without, {t_on:.2f} with -> {ratio:.2f}x")
    print(f"  episodes whose tokens differ between the arms: {flips} of {len(seeds)}")
    report("prefix_sharing", {
        "model": a.model, "groups": a.groups, "group_size": a.group_size, "max_new_tokens": a.max_new_tokens,
        "runs": a.runs, "ratio": round(ratio, 3), "bound": round(bound, 3),
        "fraction_of_bound": round((ratio - 1) / (bound - 1), 3) if bound > 1 else None,
        "seconds_shared": [round(x, 3) for x in times[True]], "seconds_unshared": [round(x, 3) for x in times[False]],
        "prefill_only_unshared_s": round(prefill_off, 3),
        "prefill_tokens_unshared": total, "prefill_tokens_shared": on.prefill_tokens,
        "prefill_tokens_saved": on.prefill_tokens_saved, "episodes": len(seeds), "episodes_flipped": flips,
        "samples_unchanged": flips == 0,
    }, quick=a.quick)


if __name__ == "__main__":
    main()
