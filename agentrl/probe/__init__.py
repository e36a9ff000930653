"""The horizon probe: measure a batch of episodes, then recommend a credit assigner.

One module per job:

    thresholds   ProbeThresholds, and the calibrated ones shipped as package data (thresholds.json)
    calibration  fitting the horizon thresholds to a horizon sweep (`python -m agentrl.probe calibrate`,
                 the command in __main__, rewrites thresholds.json)
    stats        the statistics: small pure functions over episodes (credit quantities from agentrl.credit)
    value        the turn-value probe: cross-validated ridge on hidden states or cheap features
    measure      every statistic and the report's curves for a batch
    rules        the recommendation: a flat list of rules, the first that matches decides
    run          probing episodes, a saved store, or a short rollout of the current policy; the
                 thresholds a probe applies (`probe_thresholds`)
    bakeoff      short runs of the candidates from the same start

`agentrl.probe` holds what probes and what plugs in a rule (`RULES`, `Rule`, `ProbeStats`,
`RuleOutcome`, `ProbeThresholds`); the statistics, the value probe and the calibration's parts are
imported from their own modules.

>>> from agentrl.core import Episode, Turn
>>> eps = [Episode([0], [Turn(1, [5], [-0.5], [6])], reward=float(i % 2), group_id=i // 4) for i in range(32)]
>>> r = probe_episodes(eps)  # the packaged thresholds: the same in a checkout and a wheel
>>> r.recommendation.algo, r.recommendation.rule, r.thresholds.source.startswith("packaged")
('grpo', 'short-horizon', True)
"""

from agentrl.probe.bakeoff import BakeoffRun, bakeoff
from agentrl.probe.calibration import thresholds_from_sweep
from agentrl.probe.measure import measure
from agentrl.probe.result import ProbeResult, ProbeStats, Recommendation, RuleOutcome
from agentrl.probe.rules import RULES, Rule, recommend, rules
from agentrl.probe.run import probe_env, probe_episodes, probe_store, probe_thresholds
from agentrl.probe.thresholds import ProbeThresholds, default_thresholds

__all__ = [
    "RULES",
    "BakeoffRun",
    "ProbeResult",
    "ProbeStats",
    "ProbeThresholds",
    "Recommendation",
    "Rule",
    "RuleOutcome",
    "bakeoff",
    "default_thresholds",
    "measure",
    "probe_env",
    "probe_episodes",
    "probe_store",
    "probe_thresholds",
    "recommend",
    "rules",
    "thresholds_from_sweep",
]
