"""The horizon probe (ALGORITHMS.md §5): measure a batch of episodes, then recommend a credit assigner.

The statistics are small pure functions over a list of `Episode`s, so a store saved by any run can
be probed without its environment or its model:

>>> from agentrl.core import Episode, Turn
>>> eps = [Episode([0], [Turn(1, [5], [-0.7], [6]), Turn(3, [7], [-0.1], [8])], reward=r, group_id=0) for r in (1.0, 0.0)]
>>> turns_summary(eps)
{'median': 2.0, 'p90': 2.0, 'mean': 2.0}
>>> round(post_observation_entropy(eps), 3)
0.4

`probe_store(store)` computes them all and applies the recommendation, a flat list of rules tried in
order; the first that matches fires, and the result names it, the statistics it read and the
thresholds it compared them with. `probe_env(train_config)` first collects a short rollout with the
current policy (the cached warm start when no model is given), as `Trainer` would.

The thresholds (`ProbeThresholds`) default to what this project's horizon sweep measured
(`benchmarks/results/horizon_sweep.json`, read by `thresholds_from_sweep`); without that file they
fall back to the brief's literature figures, and the result says which.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from agentrl.core import Episode
from agentrl.store import StoreError, TrajectoryStore

TURN_LEVEL = ("arpo", "steppo", "turn-ppo", "gigpo")
SWEEP_FILE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "horizon_sweep.json"

# --------------------------------------------------------------------------------------------
# Thresholds


class ProbeThresholds(BaseModel):
    """Every threshold of the recommendation, and how the value probe is measured.

    The defaults here are the fallback figures of the brief and the literature; `default_thresholds()`
    replaces the horizon ones with what the project's sweep measured when its results file exists.

    >>> t = ProbeThresholds(horizon_cutoff=12)
    >>> t.horizon_cutoff, t.source
    (12.0, 'literature')
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    min_episodes: int = Field(32, ge=1, description="Fewer probed episodes than this: the statistics are too noisy to act on, so the safe choice (grpo).")
    max_zero_adv_frac: float = Field(0.8, ge=0, le=1, description="More groups than this with all-equal rewards: no assigner has signal to spread; fix sampling or the curriculum first (DAPO's dynamic sampling exists for this).")
    horizon_cutoff: float | None = Field(30.0, description="Median turns per episode below which grpo is recommended. Fallback: the brief's ~30 turns. From a sweep: halfway between the last horizon where no turn-level assigner beat grpo and the first where one did. None: the sweep found no such horizon, so turn-level is never recommended.")
    min_budget_episodes: int = Field(10_000, ge=0, description="Planned training episodes below which grpo is recommended (a critic needs data). Fallback: the brief's 'tens of thousands of rollouts'. From a sweep: the per-run budget with which turn-level credit won there.")
    turn_level_candidates: list[str] = Field(default_factory=lambda: list(TURN_LEVEL), description="Turn-level assigners the rules may pick. From a sweep: those within the seeds' spread of the best at the horizons past the crossover.")
    long_horizon_algo: str = Field("turn-ppo", description="Picked at a long horizon when no more specific rule fires. §5: turn-ppo; from a sweep: the best turn-level assigner past the crossover.")
    min_step_signal_frac: float = Field(0.5, ge=0, le=1, description="With silent outcomes, the fraction of groups whose step scores differ from which steppo is picked (the sweep: at 37 turns, all-fail groups, only steppo learned).")
    min_step_density: float = Field(0.25, ge=0, le=1, description="Fraction of turns with a non-zero step score above which steppo's process rewards have something to say (heuristic; the sweep does not vary density).")
    min_value_r2: float = Field(0.2, description="Cross-validated R² of the turn-value probe below which a turn critic is judged not learnable; arpo's own explained-variance gate (0.2).")
    min_state_recurrence: float = Field(0.2, ge=0, le=1, description="Fraction of turns that share a (group, state) with another turn above which gigpo's step groups carry signal (heuristic).")
    concentration_ratio: float = Field(2.0, gt=0, description="arpo when the mean largest share of |value change| is at least this multiple of the uniform share 1/K (heuristic: twice as concentrated as uniform).")
    cv_folds: int = Field(5, ge=2, description="Folds of the value probe's cross-validation, split by group so that no task is both fit and scored.")
    ridge_alpha: float | None = Field(None, ge=0, description="Ridge penalty on standardised features. None: chosen inside each training fold from ridge_alphas by an inner group k-fold (nested, so the reported R² is not flattered by the choice); a 96-wide hidden state on a few hundred turns needs a strong penalty, cheap features almost none.")
    ridge_alphas: list[float] = Field(default_factory=lambda: [0.1, 1.0, 10.0, 100.0, 1000.0], description="The penalties tried when ridge_alpha is None.")
    use_step_rewards: bool = Field(False, description="Put step rewards into the Monte Carlo returns; off, as arpo and turn-ppo default: credit from the verifier's outcome alone.")
    seed: int = Field(0, description="Seeds the fold split.")
    source: str = Field("literature", description="Where the horizon thresholds came from: 'literature' or the sweep file.")
    sweep_started: str | None = Field(None, description="The sweep's start date, when the thresholds came from one.")
    sweep_command: str | None = Field(None, description="The command that ran the sweep.")
    derivation: str = Field("the brief's cut-offs (~30 turns, tens of thousands of rollouts); no horizon sweep results were found", description="How the horizon thresholds were derived, in words.")


class HorizonSummary(BaseModel):
    """One horizon of a sweep: per-assigner mean final pass rate and the seeds' spread."""

    locks: int | None
    max_turns: float
    means: dict[str, float]
    spread: float
    best: str
    within: list[str]  # assigners whose mean lies within the spread of the best


