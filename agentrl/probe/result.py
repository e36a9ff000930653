"""What a probe produces: the statistics, the report's curves, every rule's outcome, the pick."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agentrl.probe.family import FamilyDistance
from agentrl.probe.thresholds import ProbeThresholds


class ProbeStats(BaseModel):
    """Every statistic the rules read, for one batch of episodes."""

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
    value_r2: float | None = Field(
        description="cross-validated R² of the turn-value probe; None with fewer than 2 groups"
    )
    value_features: str = Field(description="which features the value probe read")
    value_change_concentration: float | None = Field(description="mean over episodes of max|d_k| / sum|d_k|")
    uniform_share: float = Field(
        description="mean over episodes of 1/K, the concentration of evenly spread value changes"
    )
    post_obs_entropy: float | None


class ProbeCurves(BaseModel):
    """What the report plots."""

    turns_hist: dict[int, int] = Field(default_factory=dict, description="episodes by number of turns")
    step_reward_by_turn: list[float] = Field(
        default_factory=list, description="mean step reward at turn k (1-based index k+1)"
    )
    return_by_turn: list[float] = Field(default_factory=list, description="mean Monte Carlo return G_k at turn k")
    value_by_turn: list[float] = Field(
        default_factory=list, description="mean out-of-fold probe value V(s_k) at turn k"
    )
    episodes_by_turn: list[int] = Field(default_factory=list, description="episodes that reached turn k")
    concentration: list[float] = Field(default_factory=list, description="max|d|/sum|d| per episode")
    episode_turns: list[int] = Field(default_factory=list, description="K per episode, aligned with concentration")
    group_counts: dict[str, int] = Field(default_factory=dict, description="groups that are all-pass, all-fail, mixed")


class RuleOutcome(BaseModel):
    """One rule: whether it matched, what it would pick, why, and the figures it compared."""

    name: str
    matched: bool
    algo: str
    reason: str
    statistics: dict[str, float | None]
    thresholds: dict[str, Any]


class Recommendation(BaseModel):
    """The first matching rule's pick, and how well the calibration sweeps back it."""

    algo: str
    rule: str
    reason: str
    advice: str | None = None
    confidence: str = Field("unmeasured", description="'measured' (the calibration sweeps show the pick's edge, or, "
                            "for grpo below the cut-off, no edge to take), 'no reliable difference' (a turn-level "
                            "pick the sweeps did not separate from grpo: grpo instead), 'unmeasured' (a heuristic "
                            "rule or uncalibrated thresholds: the sweeps say nothing either way)")
    evidence: str = Field("", description="the figures behind `confidence`, in words")


class ProbeResult(BaseModel):
    """Everything `agentrl probe` reports (report.json is this, dumped)."""

    source: str
    stats: ProbeStats
    curves: ProbeCurves
    thresholds: ProbeThresholds
    budget_episodes: int | None = Field(None, description="planned training episodes, when known (a train config)")
    rules: list[RuleOutcome]
    recommendation: Recommendation
    env: dict[str, Any] | None = None
    family: FamilyDistance | None = Field(None, description="how far these statistics lie from the environments the "
                                          "packaged thresholds were fitted on, and what that means for the pick")

    def decision(self) -> dict[str, Any]:
        """What a run records of the pick when `agentrl train --algo auto` made it (decisions.json,
        config.yaml's header, summary.json): the rule, its reason and confidence, and the statistics and
        thresholds it read, so that the run folder explains itself."""
        rec = self.recommendation
        return {"algo": rec.algo, "rule": rec.rule, "reason": rec.reason, "advice": rec.advice,
                "confidence": rec.confidence, "evidence": rec.evidence, "statistics": self.stats.model_dump(),
                "thresholds": self.thresholds.source, "budget_episodes": self.budget_episodes,
                "family": self.family.model_dump() if self.family else None}
