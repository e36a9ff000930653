"""The recipe on a real model (issue 50, item 3): SmolLM2-135M-Instruct, SFT -> DPO -> RL and its ablations, on
two external task families, held-out pass@1 by each benchmark's own scorer after every stage.

    python benchmarks/recipe_real.py --plan                 # every run's size and ETA, then stop
    python benchmarks/recipe_real.py                        # the whole benchmark (hours: see --plan)
    python benchmarks/recipe_real.py --families rg-chain --arms sft sft+rl --seeds 0
    python benchmarks/recipe_real.py --quick                # the whole path on the tiny policy, a few minutes

The families, and why these two:

- `bfcl`: BFCL's multi-turn base category (`agentrl/BFCL-v0`), scored by BFCL's own `multi_turn_checker` (the
  env's verifier: 1 when it says valid). Demonstrations are BFCL's ground-truth calls (the env's expert plays
  them, with its slips). The env runs with ``functions=path`` (only the functions an entry's solution uses) and
  ``steps_per_turn=5``, as bfcl_smollm2.py does: BFCL's full prompts (9,000-21,000 characters of schemas) are
  long for a 135M model; this is BFCL's data and checker, not its leaderboard prompt. Train split: 160 entries,
  held out: the 40 BFCL-v0 declares (docs/evaluation.md, "Splits that mean unseen"). The untouched model scores
  0 here (bfcl_smollm2.json), and SFT on 64 ground-truth demonstrations x 2 epochs left it there (0 of 24 held
  out, loss 0.47 after 16 steps: recipe_real_bfcl_seed0_sft.json).
- `rg-chain`: reasoning-gym's chain_sum worked one operation a turn with a calculator (`agentrl/RG-Chain-v0`,
  4 terms: 3 calculator calls and an answer, 5 turns allowed), scored by reasoning-gym's `score_answer` (a pass
  at 1.0). Chosen over TextWorld because its episodes are short in tokens (a calculator call is ~20 tokens,
  where a TextWorld observation is a room's description), so 3 seeds x 4 arms fit these 2 cores; and over the
  other reasoning-gym envs because it is multi-step by construction (the number of terms sets the turns) and
  the horizon sweep already measured it (horizon_sweep_rg_chain.json).
- `textworld` (not in the default: name it): generated TextWorld games (`agentrl/TextWorld-v0`, quest length 2,
  3 rooms, 5 objects), 64 games a split from TextWorld's own seeds (held out: the pool from 2**31), scored by the
  game's own state (won is a pass). The stand-in the issue asks for should BFCL not leave 0 after SFT at this
  model size: its expert's episodes are short (~430 tokens, 2 turns). The policy's are not: a failing one runs to
  the 6-turn limit, and DPO (8 pairs a step) and RL (16,384 tokens a micro-batch) on them each outgrew 24 GB until
  both were bounded by the model's shape (`dpo.max_batch_tokens`, `optim.micro_batch_tokens`). Measured here: SFT
  ~14 min, DPO ~8 min, an RL update ~70 s.

The turn-level assigners (`turn-ppo`, `gigpo`) run against grpo on the longer family that trains, with the same budget
(updates, groups, group size) from the same DPO model. BFCL is the longest (its expert plays 7.2 policy turns an
episode on the train split, 6.4 on eval, up to 10), but it does not leave 0 after SFT, so no assigner has a pass to
credit there. Of the two that train, RG-Chain is the longer: its expert plays 4 turns (3 calculator calls and an
answer), TextWorld's 2 at quest length 2. So the turn-level arm runs on RG-Chain.

The arms, per family and seed (the same seeds in every arm):

- `sft`: SFT on the expert's demonstrations (PRETRAINED's measured settings: 128 x 2 epochs, full fine-tuning
  at lr 1e-4), then held out. One SFT per (family, seed), shared by every arm of that seed (cached in its folder).
- `sft+rl`: that SFT model, then grpo (LoRA r16, PRETRAINED's rates) for `--budget` episodes.
- `sft+dpo+rl`: that SFT model, then DPO on pairs from its own rollouts (a passing against a failing episode of
  one task), then grpo; DPO's rollouts count against the same `--budget`, a quarter of it (as
  recipe_ablation.py splits it), so every RL arm samples the same number of episodes after SFT.
- `sft+dpo+rl:turn-ppo` (the longer family only): as `sft+dpo+rl`, turn-ppo in grpo's place, the DPO model shared.
  Its critic warms up before the policy moves (up to 5 critic-only updates, `credit.warmup_updates`), and at this
  budget (6 updates) that is most of the run: the JSON counts them (`critic_only`, `rl_health.updates_critic_only`).
- `sft+dpo+rl:gigpo` (the longer family only): the critic-free turn-level assigner in grpo's place, its step
  groups from RG-Chain's `state_key` (the partial sums reached), so every update moves the policy.

DPO, not SimPO: the pairs are few (a quarter of the budget, and only groups that hold a pass and a fail make
one), and DPO's frozen reference keeps a model tuned on so few pairs near the SFT model it starts from; SimPO has
no reference and its length normalisation pays off on long free-text answers, not on tool calls. DPO's learning
rate for a full fine-tune of a 135M model, 5e-6, is not measured (the tiny policy's 5e-4 is far too high for a
pretrained model); the JSON records it.

What each run records (`benchmarks/results/recipe_real.json`, written after every run so a kill keeps the finished
ones): its family, arm and seed; the held-out `pass_at_1` after every stage (`base`, the untouched model, once per
family; `sft`; `dpo`; `rl`), each the mean pass of `eval_episodes` held-out episodes sampled at temperature 1.0
(the unbiased pass@1 at that temperature), with its standard error; the number of held-out and of train tasks
(the split's pool); the scorer; seconds per stage (a shared stage's seconds count in every arm that uses it);
entropy and KL per RL update (metrics.jsonl's `train/entropy`, `train/kl`); and the alarms that fired
(`health/reasons`, by the names in agentrl.health.alarms.ALARMS). Per (family, arm): mean and standard error
over seeds of every stage's pass@1.

Baseline and `ratio`: `ratio` is the mean final held-out pass@1 of `sft+dpo+rl` over that of `sft`, over every
family and seed that ran both: the whole recipe against its first stage, measured in the same run on the same
held-out tasks. Not over the untouched model: it scores 0 on BFCL, and a ratio over 0 says nothing. None when
`sft` scores 0 everywhere.

Sizing (`--plan`): every run's demonstrations, DPO and RL episodes and evaluations, and an ETA from measured rates:
decode at batch 8 and the prefill rate from decode_bound.json (`decode.8.tokens_per_s`; `matmul.peak_gflop_s`
over `decode.1.step_gflop`), SFT's tokens/s from real_model.json; token counts per episode estimated from the
expert's episodes on 8 train tasks (3.5 characters a token; the policy's actions taken at twice the expert's
length, capped at `max_new_tokens`). Shared stages (SFT, DPO, the base evaluation) are counted once, in the first
run that needs them. The defaults keep every run well under three hours on 2 cores.

    nice -n 19 python benchmarks/recipe_real.py --quick     # JSON to results/recipe_real_quick.json

`--quick` (the tiny policy, seed 0, 32 demonstrations x 1 epoch, 8 episodes after SFT, 4 held out) ran every arm
of both families in 265 s at load ~4 (recipe_real_quick.json, not committed: results/*_quick.json are ignored).
It proves the path, not the stages' insides: the tiny policy scored 0 everywhere, so DPO found no pairs (the row
says "skipped: no pairs") and every RL update had all-zero advantages (entropy and KL None: no gradient step).
A sizing measurement on SmolLM2 (the untouched model's held-out evaluation of 8 BFCL eval tasks) did not finish
in 900 s under `nice -n 19` while another benchmark held both cores (the process got ~8% of a CPU): measured
under load, it bounds nothing about a quiet machine, and the plan's rates stay decode_bound.json's.

Last line: one JSON object with `ratio` (the whole result is in the JSON file).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, parser, report, save  # noqa: E402

MODEL = "smollm2-135m-instruct"
NAME = "recipe_real"
CHARS_PER_TOKEN = 3.5  # BPE on English and JSON; the plan's token counts are estimates, its rates measurements


@dataclass(frozen=True)
class Family:
    env_id: str
    kwargs: dict[str, Any]
    scorer: str
    longer: bool  # the turn-level assigner runs here
    sft_episodes: int  # demonstrations (PRETRAINED's 128 where the episodes are short)
    budget: int  # episodes each RL arm samples after SFT
    tiny_context: int = 1024  # the tiny policy's context in --quick (its characters-as-tokens prompts)


FAMILIES: dict[str, Family] = {
    "bfcl": Family("agentrl/BFCL-v0", {"category": "base", "functions": "path", "steps_per_turn": 5},
                   "BFCL multi_turn_checker (the env's verdict: valid is a pass)", longer=False, sft_episodes=64,
                   budget=48, tiny_context=4096),
    "rg-chain": Family("agentrl/RG-Chain-v0", {"difficulty": 4, "slack": 1},
                       "reasoning-gym chain_sum score_answer (a pass at 1.0)", longer=True, sft_episodes=128,
                       budget=64),
    # the stand-in, should BFCL not leave 0 after SFT: generated games, 64 a split (TextWorld's own seeds, the
    # held-out pool 2**31 on), scored by the game itself (won is a pass)
    "textworld": Family("agentrl/TextWorld-v0", {"quest_length": 2, "rooms": 3, "objects": 5, "games": 64},
                        "TextWorld's game state (won is a pass)", longer=False, sft_episodes=128, budget=64),
}
ARMS = ("sft", "sft+rl", "sft+dpo+rl", "sft+dpo+rl:turn-ppo", "sft+dpo+rl:gigpo")


def arms_of(family: str) -> list[str]:
    """The arms a family runs: the turn-level ones (an assigner named after ":") only on the longer family."""
    return [a for a in ARMS if ":" not in a or FAMILIES[family].longer]


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__, quick="the whole path on the tiny policy (no --model), a few episodes a stage: minutes")
    ap.add_argument("--plan", action="store_true", help="print every run's size and ETA, then stop")
    ap.add_argument("--families", nargs="+", choices=list(FAMILIES), default=["bfcl", "rg-chain"],
                    help="default bfcl rg-chain; textworld is the stand-in for a family that cannot leave 0")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2; --quick 0")
    ap.add_argument("--budget", type=int, default=None,
                    help="episodes each RL arm samples after SFT (default: the family's, bfcl 48, rg-chain 64; "
                         "--quick 8)")
    ap.add_argument("--eval-episodes", type=int, default=None,
                    help="held-out episodes per evaluation (default 24, PRETRAINED's; --quick 4)")
    ap.add_argument("--sft-episodes", type=int, default=None,
                    help="demonstrations (default: the family's, bfcl 64, rg-chain 128; --quick 32)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="per action (default 160, bfcl_smollm2.py's; --quick 48: the untrained tiny policy writes to "
                         "the cap every turn)")
    ap.add_argument("--dpo-lr", type=float, default=5e-6)
    ap.add_argument("--no-base", action="store_true", help="skip the untouched model's held-out evaluation")
    ap.add_argument("--out", default="runs/recipe-real", help="run folders (SFT and DPO models cached here)")
    ap.add_argument("--json", default=None, help="result file (default results/recipe_real[_quick].json)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                    help="run nothing: combine the runs of these result files (slices run apart, e.g. one family or "
                         "seed at a time) into one result, a later file's (family, arm, seed) replacing an earlier's")
    return ap


def sized(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the size defaults that depend on --quick."""
    quick = getattr(args, "quick", False)
    if args.eval_episodes is None:
        args.eval_episodes = 4 if quick else 24
    if args.seeds is None:
        args.seeds = [0] if quick else [0, 1, 2]
    if args.max_new_tokens is None:
        args.max_new_tokens = 48 if quick else 160
    for name, small in (("budget", 8), ("sft_episodes", 32)):
        if getattr(args, name) is None and quick:
            setattr(args, name, small)  # None: each family's own (Family.budget, Family.sft_episodes)
    args.group_size = 2 if quick else 4  # PRETRAINED's 2 x 4 episodes an update; --quick halves it
    args.groups = 2
    args.model = None if quick else MODEL
    return args