def horizon_spread(finals: dict[str, list[float]], eval_episodes: int | None) -> float:
    """The seeds' spread at one horizon: the pooled seed std of the final pass rates, floored by the
    binomial standard error of one evaluation (a single seed has no std, but its score still has noise).

    >>> round(horizon_spread({"a": [0.4, 0.6], "b": [0.5, 0.5]}, None), 4)
    0.1
    >>> round(horizon_spread({"a": [0.5]}, 100), 3)
    0.05
    """
    variances = [statistics.variance(v) for v in finals.values() if len(v) > 1]
    pooled = math.sqrt(sum(variances) / len(variances)) if variances else 0.0
    if not eval_episodes:
        return pooled
    p = statistics.mean(x for v in finals.values() for x in v)
    return max(pooled, math.sqrt(max(p * (1 - p), 0.0) / eval_episodes))


def summarize_sweep(sweep: dict[str, Any]) -> list[HorizonSummary]:
    """The sweep's horizons, shortest first (format: benchmarks/horizon_sweep.py's sweep.json)."""
    if "horizons" not in sweep:
        raise ValueError("not a horizon sweep: no 'horizons' key (expected benchmarks/horizon_sweep.py's sweep.json)")
    eval_episodes = (sweep.get("args") or {}).get("eval_episodes")
    out = []
    for key, h in sweep["horizons"].items():
        finals: dict[str, list[float]] = defaultdict(list)
        for name, run in h.get("runs", {}).items():
            if "final_pass_rate" not in run:
                raise ValueError(f"sweep horizon {key}, run {name}: no final_pass_rate")
            finals[run.get("algo", name.split("/")[0])].append(float(run["final_pass_rate"]))
        if not finals:
            continue
        means = {a: statistics.mean(v) for a, v in finals.items()}
        spread = horizon_spread(dict(finals), eval_episodes)
        best = max(means, key=means.__getitem__)
        within = sorted(a for a, m in means.items() if m >= means[best] - spread)
        out.append(HorizonSummary(locks=h.get("locks"), max_turns=float(h["max_turns"]), means=means, spread=spread, best=best, within=within))
    return sorted(out, key=lambda s: s.max_turns)


def sweep_command(sweep: dict[str, Any]) -> str:
    """The command line that reproduces a sweep, rebuilt from its recorded arguments."""
    parts = ["python", "benchmarks/horizon_sweep.py"]
    for k, v in (sweep.get("args") or {}).items():
        flag = "--" + k.replace("_", "-")
        parts += [flag, *map(str, v)] if isinstance(v, list) else [flag, str(v)]
    return " ".join(shlex.quote(p) for p in parts)


def thresholds_from_sweep(sweep: dict[str, Any], source: str = "sweep", base: ProbeThresholds | None = None) -> ProbeThresholds:
    """Horizon thresholds fitted to a horizon sweep's measured crossover.

    The crossover is the shortest horizon (by max turns) where some turn-level assigner's mean final
    pass rate beats grpo's by more than the seeds' spread (`horizon_spread`). The cut-off sits halfway
    between that horizon and the one below it (half its turns when it is the shortest); the candidates
    are the turn-level assigners within the spread of the best at or past it; the fallback pick is the
    best of them on average; the budget is the sweep's episodes per run. With no crossover,
    `horizon_cutoff` is None and the horizon rule never recommends a turn-level assigner.

    >>> run = lambda a, s, p: {"algo": a, "seed": s, "final_pass_rate": p}
    >>> sweep = {"args": {"updates": 10, "groups": 4, "group_size": 8}, "horizons": {
    ...   "1": {"locks": 1, "max_turns": 3, "runs": {"grpo/0": run("grpo", 0, .8), "grpo/1": run("grpo", 1, .9), "arpo/0": run("arpo", 0, .8), "arpo/1": run("arpo", 1, .9)}},
    ...   "8": {"locks": 8, "max_turns": 18, "runs": {"grpo/0": run("grpo", 0, .3), "grpo/1": run("grpo", 1, .4), "arpo/0": run("arpo", 0, .6), "arpo/1": run("arpo", 1, .7)}}}}
    >>> t = thresholds_from_sweep(sweep)
    >>> t.horizon_cutoff, t.turn_level_candidates, t.long_horizon_algo, t.min_budget_episodes
    (10.5, ['arpo'], 'arpo', 320)
    """
    if not any(r.get("algo") == "grpo" for h in sweep.get("horizons", {}).values() for r in h.get("runs", {}).values()):
        raise ValueError("the sweep has no grpo runs: the crossover is measured against grpo")
    horizons = summarize_sweep(sweep)
    args = sweep.get("args") or {}
    budget = int(args.get("updates", 0)) * int(args.get("groups", 0)) * int(args.get("group_size", 0))
    t = (base or ProbeThresholds()).model_copy()
    t.source = source
    t.sweep_started = sweep.get("started")
    t.sweep_command = sweep_command(sweep)
    if budget:
        t.min_budget_episodes = budget
    cross = None
    for i, h in enumerate(horizons):
        if "grpo" not in h.means:
            continue
        lead = {a: m - h.means["grpo"] for a, m in h.means.items() if a in TURN_LEVEL}
        if lead and max(lead.values()) > h.spread:
            cross = i
            break
    measured = ", ".join(f"{h.max_turns:g} turns: best {h.best} ({h.means[h.best]:.2f}), grpo {h.means.get('grpo', float('nan')):.2f}, spread {h.spread:.2f}" for h in horizons)
    if cross is None:
        t.horizon_cutoff = None
        t.turn_level_candidates = []
        t.derivation = f"no horizon where a turn-level assigner beat grpo by more than the seeds' spread ({measured}); turn-level credit is never recommended by the horizon rule"
        return t
    h = horizons[cross]
    prev = horizons[cross - 1] if cross > 0 else None
    t.horizon_cutoff = (prev.max_turns + h.max_turns) / 2 if prev else h.max_turns / 2
    past = horizons[cross:]
    t.turn_level_candidates = sorted({a for p in past for a in p.within if a in TURN_LEVEL} | {max((a for a in h.means if a in TURN_LEVEL), key=h.means.__getitem__)})
    avg = {a: statistics.mean(p.means[a] for p in past if a in p.means) for a in t.turn_level_candidates}
    t.long_horizon_algo = max(avg, key=avg.__getitem__)
    below = f"below it, at {prev.max_turns:g} turns, none did" if prev else "it is the sweep's shortest horizon, so the cut-off is half its turns"
    t.derivation = (f"turn-level credit first beat grpo by more than the seeds' spread at {h.max_turns:g} max turns (locks {h.locks}); {below}; "
                    f"cut-off {t.horizon_cutoff:g} turns; candidates {t.turn_level_candidates}; budget {budget} episodes per run. Measured: {measured}")
    return t


