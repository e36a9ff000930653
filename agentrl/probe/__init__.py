"""The horizon probe: measure a batch of episodes, then recommend a credit assigner.

One module per job:

    thresholds   ProbeThresholds, and the calibrated ones shipped as package data (thresholds.json)
    calibration  fitting the horizon thresholds to a horizon sweep; `python -m agentrl.probe calibrate`
    stats        the statistics: small pure functions over episodes (credit quantities from agentrl.credit)
    value        the turn-value probe: cross-validated ridge on hidden states or cheap features
    measure      every statistic and the report's curves for a batch
    rules        the recommendation: a flat list of rules, the first that matches decides
    run          probing episodes, a saved store, or a short rollout of the current policy
    bakeoff      short runs of the candidates from the same start

>>> from agentrl.core import Episode, Turn
>>> eps = [Episode([0], [Turn(1, [5], [-0.5], [6])], reward=float(i % 2), group_id=i // 4) for i in range(32)]
>>> r = probe_episodes(eps)  # the packaged thresholds: the same in a checkout and a wheel
>>> r.recommendation.algo, r.recommendation.rule, r.thresholds.source.startswith("packaged")
('grpo', 'short-horizon', True)
"""

from agentrl.probe.bakeoff import BakeoffRun, bakeoff, learning_slope
from agentrl.probe.calibration import (
    HorizonSummary,
    calibration_record,
    horizon_spread,
    summarize_sweep,
    sweep_command,
    thresholds_from_sweep,
    write_thresholds,
)
from agentrl.probe.measure import measure
from agentrl.probe.result import ProbeCurves, ProbeResult, ProbeStats, Recommendation, RuleOutcome
from agentrl.probe.rules import RULES, recommend, rules
from agentrl.probe.run import (
    collect,
    load_store,
    planned_episodes,
    probe_env,
    probe_episodes,
    probe_store,
    recommend_for_config,
)
from agentrl.probe.stats import (
    concentration,
    group_outcomes,
    mc_returns,
    post_observation_entropy,
    state_recurrence,
    step_reward_density,
    step_signal_frac,
    tokens_per_episode,
    turn_rewards,
    turns_summary,
    value_changes,
)
from agentrl.probe.thresholds import (
    BASELINE,
    ProbeThresholds,
    default_thresholds,
    packaged_thresholds,
    turn_level_assigners,
)
from agentrl.probe.value import (
    CHEAP_FEATURES,
    cheap_features,
    choose_alpha,
    cv_r2,
    group_folds,
    hidden_features,
    ridge_fit,
)

__all__ = [
    "BASELINE",
    "CHEAP_FEATURES",
    "RULES",
    "BakeoffRun",
    "HorizonSummary",
    "ProbeCurves",
    "ProbeResult",
    "ProbeStats",
    "ProbeThresholds",
    "Recommendation",
    "RuleOutcome",
    "bakeoff",
    "calibration_record",
    "cheap_features",
    "choose_alpha",
    "collect",
    "concentration",
    "cv_r2",
    "default_thresholds",
    "group_folds",
    "group_outcomes",
    "hidden_features",
    "horizon_spread",
    "learning_slope",
    "load_store",
    "mc_returns",
    "measure",
    "packaged_thresholds",
    "planned_episodes",
    "post_observation_entropy",
    "probe_env",
    "probe_episodes",
    "probe_store",
    "recommend",
    "recommend_for_config",
    "ridge_fit",
    "rules",
    "state_recurrence",
    "step_reward_density",
    "step_signal_frac",
    "summarize_sweep",
    "sweep_command",
    "thresholds_from_sweep",
    "tokens_per_episode",
    "turn_level_assigners",
    "turn_rewards",
    "turns_summary",
    "value_changes",
    "write_thresholds",
]