@dataclass
class RunConfig:
    """One (family, arm, seed): the configs of its stages. `sft` carries the env, the seed and the evaluation;
    `rl` is None for the `sft` arm, `dpo` None where there is no DPO stage."""

    family: str
    arm: str
    seed: int
    sft: Any  # TrainConfig
    dpo: Any  # DPOConfig | None
    rl: Any  # TrainConfig | None
    dpo_episodes: int = 0
    rl_episodes: int = 0
    notes: dict[str, Any] = field(default_factory=dict)


def config(args: argparse.Namespace, family: str, arm: str, seed: int) -> RunConfig:
    """The stage configs of one run, built and validated without running anything."""
    from agentrl.config import DPOConfig, TrainConfig, fit_pretrained

    fam = FAMILIES[family]
    per_update = args.groups * args.group_size
    budget = args.budget or fam.budget
    base: dict[str, Any] = {
        "env": {"id": fam.env_id, "kwargs": dict(fam.kwargs)}, "seed": seed, "model": args.model,
        "rollout": {"groups": args.groups, "group_size": args.group_size,
                    "sampling": {"max_new_tokens": args.max_new_tokens}},
        "eval": {"episodes": args.eval_episodes, "every": 0}, "checkpoint": {"every": 0},
        "sft": {"episodes": args.sft_episodes or fam.sft_episodes, "noise": 0.35},
    }
    if args.model is None:
        base["tiny"] = {"max_position_embeddings": fam.tiny_context}
        base["sft"]["epochs"] = 1  # --quick proves the path; the tiny policy learns nothing in one epoch of 32
    else:
        base["sft"].update({"epochs": 2, "batch_size": 8, "lr": 1e-4})  # PRETRAINED["sft"], named: not left to chance
    sft_cfg = TrainConfig(**{**base, "updates": 0})
    dpo_cfg, rl_cfg, dpo_eps, rl_eps = None, None, 0, 0
    if arm != "sft":
        with_dpo = "+dpo+" in arm
        # a quarter of the budget, in whole updates' worth, so that RL's share is whole updates and the arms match
        dpo_eps = max(per_update, budget // 4 // per_update * per_update) if with_dpo else 0
        if with_dpo:
            dpo_cfg = DPOConfig(loss="dpo", groups=dpo_eps // args.group_size, group_size=args.group_size,
                                **({"lr": args.dpo_lr, "batch_pairs": 8} if args.model else {}))
        updates = max(1, (budget - dpo_eps) // per_update)
        rl_eps = updates * per_update
        algo = arm.split(":", 1)[1] if ":" in arm else "grpo"
        data = {**base, "algo": algo, "updates": updates}
        rl_cfg = TrainConfig(**data)
        if args.model is not None:  # PRETRAINED["train"] in every field not set above (LoRA r16, lr 5e-5, ...)
            given = {"updates", "rollout.groups", "rollout.group_size", "eval.episodes", "eval.every"}
            rl_cfg, _ = fit_pretrained(rl_cfg, "train", given)
    return RunConfig(family, arm, seed, sft_cfg, dpo_cfg, rl_cfg, dpo_eps, rl_eps)


# -- the plan: sizes and an ETA from measured rates ------------------------------------------------------------


def measured_rates() -> dict[str, float]:
    """Decode (batch 8) and prefill tokens/s from decode_bound.json, SFT tokens/s from real_model.json."""
    dec = json.loads((RESULTS / "decode_bound.json").read_text())
    real = json.loads((RESULTS / "real_model.json").read_text())
    prefill = dec["matmul"]["peak_gflop_s"] / dec["decode"]["1"]["step_gflop"]
    return {"decode_tokens_per_s": dec["decode"]["8"]["tokens_per_s"], "prefill_tokens_per_s": round(prefill, 1),
            "sft_tokens_per_s": real["sft"][0]["sft_tokens_per_s"]}


def episode_tokens(family: str, max_new_tokens: int, tasks: int = 8) -> dict[str, float]:
    """The expert's episodes on `tasks` train tasks, in estimated tokens: the demonstration's length (prompt, tool
    schemas, actions, observations), and what a policy episode costs to roll out: the context read (prefill, the
    observations included) and the actions written (twice the expert's, capped at `max_new_tokens`)."""
    from agentrl.registry import make

    fam = FAMILIES[family]
    env = make(fam.env_id, **fam.kwargs)
    schema = len(json.dumps(env.tool_schemas())) + len(env.system_prompt or "")
    demo, context, written, turns = [], [], [], []
    for seed in range(tasks):
        obs, _ = env.reset(seed=seed)
        chars, acts, n = schema + len(obs), 0.0, 0
        while True:
            action = env.expert_action()
            obs, _, terminated, truncated, _ = env.step(action)
            n += 1
            acts += min(max_new_tokens, 2 * len(action) / CHARS_PER_TOKEN)
            chars += len(action) + len(obs)
            if terminated or truncated:
                break
        demo.append(chars / CHARS_PER_TOKEN)
        context.append(chars / CHARS_PER_TOKEN)
        written.append(acts)
        turns.append(n)
    env.close()
    return {"demo": statistics.mean(demo), "context": statistics.mean(context), "written": statistics.mean(written),
            "turns": statistics.mean(turns)}


def measured_stages(path: Path, eval_episodes: int) -> dict[str, dict[tuple[str, Any], float]]:
    """Per family, the median seconds its stages took in a finished result (`recipe_real.json`), keyed by stage
    and size: ("base", None), ("sft", (demonstrations, epochs)), ("dpo", episodes), each with its held-out
    evaluation, and ("rl_update", None): an RL stage's seconds over its updates, its final evaluation spread over
    them. Only runs at `eval_episodes` held out, so the evaluations match; {} without a result. The token
    estimate misses each turn's env step and prefill overheads (BFCL's untouched evaluation took 566 s where it
    said ~3 min), so a stage measured at the same size wins over it."""
    try:
        runs = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    seen: dict[str, dict[tuple[str, Any], list[float]]] = {}
    for r in runs:
        if r.get("heldout_episodes") != eval_episodes:
            continue
        fam, sft = seen.setdefault(r["family"], {}), r["settings"]["sft"]
        for st in r["stages"]:
            name, secs = st["stage"].split(" ")[0], st.get("seconds")
            if not secs or st.get("skipped"):
                continue
            key = {"base": ("base", None), "sft": ("sft", (sft["episodes"], sft["epochs"])),
                   "dpo": ("dpo", r["settings"]["dpo_episodes"])}.get(name)
            if name == "rl" and st.get("updates"):
                fam.setdefault(("rl_update", None), []).append(secs / st["updates"])
            elif key:
                fam.setdefault(key, []).append(secs)
    return {f: {k: statistics.median(v) for k, v in stages.items()} for f, stages in seen.items()}


def plan(args: argparse.Namespace, say: Callable[[str], None] = print,
         measured_from: Path = RESULTS / f"{NAME}.json") -> dict[str, Any]:
    """Every selected run's size and ETA; shared stages counted once. A stage that a finished result measured for
    this family at the same size (`measured_stages`) takes its median seconds; the others an estimate from tokens
    and measured rates. Returns the plan (also in the JSON)."""
    rates = measured_rates()
    measured = {} if args.model is None else measured_stages(measured_from, args.eval_episodes)
    rows, total = [], 0.0
    for family in args.families:
        tok = episode_tokens(family, args.max_new_tokens)
        known = measured.get(family, {})

        def rollout_s(episodes: int, tok: dict[str, float] = tok) -> float:
            return episodes * (tok["written"] / rates["decode_tokens_per_s"]
                               + tok["context"] / rates["prefill_tokens_per_s"])

        def eval_s(tok: dict[str, float] = tok) -> float:
            return rollout_s(args.eval_episodes, tok)

        shared_done: set[str] = set()
        if not args.no_base and args.model is not None:
            eta = known.get(("base", None), eval_s())
            total += eta
            rows.append({"family": family, "arm": "base", "seed": None, "eta_s": round(eta),
                         "measured": ("base", None) in known})
        for seed in args.seeds:
            for arm in [a for a in arms_of(family) if a in args.arms]:
                rc = config(args, family, arm, seed)
                eta, from_result = 0.0, True
                if f"sft{seed}" not in shared_done:
                    sft_tokens = tok["demo"] * rc.sft.sft.episodes * rc.sft.sft.epochs
                    key = ("sft", (rc.sft.sft.episodes, rc.sft.sft.epochs))
                    eta += known.get(key, sft_tokens / rates["sft_tokens_per_s"] + eval_s())
                    from_result &= key in known
                    shared_done.add(f"sft{seed}")
                if rc.dpo is not None and f"dpo{seed}" not in shared_done:
                    eta += known.get(("dpo", rc.dpo_episodes), rollout_s(rc.dpo_episodes) + eval_s() + 2 * tok["demo"]
                                     * rc.dpo_episodes / 2 * rc.dpo.epochs / rates["sft_tokens_per_s"])
                    from_result &= ("dpo", rc.dpo_episodes) in known
                    shared_done.add(f"dpo{seed}")
                if rc.rl is not None:  # rollouts, one update's forward and backward, the final evaluation
                    estimate = rollout_s(rc.rl_episodes) + rc.rl_episodes * tok["context"] / rates["sft_tokens_per_s"]
                    per_update = known.get(("rl_update", None))
                    eta += per_update * rc.rl.updates if per_update else estimate + eval_s()
                    from_result &= per_update is not None
                total += eta
                rows.append({"family": family, "arm": arm, "seed": seed, "sft_demos": rc.sft.sft.episodes,
                             "sft_epochs": rc.sft.sft.epochs, "dpo_episodes": rc.dpo_episodes,
                             "rl_updates": rc.rl.updates if rc.rl else 0, "rl_episodes": rc.rl_episodes,
                             "algo": rc.rl.algo if rc.rl else None, "eval_episodes": args.eval_episodes,
                             "eta_s": round(eta), "measured": from_result})
        say(f"{family}: expert episode ~{tok['demo']:.0f} tokens, {tok['turns']:.1f} turns; a policy episode "
            f"~{tok['written']:.0f} tokens written, ~{tok['context']:.0f} read")
    for r in rows:
        say(f"  {r['family']:9s} {r['arm']:22s} seed {r['seed']!s:4s} " + (
            f"sft {r['sft_demos']}x{r['sft_epochs']}, dpo {r['dpo_episodes']} ep, rl {r['rl_updates']} upd "
            f"({r['rl_episodes']} ep), eval {r['eval_episodes']} ep" if r["arm"] != "base" else
            f"the untouched model's held-out evaluation, {args.eval_episodes} ep") + f": ~{r['eta_s'] / 60:.0f} min"
            + ("" if r["measured"] else " (estimated)"))
    longest = max(r["eta_s"] for r in rows) / 60
    say(f"total ~{total / 3600:.1f} h on a quiet 2-core machine (the longest run ~{longest:.0f} min). Stages run "
        f"before take their measured seconds ({measured_from.name}); those marked (estimated) take tokens over "
        f"measured rates ({rates}), which miss each turn's overheads: on long episodes, low.")
    return {"rates": rates, "runs": rows, "total_s": round(total)}


# -- running ---------------------------------------------------------------------------------------------------


def stderr_of(p: float, n: int) -> float:
    """The standard error of a pass rate over n independent episodes."""
    return math.sqrt(p * (1 - p) / n) if n > 0 else float("nan")


def stage_row(stage: str, res: Any, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"stage": stage, "pass_at_1": res.pass_rate, "stderr": round(stderr_of(res.pass_rate, res.episodes), 4),
            "episodes": res.episodes, "turns_mean": res.turns_mean, "seconds": round(seconds, 1), **extra}


def cached(path: Path, make_row: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A shared stage's row, from `path` if a finished run wrote it, else made and written (last, after its model)."""
    if path.is_file():
        return {**json.loads(path.read_text()), "cached": True}
    row = make_row()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row, indent=1))
    return row


def held_out(cfg: Any, folder: str | Path) -> Any:
    from agentrl.evaluation import evaluate
    from agentrl.policy import Policy

    policy = Policy.load(folder)
    return evaluate(cfg, policy, None, getattr(policy.model.config, "max_position_embeddings", 2048))


def run_base(cfg: Any, out: Path) -> dict[str, Any]:
    def make_row() -> dict[str, Any]:
        t0 = time.perf_counter()
        res = held_out(cfg, cfg.model)  # Policy.load fetches a known model's name on first use
        return stage_row("base", res, time.perf_counter() - t0)

    return cached(out / "base.json", make_row)


def run_sft_stage(rc: RunConfig, folder: Path) -> dict[str, Any]:
    def make_row() -> dict[str, Any]:
        from agentrl.stages.pipeline import run_sft

        t0 = time.perf_counter()
        res, advice = run_sft(rc.sft, folder, say=lambda s: print(f"  {rc.family} seed {rc.seed}: {s}", flush=True))
        made = json.loads((folder / "warm_start.json").read_text()) if (folder / "warm_start.json").is_file() else {}
        return stage_row("sft", res, time.perf_counter() - t0, advice=advice, sft_loss=made.get("sft/loss"),
                         sft_steps=made.get("sft/steps"), demo_pass_rate=made.get("demo_pass_rate"))

    return cached(folder / "stage.json", make_row)


def run_dpo_stage(rc: RunConfig, start: Path, folder: Path) -> dict[str, Any]:
    """DPO on pairs from `start`'s own rollouts (pipeline.run_pipeline's stage two); with no pair, the row says so
    and the model is `start`'s (no `config.json` in `folder`)."""
    def make_row() -> dict[str, Any]:
        import copy

        from agentrl.policy import Policy
        from agentrl.stages.dpo import pairs_from_episodes, train_preferences
        from agentrl.stages.pipeline import collect_groups

        t0 = time.perf_counter()
        policy = Policy.load(start)
        episodes = collect_groups(rc.sft, policy, rc.dpo.groups, rc.dpo.group_size, rc.seed)
        pairs, counts = pairs_from_episodes(episodes, rc.dpo.max_pairs_per_group, rc.seed)
        rollout_pass = sum(e.passed for e in episodes) / len(episodes)
        if not pairs:  # as run_pipeline does: the table says so, and RL starts from the SFT model, unchanged
            return {"stage": "dpo (skipped: no pairs)", "skipped": True, "pairs": 0, "rollout_pass_rate": rollout_pass,
                    **counts, "seconds": round(time.perf_counter() - t0, 1)}
        reference = copy.deepcopy(policy.model).eval().requires_grad_(False)
        metrics = train_preferences(policy.model, reference, pairs, policy.chat.pad_id, rc.dpo, rc.seed)
        policy.save(folder)
        res = held_out(rc.sft, folder)
        return stage_row("dpo", res, time.perf_counter() - t0, pairs=len(pairs), rollout_pass_rate=rollout_pass,
                         **counts, dpo_loss=metrics.get("dpo/loss"), dpo_accuracy=metrics.get("dpo/accuracy"))

    folder.mkdir(parents=True, exist_ok=True)
    return cached(folder / "stage.json", make_row)


def rl_curves(folder: Path) -> dict[str, Any]:
    """Entropy and KL per update, and the alarms that fired (their names and first reasons), from metrics.jsonl."""
    from agentrl.report import read_metrics

    rows, _ = read_metrics(folder / "metrics.jsonl")
    updates = [r for r in rows if r.get("step", 0) > 0 and not r.get("final")]
    alarms: dict[str, str] = {}
    for r in rows:
        for reason in r.get("health/reasons") or []:
            alarms.setdefault(reason.split(":", 1)[0], reason)

    def curve(key: str) -> list[float | None]:  # None: an update with no gradient step (every advantage zero)
        return [round(r[key], 5) if isinstance(r.get(key), (int, float)) else None for r in updates]

    return {"steps": [r["step"] for r in updates], "entropy": curve("train/entropy"), "kl": curve("train/kl"),
            "rollout_pass_rate": [r.get("rollout/pass_rate") for r in updates], "alarms": alarms,
            "critic_only": [bool(r.get("credit/critic_warmup", 0.0) >= 1.0) for r in updates]}


def run_rl_stage(rc: RunConfig, start: Path, folder: Path, warm: dict[str, Any]) -> dict[str, Any]:
    from agentrl.evaluation import EvalResult
    from agentrl.trainer import Trainer

    t0 = time.perf_counter()
    cfg = rc.rl.model_copy(update={"model": str(start), "out": str(folder)})
    warm_res = EvalResult(warm["pass_at_1"], float("nan"), warm.get("turns_mean", float("nan")), warm["episodes"])
    summary = Trainer(cfg, overwrite=True).train(warm=warm_res)
    p, n = summary["final_pass_rate"], cfg.eval.episodes
    return {"stage": f"rl ({cfg.algo})", "pass_at_1": p, "stderr": round(stderr_of(p, n), 4), "episodes": n,
            "updates": cfg.updates, "seconds": round(time.perf_counter() - t0, 1), **rl_curves(folder)}


def pool_size(family: str, split: str) -> int:
    from agentrl.registry import make

    fam = FAMILIES[family]
    env = make(fam.env_id, **{**fam.kwargs, "split": split})
    try:
        return len(env.task_ids())
    finally:
        env.close()


def run_one(rc: RunConfig, out: Path, base: dict[str, Any] | None) -> dict[str, Any]:
    """One (family, arm, seed), its shared stages from the cache where an earlier arm ran them."""
    seed_dir = out / rc.family / f"seed{rc.seed}"
    stages = [base] if base else []
    sft = run_sft_stage(rc, seed_dir / "sft")
    stages.append(sft)
    start, warm = seed_dir / "sft", sft
    if rc.dpo is not None:
        dpo = run_dpo_stage(rc, start, seed_dir / "dpo")
        stages.append(dpo)
        if (seed_dir / "dpo" / "config.json").is_file():
            start, warm = seed_dir / "dpo", dpo
    if rc.rl is not None:
        stages.append(run_rl_stage(rc, start, seed_dir / rc.arm.replace("+", "_").replace(":", "_"), warm))
    return run_record(rc, stages)


def run_record(rc: RunConfig, stages: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's entry of the JSON: pass@1 after every stage, seconds per stage, curves and alarms."""
    # a skipped DPO stage left the SFT model as it was: its pass@1 is SFT's, and `dpo_skipped` says so
    pass_at_1 = {s["stage"].split(" ")[0]: s["pass_at_1"] for s in stages if "pass_at_1" in s}
    skipped = any(s.get("skipped") for s in stages)
    if skipped:
        pass_at_1["dpo"] = pass_at_1["sft"]
    rl = next((s for s in stages if s["stage"].startswith("rl")), None)
    final = stages[-1]["pass_at_1"] if "pass_at_1" in stages[-1] else pass_at_1.get("sft")
    return {"family": rc.family, "arm": rc.arm, "seed": rc.seed, "env": FAMILIES[rc.family].env_id,
            "env_kwargs": FAMILIES[rc.family].kwargs, "scorer": FAMILIES[rc.family].scorer,
            "heldout_tasks": min(rc.sft.eval.episodes, pool_size(rc.family, "eval")),
            "heldout_episodes": rc.sft.eval.episodes, "train_tasks": pool_size(rc.family, "train"),
            "pass_at_1": pass_at_1, "final_pass_at_1": final, "dpo_skipped": skipped,
            "seconds": {**{s["stage"].split(" ")[0]: s.get("seconds") for s in stages},
                        "total": round(sum(s.get("seconds") or 0 for s in stages), 1)},
            "entropy": rl["entropy"] if rl else [], "kl": rl["kl"] if rl else [],
            "critic_only": rl.get("critic_only", []) if rl else [],
            "alarms": rl["alarms"] if rl else {}, "stages": stages,
            "settings": {"sft": rc.sft.sft.model_dump(), "dpo": rc.dpo.model_dump() if rc.dpo else None,
                         "rl_updates": rc.rl.updates if rc.rl else 0, "rl_episodes": rc.rl_episodes,
                         "dpo_episodes": rc.dpo_episodes, "algo": rc.rl.algo if rc.rl else None,
                         "lora_r": rc.rl.optim.lora.r if rc.rl else None, "lr": rc.rl.optim.lr if rc.rl else None}}


def mean_se(xs: list[float]) -> dict[str, Any]:
    """Mean and standard error over seeds (the standard deviation over sqrt(n); None with one seed)."""
    return {"mean": round(statistics.mean(xs), 4),
            "stderr": round(statistics.stdev(xs) / math.sqrt(len(xs)), 4) if len(xs) > 1 else None, "n": len(xs)}


def summarize(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], float | None]:
    """Per (family, arm): mean and standard error over seeds of every stage's pass@1 (and each seed's, under
    `per_seed`, with the run's seconds); and the ratio of
    `sft+dpo+rl`'s final pass@1 over `sft`'s, over the (family, seed) pairs that ran both (None over 0)."""
    table: dict[str, Any] = {}
    for r in runs:
        table.setdefault(f"{r['family']}/{r['arm']}", []).append(r)
    summary = {}
    for key, rows in table.items():
        stages = {st for r in rows for st in r["pass_at_1"]}
        summary[key] = {st: mean_se([r["pass_at_1"][st] for r in rows if st in r["pass_at_1"]]) for st in stages}
        summary[key]["final"] = mean_se([r["final_pass_at_1"] for r in rows])
        summary[key]["per_seed"] = {str(r["seed"]): {**r["pass_at_1"], "seconds": r["seconds"]["total"]}
                                    for r in sorted(rows, key=lambda r: r["seed"])}
    by = {(r["family"], r["seed"], r["arm"]): r["final_pass_at_1"] for r in runs}
    both = [(k[0], k[1]) for k in by if k[2] == "sft" and (k[0], k[1], "sft+dpo+rl") in by]
    if not both:
        return summary, None
    sft = statistics.mean(by[(f, s, "sft")] for f, s in both)
    full = statistics.mean(by[(f, s, "sft+dpo+rl")] for f, s in both)
    return summary, (round(full / sft, 3) if sft > 0 else None)


def rise(runs: list[dict[str, Any]], family: str, arm: str = "sft+dpo+rl") -> dict[str, Any] | None:
    """Does `arm`'s final held-out pass@1 rise from the untouched model's (step 0) beyond the seeds' spread?
    Beyond the spread: every seed ends above step 0, and the mean's rise is more than twice its standard error
    over seeds. None where the family has no such run or no step-0 evaluation."""
    rows = [r for r in runs if r["family"] == family and r["arm"] == arm and "base" in r["pass_at_1"]]
    if not rows:
        return None
    base = rows[0]["pass_at_1"]["base"]  # one untouched model, evaluated once per family
    finals = [r["final_pass_at_1"] for r in rows]
    stats = mean_se(finals)
    se = stats["stderr"]
    return {"arm": arm, "step0": base, "final": stats, "seeds": sorted(r["seed"] for r in rows),
            "every_seed_above": all(f > base for f in finals),
            "beyond_spread": bool(len(rows) > 1 and all(f > base for f in finals)
                                  and stats["mean"] - base > 2 * (se or 0.0))}


def rl_health(runs: list[dict[str, Any]], family: str) -> dict[str, Any] | None:
    """Over a family's RL stages: the updates, those that trained only a critic (an assigner's warm-up: the policy
    did not move), those with no gradient step (every advantage zero), the last update's entropy over the first's
    (the lowest and highest of the runs), the largest KL, and the alarms."""
    rl = [r for r in runs if r["family"] == family and r["entropy"]]
    curves = [(r["entropy"], r["kl"], r["alarms"]) for r in rl]
    if not curves:
        return None
    ratios = []
    for ent, _, _ in curves:
        e = [x for x in ent if x is not None]
        if len(e) > 1 and e[0] > 0:
            ratios.append(e[-1] / e[0])
    kl = [x for _, k, _ in curves for x in k if x is not None]
    critic_only = sum(sum(r.get("critic_only") or []) for r in rl)
    return {"rl_runs": len(curves), "updates": sum(len(e) for e, _, _ in curves), "updates_critic_only": critic_only,
            "updates_without_gradient": sum(e.count(None) for e, _, _ in curves) - critic_only,
            "entropy_last_over_first_min": round(min(ratios), 3) if ratios else None,
            "entropy_last_over_first_max": round(max(ratios), 3) if ratios else None,
            "kl_max": max(kl) if kl else None, "alarms": sorted({a for _, _, al in curves for a in al})}


def result(args: argparse.Namespace, runs: list[dict[str, Any]], planned: dict[str, Any] | None) -> dict[str, Any]:
    summary, ratio = summarize(runs)
    families = args.families
    return {"model": args.model or "the tiny policy (--quick)", "quick": bool(getattr(args, "quick", False)),
            "families": {f: {"env": FAMILIES[f].env_id, "kwargs": FAMILIES[f].kwargs, "scorer": FAMILIES[f].scorer,
                             "turn_level_arm": FAMILIES[f].longer} for f in families},
            "baseline": "the sft arm's held-out pass@1, same seeds and tasks, same run",
            "ratio": ratio, "budget_episodes": {f: args.budget or FAMILIES[f].budget for f in families},
            "eval_episodes": args.eval_episodes, "rise": {f: rise(runs, f) for f in families},
            "rl_health": {f: rl_health(runs, f) for f in families},
            "summary": summary, "runs": runs, "plan": planned}


def merge(args: argparse.Namespace, paths: list[str]) -> None:
    """Combine slices' result files into one (`--merge`): their runs keyed by (family, arm, seed), the summary,
    ratio and rise recomputed over all of them; each slice's wall time and command kept under `slices`."""
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    slices = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"--merge: cannot read {path}: {e}") from None
        if not isinstance(data, dict) or data.get("benchmark") != NAME:
            what = data.get("benchmark") if isinstance(data, dict) else type(data).__name__
            raise SystemExit(f"--merge: {path} is not a {NAME} result (its benchmark is {what!r})")
        if data.get("quick") != bool(args.quick):
            raise SystemExit(f"--merge: {path} is {'' if data.get('quick') else 'not '}a --quick result; "
                             "slices of one result are all quick or none")
        for r in data["runs"]:
            runs[(r["family"], r["arm"], r["seed"])] = r
        slices.append({"file": Path(path).name, "runs": len(data["runs"]), "wall_s": data.get("wall_s"),
                       "command": data.get("command"), "machine": data.get("machine")})
    rows = sorted(runs.values(), key=lambda r: (r["family"], ARMS.index(r["arm"]), r["seed"]))
    args.eval_episodes = next((r["heldout_episodes"] for r in rows), args.eval_episodes)
    args.families = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    res = {**result(args, rows, None), "slices": slices,
           "wall_s": sum(s["wall_s"] or 0 for s in slices)}
    json_path = args.json or RESULTS / f"{NAME}{'_quick' if args.quick else ''}.json"
    report(NAME, res, path=json_path, summary={"ratio": res["ratio"], "runs": len(rows), "wall_s": res["wall_s"],
                                               "rise": res["rise"]})