def default_thresholds(path: Path | None = None) -> ProbeThresholds:
    """The committed horizon sweep's thresholds when `benchmarks/results/horizon_sweep.json` exists,
    else the literature fallback (`ProbeThresholds()`)."""
    import json

    path = path or SWEEP_FILE
    if not path.is_file():
        return ProbeThresholds()
    try:
        sweep = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the horizon sweep's results are not valid JSON ({e})") from e
    return thresholds_from_sweep(sweep, source=str(path))


# --------------------------------------------------------------------------------------------
# The statistics: small pure functions over episodes


def turns_summary(episodes: Sequence[Episode]) -> dict[str, float]:
    """Median, 90th percentile (numpy's linear interpolation) and mean of turns per episode."""
    k = np.array([e.num_turns for e in episodes], dtype=float)
    return {"median": float(np.median(k)), "p90": float(np.percentile(k, 90)), "mean": float(k.mean())}


def tokens_per_episode(episodes: Sequence[Episode]) -> dict[str, float]:
    """Mean action tokens (trained) and mean context tokens (the whole sequence: prompt, actions,
    observations but the last) per episode."""
    return {"action": float(np.mean([e.num_action_tokens for e in episodes])), "context": float(np.mean([len(e.token_ids()) for e in episodes]))}


def step_reward_density(episodes: Sequence[Episode]) -> float:
    """Fraction of turns whose step reward is non-zero (how often a process score speaks)."""
    turns = [t for e in episodes for t in e.turns]
    return sum(t.step_reward != 0 for t in turns) / len(turns) if turns else 0.0


def step_signal_frac(episodes: Sequence[Episode]) -> float:
    """Fraction of groups (of two or more episodes) whose episodes' summed step scores differ: where
    a step-score assigner has something to rank even when every outcome in the group is the same."""
    groups: dict[int, list[float]] = defaultdict(list)
    for e in episodes:
        groups[e.group_id].append(round(sum(t.step_reward for t in e.turns), 9))
    multi = [g for g in groups.values() if len(g) > 1]
    return sum(len(set(g)) > 1 for g in multi) / len(multi) if multi else 0.0


def group_outcomes(episodes: Sequence[Episode]) -> dict[str, float]:
    """Zero-advantage groups (all rewards equal: all-pass R >= 1, all-fail R <= 0, as
    `credit.group_advantages` counts them) and the mean within-group reward std (unbiased), over
    groups of two or more episodes (a group of one has no baseline and no spread)."""
    groups: dict[int, list[float]] = defaultdict(list)
    for e in episodes:
        groups[e.group_id].append(e.reward)
    multi = [r for r in groups.values() if len(r) > 1]
    n = len(multi)
    zero = [r for r in multi if all(x == r[0] for x in r)]
    return {
        "groups": float(len(groups)),
        "groups_scored": float(n),
        "zero_adv_frac": len(zero) / n if n else 0.0,
        "all_pass_frac": sum(r[0] >= 1.0 for r in zero) / n if n else 0.0,
        "all_fail_frac": sum(r[0] <= 0.0 for r in zero) / n if n else 0.0,
        "reward_std_in_group": float(np.mean([statistics.stdev(r) for r in multi])) if n else 0.0,
    }


def state_recurrence(episodes: Sequence[Episode]) -> float | None:
    """Fraction of turns whose (group, state_key) another turn in the group shares: gigpo's step
    groups of two or more (the same figure gigpo logs as credit/state_recurrence). None when no
    turn carries a state_key."""
    counts: dict[tuple[int, str], int] = defaultdict(int)
    n = 0
    for e in episodes:
        for t in e.turns:
            if t.state_key is not None:
                counts[(e.group_id, t.state_key)] += 1
                n += 1
    if n == 0:
        return None
    return sum(c for c in counts.values() if c > 1) / n


def post_observation_entropy(episodes: Sequence[Episode]) -> float | None:
    """Mean of -log p of the first action token after each observation (the prompt counts as the
    first): a sampled token's -log p is an unbiased Monte Carlo estimate of the entropy of the
    distribution it was drawn from, so a store's behaviour log-probs suffice. None without them."""
    xs = [-t.logprobs[0] for e in episodes for t in e.turns if t.logprobs]
    return float(np.mean(xs)) if xs else None


def turn_rewards(episode: Episode, use_step_rewards: bool) -> list[float]:
    """r_k per turn: the step reward (or 0), with the terminal reward R folded into the last turn."""
    r = [t.step_reward if use_step_rewards else 0.0 for t in episode.turns]
    if r:
        r[-1] += episode.reward
    return r


