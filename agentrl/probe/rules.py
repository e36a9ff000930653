"""The recommendation: a flat list of small rules tried in order; the first that matches decides.

    1. too-few-episodes -> grpo     2. no-signal -> grpo, fix sampling first     3. step-scores-only -> steppo
    4. short-horizon -> grpo        5. small-budget -> grpo                      6. dense-step-scores -> steppo
    7. critic-not-learnable -> gigpo or grpo                                     8. concentrated-value-changes -> arpo
    9. long-horizon -> the sweep's pick

Each rule is a function `(stats, thresholds, budget) -> RuleOutcome` in `RULES`, and names the
statistics and thresholds it compared. No rule names a turn-level assigner in code: a
condition-specific rule picks `thresholds.picks[rule]` (and only when that assigner is among the
sweep's `turn_level_candidates`, except step-scores-only, where the step scores are the only signal
there is), and the long-horizon rule picks `thresholds.long_horizon_algo`. Both are data: the
calibration fills the candidates and the long-horizon pick from a sweep over every registered
assigner (`turn_level` in `agentrl.algorithms.ASSIGNERS`), so a newly registered assigner that
wins the sweep is recommended without touching this module, and `picks` routes a condition to it.

After the first match, one gate: a turn-level pick is kept only if the calibration sweeps measured it ahead
of grpo past the cut-off by more than the spread of that lead (`thresholds.evidence`, `Evidence.reliable`).
Otherwise, and when a heuristic rule falls back to grpo past the cut-off, the pick is the best-backed
assigner that costs no more than grpo on this environment (`thresholds.free_signal`: steppo where the
environment scores turns, gigpo where states recur), and with none "no reliable difference: grpo", the
cheapest assigner (no critic, no PRM), with the figures. Step-scores-only is exempt (with silent outcomes
grpo has no signal at all). Every recommendation carries its `confidence` and `evidence`.

Rule 3 refines "many zero-advantage groups -> fix sampling first": when the outcomes are silent but
the environment scores turns, steppo has a signal no outcome-based assigner has (the horizon sweep
at 16 locks: a warm start at 0 that only steppo moved). The horizon comes before the turn-level
rules: whether turn-level credit pays at all is what the sweep measured, and steppo is turn-level.
"""

from __future__ import annotations

from collections.abc import Callable

from agentrl.probe.result import ProbeStats, Recommendation, RuleOutcome
from agentrl.probe.thresholds import BASELINE, ProbeThresholds

Rule = Callable[[ProbeStats, ProbeThresholds, int | None], RuleOutcome]


def _pick(th: ProbeThresholds, rule: str) -> str:
    if rule not in th.picks:
        raise ValueError(f"thresholds.picks has no assigner for rule {rule!r}; it names {sorted(th.picks)}")
    return th.picks[rule]


def _silent(s: ProbeStats, th: ProbeThresholds) -> bool:
    return s.zero_adv_frac > th.max_zero_adv_frac