def main(argv: list[str] | None = None) -> None:
    args = sized(build_parser().parse_args(argv))
    if args.merge:
        return merge(args, args.merge)
    planned = plan(args)
    if args.plan:
        return
    out = Path(args.out + ("-quick" if args.quick else ""))
    json_path = args.json or RESULTS / f"{NAME}{'_quick' if args.quick else ''}.json"
    runs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for family in args.families:
        base = None
        if not args.no_base and args.model is not None:  # the tiny policy has no untouched state worth scoring
            base = run_base(config(args, family, "sft", args.seeds[0]).sft, out / family)
            print(f"{family} base: held-out pass@1 {base['pass_at_1']:.3f} ({base['seconds']:.0f}s)", flush=True)
        for seed in args.seeds:
            for arm in [a for a in arms_of(family) if a in args.arms]:
                rc = config(args, family, arm, seed)
                row = run_one(rc, out, base)
                runs.append(row)
                print(f"{family:9s} {arm:22s} seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in
                      row["pass_at_1"].items()) + f" ({row['seconds']['total']:.0f}s)"
                      + (f" alarms: {', '.join(row['alarms'])}" if row["alarms"] else ""), flush=True)
                save(NAME, result(args, runs, planned), path=json_path)  # after every run: a kill keeps the rest
    res = {**result(args, runs, planned), "wall_s": round(time.perf_counter() - t0)}
    report(NAME, res, path=json_path, summary={"ratio": res["ratio"], "runs": len(runs), "wall_s": res["wall_s"],
                                               "rise": res["rise"], "summary": res["summary"]})


if __name__ == "__main__":
    main()