def mc_returns(episode: Episode, use_step_rewards: bool) -> list[float]:
    """G_k = sum_{k' >= k} r_k' (gamma = 1): the Monte Carlo target of a turn critic (ALGORITHMS.md §3)."""
    out, acc = [], 0.0
    for r in reversed(turn_rewards(episode, use_step_rewards)):
        acc += r
        out.append(acc)
    return out[::-1]


CHEAP_FEATURES = ("turn / max turns", "context tokens / max", "step reward so far", "malformed so far")


def cheap_features(episodes: Sequence[Episode]) -> np.ndarray:
    """(N turns, 4) features any store has, known at the start of each turn.

    Not the episode's own length (so not "fraction of this episode done"): it is known only when
    the episode ends, and it leaks the outcome (a failing episode runs to the turn budget), which
    would flatter the probe. The turn index is scaled by the longest episode in the store instead.
    """
    k_max = max((e.num_turns for e in episodes), default=1) or 1
    c_max = max((t.context_len for e in episodes for t in e.turns), default=1) or 1
    rows = []
    for e in episodes:
        reward_so_far = malformed_so_far = 0.0
        for k, t in enumerate(e.turns):
            rows.append([k / k_max, t.context_len / c_max, reward_so_far, malformed_so_far])
            reward_so_far += t.step_reward
            malformed_so_far += t.malformed
    return np.array(rows, dtype=float).reshape(-1, len(CHEAP_FEATURES))


def hidden_features(episodes: Sequence[Episode]) -> np.ndarray | None:
    """(N turns, H) the policy's hidden state before each action, when every turn has one."""
    turns = [t for e in episodes for t in e.turns]
    if not turns or any(t.hidden is None for t in turns) or len({len(t.hidden) for t in turns}) != 1:
        return None
    return np.array([t.hidden for t in turns], dtype=float)


def ridge_fit(X: np.ndarray, y: np.ndarray, alpha: float) -> Callable[[np.ndarray], np.ndarray]:
    """Closed-form ridge on standardised features with an unpenalised intercept; returns predict.

    >>> f = ridge_fit(np.array([[0.0], [1.0], [2.0]]), np.array([1.0, 3.0, 5.0]), alpha=0.0)
    >>> f(np.array([[3.0]])).round(6).tolist()
    [7.0]
    """
    mu, sd = X.mean(0), X.std(0)
    sd = np.where(sd < 1e-8, 1.0, sd)  # a constant column contributes nothing, not a division by 0
    Z = (X - mu) / sd
    y0 = y.mean()
    w = np.linalg.solve(Z.T @ Z + alpha * np.eye(Z.shape[1]), Z.T @ (y - y0)) if Z.shape[1] else np.zeros(0)
    return lambda Xn: ((Xn - mu) / sd) @ w + y0


def group_folds(group_ids: Sequence[int], k: int, seed: int = 0) -> np.ndarray:
    """Fold of each row, whole groups to a fold (shuffled with `seed`), at most `k` folds."""
    uniq = sorted(set(group_ids))
    order = np.random.default_rng(seed).permutation(len(uniq))
    fold_of = {uniq[j]: i % k for i, j in enumerate(order)}
    return np.array([fold_of[g] for g in group_ids], dtype=int)


def choose_alpha(X: np.ndarray, y: np.ndarray, groups: np.ndarray, alphas: Sequence[float], k: int = 3) -> float:
    """The penalty with the least squared error over an inner group k-fold of (X, y)."""
    uniq = np.unique(groups)
    if len(uniq) < 2:
        return float(max(alphas))  # nothing to validate on: the safest (strongest) penalty
    inner = group_folds(groups.tolist(), min(k, len(uniq)))
    errors = []
    for a in alphas:
        err = 0.0
        for f in np.unique(inner):
            test = inner == f
            err += float(((ridge_fit(X[~test], y[~test], a)(X[test]) - y[test]) ** 2).sum())
        errors.append(err)
    return float(alphas[int(np.argmin(errors))])


def cv_r2(X: np.ndarray, y: np.ndarray, folds: np.ndarray, alpha: float | None, groups: np.ndarray | None = None,
          alphas: Sequence[float] = (0.1, 1.0, 10.0, 100.0, 1000.0)) -> tuple[float, np.ndarray]:
    """Out-of-fold R² (1 - SSE / SST over all rows) and the out-of-fold predictions.

    With `alpha` None the penalty is chosen inside each training fold (`choose_alpha` over its
    `groups`), never on the fold it is scored on. R² is 0 when the target does not vary (nothing
    to learn); it is negative when the probe predicts worse than the mean.
    """
    pred = np.zeros_like(y)
    for f in np.unique(folds):
        test = folds == f
        a = alpha if alpha is not None else choose_alpha(X[~test], y[~test], (groups if groups is not None else folds)[~test], alphas)
        pred[test] = ridge_fit(X[~test], y[~test], a)(X[test])
    sst = float(((y - y.mean()) ** 2).sum())
    if sst < 1e-12:
        return 0.0, pred
    return 1.0 - float(((y - pred) ** 2).sum()) / sst, pred


def value_changes(rewards: Sequence[float], values: Sequence[float]) -> list[float]:
    """d_k = r_k + V(s_{k+1}) - V(s_k), with V(s_{K+1}) = 0 (R already folded into r_K).

    >>> value_changes([0.0, 1.0], [0.5, 0.75])
    [0.25, 0.25]
    """
    nxt = list(values[1:]) + [0.0]
    return [r + v1 - v0 for r, v0, v1 in zip(rewards, values, nxt)]