def _step_signal(s: ProbeStats, th: ProbeThresholds) -> bool:
    return s.step_signal_frac >= th.min_step_signal_frac


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def too_few_episodes(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    return RuleOutcome(
        name="too-few-episodes",
        matched=s.episodes < th.min_episodes,
        algo=BASELINE,
        reason=f"{s.episodes} episodes probed, fewer than min_episodes {th.min_episodes}: too few to judge, so the "
        "critic-free default",
        statistics={"episodes": s.episodes},
        thresholds={"min_episodes": th.min_episodes},
    )


def no_signal(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    return RuleOutcome(
        name="no-signal",
        matched=_silent(s, th) and not _step_signal(s, th),
        algo=BASELINE,
        reason=f"{s.zero_adv_frac:.0%} of groups have all-equal rewards (all-pass {s.all_pass_frac:.0%}, all-fail "
        f"{s.all_fail_frac:.0%}), "
        f"above max_zero_adv_frac {th.max_zero_adv_frac:.0%}, and step scores differ inside only "
        f"{s.step_signal_frac:.0%} of groups: "
        "no assigner can spread a signal that is not there",
        statistics={
            "zero_adv_frac": s.zero_adv_frac,
            "all_pass_frac": s.all_pass_frac,
            "all_fail_frac": s.all_fail_frac,
            "step_signal_frac": s.step_signal_frac,
        },
        thresholds={"max_zero_adv_frac": th.max_zero_adv_frac, "min_step_signal_frac": th.min_step_signal_frac},
    )


def step_scores_only(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    algo = _pick(th, "step-scores-only")
    return RuleOutcome(
        name="step-scores-only",
        matched=_silent(s, th) and _step_signal(s, th),
        algo=algo,
        reason=f"{s.zero_adv_frac:.0%} of groups have all-equal outcomes (above max_zero_adv_frac "
        f"{th.max_zero_adv_frac:.0%}), but in "
        f"{s.step_signal_frac:.0%} of groups the episodes' step scores differ (>= min_step_signal_frac "
        f"{th.min_step_signal_frac:.0%}): "
        f"the step scores are the only signal, and {algo} reads them",
        statistics={"zero_adv_frac": s.zero_adv_frac, "step_signal_frac": s.step_signal_frac},
        thresholds={
            "max_zero_adv_frac": th.max_zero_adv_frac,
            "min_step_signal_frac": th.min_step_signal_frac,
            "picks": algo,
        },
    )


def short_horizon(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    if th.horizon_cutoff is None:
        return RuleOutcome(
            name="short-horizon",
            matched=True,
            algo=BASELINE,
            reason=f"median {s.turns_median:g} turns; the horizon sweep ({th.source}) found no horizon where a "
            "turn-level "
            f"assigner beat {BASELINE} by more than the seeds' spread, so the horizon rule keeps {BASELINE}",
            statistics={"turns_median": s.turns_median},
            thresholds={"horizon_cutoff": None},
        )
    return RuleOutcome(
        name="short-horizon",
        matched=s.turns_median < th.horizon_cutoff,
        algo=BASELINE,
        reason=f"median {s.turns_median:g} turns < horizon_cutoff {th.horizon_cutoff:g} ({th.source}): outcome credit "
        "suffices at this horizon",
        statistics={"turns_median": s.turns_median},
        thresholds={"horizon_cutoff": th.horizon_cutoff},
    )


def small_budget(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    return RuleOutcome(
        name="small-budget",
        matched=budget is not None and budget < th.min_budget_episodes,
        algo=BASELINE,
        reason=f"{budget} planned training episodes < min_budget_episodes {th.min_budget_episodes}: too little data "
        "for turn-level credit to pay",
        statistics={"budget_episodes": budget},
        thresholds={"min_budget_episodes": th.min_budget_episodes},
    )


def dense_step_scores(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    algo = _pick(th, "dense-step-scores")
    return RuleOutcome(
        name="dense-step-scores",
        matched=algo in th.turn_level_candidates and s.step_reward_density >= th.min_step_density,
        algo=algo,
        reason=f"{s.step_reward_density:.0%} of turns carry a step score (>= min_step_density "
        f"{th.min_step_density:.0%}): "
        f"the environment's scorer can credit turns, and {algo} reads it",
        statistics={"step_reward_density": s.step_reward_density},
        thresholds={
            "min_step_density": th.min_step_density,
            "turn_level_candidates": th.turn_level_candidates,
            "picks": algo,
        },
    )


def critic_not_learnable(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    recurring = _pick(th, "critic-not-learnable")
    recur = (
        s.state_recurrence is not None
        and s.state_recurrence >= th.min_state_recurrence
        and recurring in th.turn_level_candidates
    )
    r2_text = (
        "no R² (fewer than 2 groups)"
        if s.value_r2 is None
        else f"value-probe R² {s.value_r2:.2f} < min_value_r2 {th.min_value_r2}"
    )
    why = (
        f"states recur ({s.state_recurrence:.0%} >= {th.min_state_recurrence:.0%}), so {recurring}'s critic-free step "
        "groups"
        if recur
        else f"states do not recur enough for {recurring}, so {BASELINE}"
    )
    return RuleOutcome(
        name="critic-not-learnable",
        matched=s.value_r2 is None or s.value_r2 < th.min_value_r2,
        algo=recurring if recur else BASELINE,
        reason=f"{r2_text}: a turn critic would be noise; {why}",
        statistics={"value_r2": s.value_r2, "state_recurrence": s.state_recurrence},
        thresholds={
            "min_value_r2": th.min_value_r2,
            "min_state_recurrence": th.min_state_recurrence,
            "picks": recurring,
        },
    )


def concentrated_value_changes(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    algo = _pick(th, "concentrated-value-changes")
    conc = s.value_change_concentration
    bound = th.concentration_ratio * s.uniform_share
    return RuleOutcome(
        name="concentrated-value-changes",
        matched=algo in th.turn_level_candidates and conc is not None and conc >= bound,
        algo=algo,
        reason=f"value changes are concentrated: mean max share {_fmt(conc)} >= concentration_ratio "
        f"{th.concentration_ratio:g} "
        f"x uniform {s.uniform_share:.2f}, and {algo} weights turns by them",
        statistics={"value_change_concentration": conc, "uniform_share": s.uniform_share},
        thresholds={
            "concentration_ratio": th.concentration_ratio,
            "turn_level_candidates": th.turn_level_candidates,
            "picks": algo,
        },
    )


def long_horizon(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> RuleOutcome:
    return RuleOutcome(
        name="long-horizon",
        matched=True,
        algo=th.long_horizon_algo,
        reason=f"median {s.turns_median:g} turns >= cut-off {th.horizon_cutoff}, a learnable critic (R² "
        f"{_fmt(s.value_r2)}): "
        f"{th.long_horizon_algo} ({'the sweep' if th.source != 'literature' else 'the default'}'s long-horizon pick)",
        statistics={"turns_median": s.turns_median, "value_r2": s.value_r2},
        thresholds={"horizon_cutoff": th.horizon_cutoff, "long_horizon_algo": th.long_horizon_algo},
    )


# In order; the first that matches decides. long-horizon always matches, so there is always a pick.
RULES: list[Rule] = [
    too_few_episodes,
    no_signal,
    step_scores_only,
    short_horizon,
    small_budget,
    dense_step_scores,
    critic_not_learnable,
    concentrated_value_changes,
    long_horizon,
]

ADVICE: dict[str, str] = {
    "no-signal": "fix sampling or the curriculum first: dynamic sampling (--preset dapo), easier tasks, "
    "or a warmer start",
}


def rules(s: ProbeStats, th: ProbeThresholds, budget: int | None) -> list[RuleOutcome]:
    """Every rule, in order, with whether it matched."""
    return [rule(s, th, budget) for rule in RULES]


# Rules whose pick does not rest on the calibration's turn-level comparison, and what backs them instead
_NOT_GATED = {"step-scores-only": "the outcomes are silent; the step scores are the only signal there is"}
_UNMEASURED = {"too-few-episodes", "no-signal", "small-budget"}  # safe defaults: no sweep compares them


def backing(fired: RuleOutcome, th: ProbeThresholds) -> tuple[str, str]:
    """(confidence, evidence) for a fired rule's pick under thresholds `th` (see `Recommendation.confidence`)."""
    if fired.name in _UNMEASURED or fired.name in _NOT_GATED:
        return "unmeasured", _NOT_GATED.get(fired.name, "a safe default, not a comparison the sweeps made")
    if not th.evidence:
        return "unmeasured", f"the thresholds ({th.source}) carry no measured comparison with {BASELINE}"
    if fired.algo == BASELINE:
        if fired.name == "short-horizon":
            return "measured", (f"below the cut-off no turn-level assigner beat {BASELINE} beyond the spread "
                                f"({th.source})")
        return "unmeasured", f"{fired.name} falls back to {BASELINE} on a heuristic threshold"
    e = th.evidence.get(fired.algo)
    if e is None:
        return "no reliable difference", f"the calibration sweeps never ran {fired.algo} past the cut-off"
    return ("measured" if e.reliable else "no reliable difference"), e.describe(fired.algo)


def free_here(s: ProbeStats, th: ProbeThresholds) -> list[str]:
    """The assigners that cost no more than grpo on this environment: those of `thresholds.free_signal` whose
    signal the probe measured (its statistic above 0)."""
    out = []
    for algo, stat in th.free_signal.items():
        if stat not in ProbeStats.model_fields:
            raise ValueError(f"thresholds.free_signal[{algo!r}] = {stat!r} is not a probe statistic; known: "
                             f"{sorted(ProbeStats.model_fields)}")
        if (getattr(s, stat) or 0) > 0:
            out.append(algo)
    return out


def best_backed(s: ProbeStats, th: ProbeThresholds) -> str | None:
    """Of the assigners free here (`free_here`), the one the calibration sweeps show furthest ahead of grpo
    beyond the spread of its lead (`Evidence.reliable`), or None."""
    backed = [a for a in free_here(s, th) if a in th.evidence and th.evidence[a].reliable]
    return max(backed, key=lambda a: th.evidence[a].lead, default=None)


# Past the cut-off these rules fall back to grpo on a heuristic, not on a comparison: a free assigner the
# sweeps back may replace that fallback
_HEURISTIC_BASELINE = {"critic-not-learnable"}


def recommend(
    s: ProbeStats, th: ProbeThresholds, budget: int | None = None
) -> tuple[Recommendation, list[RuleOutcome]]:
    """The first matching rule's pick, through the no-reliable-difference gate, and every rule's outcome.

    The gate: a turn-level pick the calibration sweeps do not back (its lead over grpo not beyond the spread
    of that lead), and grpo picked past the cut-off on a heuristic, give way to the best-backed assigner that
    costs no more than grpo here (`best_backed`); with none, the answer is "no reliable difference: grpo"."""
    outcomes = rules(s, th, budget)
    fired = next(r for r in outcomes if r.matched)  # long-horizon always matches
    confidence, evidence = backing(fired, th)
    unbacked = confidence == "no reliable difference" or (
        fired.algo == BASELINE and fired.name in _HEURISTIC_BASELINE and bool(th.evidence))
    alt = best_backed(s, th) if unbacked else None
    if alt is not None and alt != fired.algo:
        e = th.evidence[alt]
        stat = th.free_signal[alt]
        why = ("the sweeps do not back it" if fired.algo != BASELINE else "that is a heuristic fallback")
        return Recommendation(
            algo=alt, rule="best-backed", confidence="measured", evidence=e.describe(alt),
            reason=f"best-backed: {alt}. {fired.name} would pick {fired.algo}, but {why} ({evidence}); {alt} is "
            f"ahead of {BASELINE} beyond the spread of its lead ({e.describe(alt)}) and costs no more than "
            f"{BASELINE} here ({stat} {getattr(s, stat):.2f}: the environment gives it its signal)",
        ), outcomes
    if confidence == "no reliable difference":
        return Recommendation(
            algo=BASELINE, rule="no-reliable-difference", confidence=confidence, evidence=evidence,
            reason=f"no reliable difference: {BASELINE}. {fired.name} would pick {fired.algo}, but {evidence}; "
            f"where the sweeps cannot tell them apart the cheapest assigner ({BASELINE}: no critic, no PRM) is "
            "the pick",
        ), outcomes
    return Recommendation(
        algo=fired.algo, rule=fired.name, reason=f"{fired.name}: {fired.reason}", advice=ADVICE.get(fired.name),
        confidence=confidence, evidence=evidence,
    ), outcomes