def concentration(d: Sequence[float]) -> float:
    """max |d_k| / sum |d_k|: 1/K when value moves evenly, 1 when one turn moves it all (1/K when
    nothing moves, as arpo falls back to uniform weights)."""
    a = np.abs(np.asarray(d, dtype=float))
    return float(a.max() / a.sum()) if a.sum() > 1e-9 else 1.0 / len(a)


# --------------------------------------------------------------------------------------------
# The result


class ProbeStats(BaseModel):
    """Every statistic of ALGORITHMS.md §5, for one batch of episodes."""

    episodes: int = Field(description="episodes probed (errored ones excluded)")
    errored: int = 0
    groups: int
    pass_rate: float
    reward_mean: float
    truncated_frac: float
    turns_median: float
    turns_p90: float
    turns_mean: float
    action_tokens_mean: float
    context_tokens_mean: float
    step_reward_density: float
    step_signal_frac: float = Field(0.0, description="groups whose episodes' summed step scores differ")
    zero_adv_frac: float
    all_pass_frac: float
    all_fail_frac: float
    reward_std_in_group: float
    state_recurrence: float | None
    value_r2: float | None = Field(description="cross-validated R² of the turn-value probe; None with fewer than 2 groups")
    value_features: str = Field(description="which features the value probe read")
    value_change_concentration: float | None = Field(description="mean over episodes of max|d_k| / sum|d_k|")
    uniform_share: float = Field(description="mean over episodes of 1/K, the concentration of evenly spread value changes")
    post_obs_entropy: float | None


class ProbeCurves(BaseModel):
    """What the report plots."""

    turns_hist: dict[int, int] = Field(default_factory=dict, description="episodes by number of turns")
    step_reward_by_turn: list[float] = Field(default_factory=list, description="mean step reward at turn k (1-based index k+1)")
    return_by_turn: list[float] = Field(default_factory=list, description="mean Monte Carlo return G_k at turn k")
    value_by_turn: list[float] = Field(default_factory=list, description="mean out-of-fold probe value V(s_k) at turn k")
    episodes_by_turn: list[int] = Field(default_factory=list, description="episodes that reached turn k")
    concentration: list[float] = Field(default_factory=list, description="max|d|/sum|d| per episode")
    episode_turns: list[int] = Field(default_factory=list, description="K per episode, aligned with concentration")
    group_counts: dict[str, int] = Field(default_factory=dict, description="groups that are all-pass, all-fail, mixed")


class RuleOutcome(BaseModel):
    name: str
    matched: bool
    algo: str
    reason: str
    statistics: dict[str, float | None]
    thresholds: dict[str, Any]


class Recommendation(BaseModel):
    algo: str
    rule: str
    reason: str
    advice: str | None = None


class ProbeResult(BaseModel):
    source: str
    stats: ProbeStats
    curves: ProbeCurves
    thresholds: ProbeThresholds
    budget_episodes: int | None = Field(None, description="planned training episodes, when known (a train config)")
    rules: list[RuleOutcome]
    recommendation: Recommendation
    env: dict[str, Any] | None = None


# --------------------------------------------------------------------------------------------
# Putting it together


def measure(episodes: Sequence[Episode], th: ProbeThresholds) -> tuple[ProbeStats, ProbeCurves]:
    """Every statistic and the report's curves for `episodes` (errored episodes are left out)."""
    good = [e for e in episodes if not e.error]
    if not good:
        raise ValueError(f"probe: no episodes to measure ({len(episodes)} given, all errored)" if episodes else "probe: no episodes to measure")
    turns = turns_summary(good)
    toks = tokens_per_episode(good)
    grp = group_outcomes(good)
    with_turns = [e for e in good if e.turns]

    # the turn-value probe: hidden states when the run captured them, else cheap features
    X = hidden_features(with_turns)
    features = f"policy hidden state (H={X.shape[1]})" if X is not None else "cheap: " + ", ".join(CHEAP_FEATURES)
    if X is None and with_turns:
        X = cheap_features(with_turns)
    y = np.array([g for e in with_turns for g in mc_returns(e, th.use_step_rewards)], dtype=float)
    row_groups = [e.group_id for e in with_turns for _ in e.turns]
    n_groups = len(set(row_groups))
    r2: float | None = None
    values = np.zeros_like(y)
    if n_groups >= 2:
        r2, values = cv_r2(X, y, group_folds(row_groups, min(th.cv_folds, n_groups), th.seed), th.ridge_alpha,
                           np.array(row_groups), th.ridge_alphas)

    # value-change concentration, and the by-turn curves
    conc, ks = [], []
    K = max((e.num_turns for e in good), default=0)
    sums = {name: np.zeros(K) for name in ("step", "ret", "val")}
    counts = np.zeros(K, dtype=int)
    i = 0
    for e in with_turns:
        n = e.num_turns
        v = values[i : i + n]
        g = y[i : i + n]
        i += n
        if r2 is not None:
            conc.append(concentration(value_changes(turn_rewards(e, th.use_step_rewards), v.tolist())))
            ks.append(n)
        sums["step"][:n] += [t.step_reward for t in e.turns]
        sums["ret"][:n] += g
        sums["val"][:n] += v
        counts[:n] += 1
    per = np.maximum(counts, 1)
    hist: dict[int, int] = defaultdict(int)
    for e in good:
        hist[e.num_turns] += 1
    scored = int(grp["groups_scored"])
    n_pass, n_fail = round(grp["all_pass_frac"] * scored), round(grp["all_fail_frac"] * scored)
    stats = ProbeStats(
        episodes=len(good),
        errored=len(episodes) - len(good),
        groups=int(grp["groups"]),
        pass_rate=float(np.mean([e.passed for e in good])),
        reward_mean=float(np.mean([e.reward for e in good])),
        truncated_frac=float(np.mean([e.truncated for e in good])),
        turns_median=turns["median"],
        turns_p90=turns["p90"],
        turns_mean=turns["mean"],
        action_tokens_mean=toks["action"],
        context_tokens_mean=toks["context"],
        step_reward_density=step_reward_density(good),
        step_signal_frac=step_signal_frac(good),
        zero_adv_frac=grp["zero_adv_frac"],
        all_pass_frac=grp["all_pass_frac"],
        all_fail_frac=grp["all_fail_frac"],
        reward_std_in_group=grp["reward_std_in_group"],
        state_recurrence=state_recurrence(good),
        value_r2=r2,
        value_features=features,
        value_change_concentration=float(np.mean(conc)) if conc else None,
        uniform_share=float(np.mean([1.0 / e.num_turns for e in with_turns])) if with_turns else 1.0,
        post_obs_entropy=post_observation_entropy(good),
    )
    curves = ProbeCurves(
        turns_hist=dict(sorted(hist.items())),
        step_reward_by_turn=(sums["step"] / per).tolist(),
        return_by_turn=(sums["ret"] / per).tolist(),
        value_by_turn=(sums["val"] / per).tolist() if r2 is not None else [],
        episodes_by_turn=counts.tolist(),
        concentration=conc,
        episode_turns=ks,
        group_counts={"all-pass": n_pass, "all-fail": n_fail, "mixed": scored - n_pass - n_fail},
    )
    return stats, curves


def rules(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> list[RuleOutcome]:
    """Every rule, in order, with whether it matched; the first that matches decides.

    1. too-few-episodes -> grpo     2. no-signal -> grpo, fix sampling first     3. step-scores-only -> steppo
    4. short-horizon -> grpo        5. small-budget -> grpo                      6. dense-step-scores -> steppo
    7. critic-not-learnable -> gigpo or grpo                                     8. concentrated-value-changes -> arpo
    9. long-horizon -> the sweep's pick

    Rule 3 refines §5's "many zero-advantage groups -> fix sampling first": when the outcomes are
    silent but the environment scores turns, steppo has a signal no outcome-based assigner has
    (the horizon sweep at 16 locks: a warm start at 0 that only steppo moved).

    The horizon comes before the turn-level rules (§5 lists steppo first): whether turn-level
    credit pays at all is what the sweep measured, and steppo is turn-level.
    """
    cands = th.turn_level_candidates
    out: list[RuleOutcome] = []

    def rule(name: str, matched: bool, algo: str, reason: str, stats: dict[str, float | None], ths: dict[str, Any]) -> None:
        out.append(RuleOutcome(name=name, matched=matched, algo=algo, reason=reason, statistics=stats, thresholds=ths))

    rule("too-few-episodes", s.episodes < th.min_episodes, "grpo",
         f"{s.episodes} episodes probed, fewer than min_episodes {th.min_episodes}: too few to judge, so the critic-free default",
         {"episodes": s.episodes}, {"min_episodes": th.min_episodes})
    silent = s.zero_adv_frac > th.max_zero_adv_frac
    steps = s.step_signal_frac >= th.min_step_signal_frac
    rule("no-signal", silent and not steps, "grpo",
         f"{s.zero_adv_frac:.0%} of groups have all-equal rewards (all-pass {s.all_pass_frac:.0%}, all-fail {s.all_fail_frac:.0%}), above max_zero_adv_frac "
         f"{th.max_zero_adv_frac:.0%}, and step scores differ inside only {s.step_signal_frac:.0%} of groups: no assigner can spread a signal that is not there",
         {"zero_adv_frac": s.zero_adv_frac, "all_pass_frac": s.all_pass_frac, "all_fail_frac": s.all_fail_frac, "step_signal_frac": s.step_signal_frac},
         {"max_zero_adv_frac": th.max_zero_adv_frac, "min_step_signal_frac": th.min_step_signal_frac})
    rule("step-scores-only", silent and steps, "steppo",
         f"{s.zero_adv_frac:.0%} of groups have all-equal outcomes (above max_zero_adv_frac {th.max_zero_adv_frac:.0%}), but in {s.step_signal_frac:.0%} of groups "
         f"the episodes' step scores differ (>= min_step_signal_frac {th.min_step_signal_frac:.0%}): the step scores are the only signal, and steppo reads them",
         {"zero_adv_frac": s.zero_adv_frac, "step_signal_frac": s.step_signal_frac},
         {"max_zero_adv_frac": th.max_zero_adv_frac, "min_step_signal_frac": th.min_step_signal_frac})
    if th.horizon_cutoff is None:
        rule("short-horizon", True, "grpo", f"median {s.turns_median:g} turns; the horizon sweep ({th.source}) found no horizon where a turn-level "
             "assigner beat grpo by more than the seeds' spread, so the horizon rule keeps grpo", {"turns_median": s.turns_median}, {"horizon_cutoff": None})
    else:
        rule("short-horizon", s.turns_median < th.horizon_cutoff, "grpo",
             f"median {s.turns_median:g} turns < horizon_cutoff {th.horizon_cutoff:g} ({th.source}): outcome credit suffices at this horizon",
             {"turns_median": s.turns_median}, {"horizon_cutoff": th.horizon_cutoff})
    rule("small-budget", budget is not None and budget < th.min_budget_episodes, "grpo",
         f"{budget} planned training episodes < min_budget_episodes {th.min_budget_episodes}: too little data for turn-level credit to pay",
         {"budget_episodes": budget}, {"min_budget_episodes": th.min_budget_episodes})
    rule("dense-step-scores", "steppo" in cands and s.step_reward_density >= th.min_step_density, "steppo",
         f"{s.step_reward_density:.0%} of turns carry a step score (>= min_step_density {th.min_step_density:.0%}): the environment's scorer can credit turns",
         {"step_reward_density": s.step_reward_density}, {"min_step_density": th.min_step_density, "turn_level_candidates": cands})
    recur = s.state_recurrence is not None and s.state_recurrence >= th.min_state_recurrence and "gigpo" in cands
    not_learnable = s.value_r2 is None or s.value_r2 < th.min_value_r2
    r2_text = "no R² (fewer than 2 groups)" if s.value_r2 is None else f"value-probe R² {s.value_r2:.2f} < min_value_r2 {th.min_value_r2}"
    rule("critic-not-learnable", not_learnable, "gigpo" if recur else "grpo",
         f"{r2_text}: a turn critic would be noise; " + (f"states recur ({s.state_recurrence:.0%} >= {th.min_state_recurrence:.0%}), so gigpo's critic-free step groups"
                                                          if recur else "states do not recur enough for gigpo, so grpo"),
         {"value_r2": s.value_r2, "state_recurrence": s.state_recurrence}, {"min_value_r2": th.min_value_r2, "min_state_recurrence": th.min_state_recurrence})
    conc = s.value_change_concentration
    bound = th.concentration_ratio * s.uniform_share
    rule("concentrated-value-changes", "arpo" in cands and conc is not None and conc >= bound, "arpo",
         f"value changes are concentrated: mean max share {conc if conc is not None else float('nan'):.2f} >= concentration_ratio {th.concentration_ratio:g} x uniform {s.uniform_share:.2f}",
         {"value_change_concentration": conc, "uniform_share": s.uniform_share}, {"concentration_ratio": th.concentration_ratio, "turn_level_candidates": cands})
    rule("long-horizon", True, th.long_horizon_algo,
         f"median {s.turns_median:g} turns >= cut-off {th.horizon_cutoff}, a learnable critic (R² {s.value_r2 if s.value_r2 is not None else float('nan'):.2f}): "
         f"{th.long_horizon_algo} ({'the sweep' if th.source != 'literature' else '§5'}'s long-horizon pick)",
         {"turns_median": s.turns_median, "value_r2": s.value_r2}, {"horizon_cutoff": th.horizon_cutoff, "long_horizon_algo": th.long_horizon_algo})
    return out


def recommend(s: ProbeStats, th: ProbeThresholds, budget: int | None = None) -> tuple[Recommendation, list[RuleOutcome]]:
    """The first matching rule's pick, and every rule's outcome."""
    outcomes = rules(s, th, budget)
    fired = next(r for r in outcomes if r.matched)  # long-horizon always matches
    advice = None
    if fired.name == "no-signal":
        advice = "fix sampling or the curriculum first: dynamic sampling (--preset dapo), easier tasks, or a warmer start"
    return Recommendation(algo=fired.algo, rule=fired.name, reason=f"{fired.name}: {fired.reason}", advice=advice), outcomes


def probe_episodes(episodes: Sequence[Episode], thresholds: ProbeThresholds | None = None, *, source: str = "episodes",
                   budget_episodes: int | None = None, env: dict[str, Any] | None = None) -> ProbeResult:
    """Measure `episodes` and recommend an assigner."""
    th = thresholds or default_thresholds()
    stats, curves = measure(episodes, th)
    rec, outcomes = recommend(stats, th, budget_episodes)
    return ProbeResult(source=source, stats=stats, curves=curves, thresholds=th, budget_episodes=budget_episodes, rules=outcomes, recommendation=rec, env=env)


def load_store(path: str | Path) -> TrajectoryStore:
    """A saved store: a Parquet file, a folder of them, or a run folder (its `store/`)."""
    p = Path(path)
    if p.is_dir() and not any(p.glob("*.parquet")) and (p / "store").is_dir():
        p = p / "store"
    store = TrajectoryStore.load(p)
    if not len(store):
        raise StoreError(f"{p}: the store holds no episodes")
    return store


def probe_store(store: TrajectoryStore | str | Path, thresholds: ProbeThresholds | None = None, budget_episodes: int | None = None) -> ProbeResult:
    """Probe a saved store (no environment, no model needed).

    >>> import tempfile, os
    >>> from agentrl.core import Turn
    >>> eps = [Episode([0], [Turn(1, [5], [-0.5], [6])], reward=float(i % 2), group_id=i // 4) for i in range(8)]
    >>> path = TrajectoryStore(eps).save(os.path.join(tempfile.mkdtemp(), "s.parquet"))
    >>> r = probe_store(path, ProbeThresholds(min_episodes=4))
    >>> r.stats.turns_median, r.recommendation.algo, r.recommendation.rule
    (1.0, 'grpo', 'short-horizon')
    """
    source = "store"
    if not isinstance(store, TrajectoryStore):
        source = str(store)
        store = load_store(store)
    return probe_episodes(store.episodes, thresholds, source=source, budget_episodes=budget_episodes)


def collect(train_config: Any, groups: int = 8, group_size: int | None = None, policy: Any = None, seed: int | None = None) -> list[Episode]:
    """A short rollout with the current policy: `groups` tasks x `group_size` episodes, training seeds
    (below the held-out offset), hidden states captured for the value probe. Without `policy`, the
    policy is built as `Trainer` builds it: `--model`, else the cached SFT warm start."""
    from agentrl.core import make
    from agentrl.policy import Policy
    from agentrl.rollout import rollout
    from agentrl.trainer import make_engine, resolve_device

    cfg = train_config
    G = group_size or cfg.rollout.group_size
    if policy is None:
        if cfg.model is None:
            from agentrl.stages.sft import warm_start

            policy = Policy.load(warm_start(cfg.env.id, cfg.env.kwargs, cfg.tiny, cfg.sft, cfg.seed), device=resolve_device(cfg.device))
        else:
            policy = Policy.load(cfg.model, device=resolve_device(cfg.device))
    max_context = cfg.rollout.max_context or getattr(policy.model.config, "max_position_embeddings", 2048)
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    task_seeds = rng.integers(0, cfg.eval.seed_offset, size=groups).tolist()
    seeds = [s for s in task_seeds for _ in range(G)]
    envs = [make(cfg.env.id, **cfg.env.kwargs) for _ in seeds]
    engine = make_engine(cfg, policy, cfg.rollout.sampling, seed=cfg.seed, capture_hidden=True)
    episodes, _ = rollout(envs, seeds, engine, policy.chat, group_ids=[i // G for i in range(len(seeds))],
                          max_context=max_context, max_new_tokens=cfg.rollout.sampling.max_new_tokens)
    return episodes


def planned_episodes(train_config: Any) -> int:
    """The training budget of a config: updates x groups x group size."""
    return int(train_config.updates * train_config.rollout.groups * train_config.rollout.group_size)


def probe_env(train_config: Any, groups: int = 8, group_size: int | None = None, policy: Any = None,
              thresholds: ProbeThresholds | None = None, store_out: str | Path | None = None) -> ProbeResult:
    """Roll out the current policy on the config's environment (see `collect`) and probe it; the
    recommendation weighs the config's training budget. `store_out` saves the probed episodes."""
    episodes = collect(train_config, groups, group_size, policy)
    if store_out is not None:
        TrajectoryStore(episodes).save(store_out)
    env = {"id": train_config.env.id, "kwargs": train_config.env.kwargs, "model": train_config.model or "warm start (tiny policy, SFT)"}
    return probe_episodes(episodes, thresholds, source=f"rollout on {train_config.env.id} {train_config.env.kwargs}",
                          budget_episodes=planned_episodes(train_config), env=env)


def recommend_for_config(train_config: Any, groups: int = 8) -> tuple[str, str]:
    """(algo, reason) for `agentrl train --algo auto`: probe the config's environment with its
    policy, using the default (sweep-derived) thresholds."""
    r = probe_env(train_config, groups=groups)
    return r.recommendation.algo, r.recommendation.reason


# --------------------------------------------------------------------------------------------
# The bakeoff: short runs of the candidates from the same start


class BakeoffRun(BaseModel):
    algo: str
    curve: list[float] = Field(description="training pass rate per update")
    slope: float = Field(description="least-squares slope of the training pass rate, per update")
    warm_pass_rate: float
    final_pass_rate: float
    wall_s: float


def learning_slope(curve: Sequence[float]) -> float:
    """Least-squares slope of a curve against its index (0 with fewer than 2 points).

    >>> learning_slope([0.1, 0.2, 0.3])
    0.1
    """
    if len(curve) < 2:
        return 0.0
    return round(float(np.polyfit(np.arange(len(curve)), np.asarray(curve, dtype=float), 1)[0]), 12)


def bakeoff(train_config: Any, algos: Sequence[str], updates: int, out: str | Path, eval_episodes: int = 32,
            say: Callable[[str], None] = print) -> list[BakeoffRun]:
    """Train each of `algos` for `updates` updates from the same start (the config's model or warm
    start), on the same seed and budget, and record the learning curves."""
    import json
    import time

    from agentrl.config import TrainConfig
    from agentrl.trainer import Trainer, evaluate

    runs = []
    warm = None
    for algo in algos:
        data = train_config.model_dump()
        data.update(algo=algo, credit={}, updates=updates, out=str(Path(out) / f"bakeoff-{algo}"))
        data["eval"] = {**data["eval"], "episodes": eval_episodes, "every": 0}
        cfg = TrainConfig(**data)
        t0 = time.perf_counter()
        trainer = Trainer(cfg)
        trainer.monitor.console.quiet = True
        if warm is None:  # every run starts from the same policy: evaluate it once
            warm = evaluate(cfg, trainer.policy, cfg.rollout.sampling, trainer.max_context)
        summary = trainer.train(warm=warm)
        rows = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
        curve = [r["rollout/pass_rate"] for r in rows if r.get("step", 0) >= 1 and "rollout/pass_rate" in r]
        runs.append(BakeoffRun(algo=algo, curve=curve, slope=learning_slope(curve), warm_pass_rate=summary["warm_start_pass_rate"],
                               final_pass_rate=summary["final_pass_rate"], wall_s=time.perf_counter() - t0))
        say(f"bakeoff {algo}: {summary['warm_start_pass_rate']:.2f} -> {summary['final_pass_rate']:.2f}, slope {runs[-1].slope:+.3f}/update")
    return runs


__all__ = [
    "BakeoffRun", "HorizonSummary", "ProbeCurves", "ProbeResult", "ProbeStats", "ProbeThresholds", "Recommendation", "RuleOutcome",
    "bakeoff", "cheap_features", "choose_alpha", "collect", "concentration", "cv_r2", "default_thresholds", "group_folds", "group_outcomes",
    "hidden_features", "horizon_spread", "learning_slope", "load_store", "mc_returns", "measure", "planned_episodes", "post_observation_entropy",
    "probe_env", "probe_episodes", "probe_store", "recommend", "recommend_for_config", "ridge_fit", "rules", "state_recurrence",
    "step_reward_density", "summarize_sweep", "sweep_command", "thresholds_from_sweep", "tokens_per_episode", "turn_rewards", "turns_summary",
    "value_changes",
]
