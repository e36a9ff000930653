"""`measure`: every statistic and the report's curves for a batch of episodes.

The per-turn quantities come from `agentrl.credit` on the trainer's batch layout, once: turn
rewards r (B, K), Monte Carlo returns G (B, K), the probe's out-of-fold values V (B, K), the value
changes d (B, K) and their per-episode concentration; the curves are their column means.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

import agentrl.probe.stats as st
from agentrl import credit
from agentrl.core import Episode
from agentrl.probe.result import ProbeCurves, ProbeStats
from agentrl.probe.thresholds import ProbeThresholds
from agentrl.probe.value import CHEAP_FEATURES, cheap_features, cv_r2, group_folds, hidden_features


def measure(episodes: Sequence[Episode], th: ProbeThresholds) -> tuple[ProbeStats, ProbeCurves]:
    """Every statistic and the report's curves for `episodes` (errored episodes are left out)."""
    good = [e for e in episodes if not e.error]
    if not good:
        raise ValueError(
            f"probe: no episodes to measure ({len(episodes)} given, all errored)"
            if episodes
            else "probe: no episodes to measure"
        )
    turns = st.turns_summary(good)
    toks = st.tokens_per_episode(good)
    grp = st.group_outcomes(good)
    with_turns = [e for e in good if e.turns]

    batch = st.as_batch(good)
    mask = batch.turn_mask  # (B, K)
    r = credit.turn_rewards(batch, th.use_step_rewards).double()  # (B, K), R folded into the last turn
    G = credit.discounted_returns(r, mask)  # (B, K) Monte Carlo targets, gamma = 1

    # the turn-value probe: hidden states when the run captured them, else cheap features; one row
    # per turn, in the batch's row-major (episode, turn) order, which is what G[mask] flattens to
    X = hidden_features(with_turns)
    features = f"policy hidden state (H={X.shape[1]})" if X is not None else "cheap: " + ", ".join(CHEAP_FEATURES)
    if X is None and with_turns:
        X = cheap_features(with_turns)
    y = G[mask].numpy()  # (N,)
    row_groups = batch.group_ids[:, None].expand_as(mask)[mask].tolist()  # (N,)
    n_groups = len(set(row_groups))
    r2: float | None = None
    V = torch.zeros_like(G)  # (B, K) out-of-fold V(s_k)
    if n_groups >= 2:
        r2, pred = cv_r2(
            X,
            y,
            group_folds(row_groups, min(th.cv_folds, n_groups), th.seed),
            th.ridge_alpha,
            np.array(row_groups),
            th.ridge_alphas,
        )
        V[mask] = torch.from_numpy(pred)

    has_turns = batch.num_turns > 0  # (B,)
    conc: list[float] = []
    if r2 is not None:
        d = credit.value_changes(r, V, mask)  # (B, K)
        conc = credit.value_change_concentration(d, mask)[has_turns].tolist()

    K = int(batch.num_turns.max())
    counts = mask[:, :K].sum(0)  # (K,) episodes that reached turn k
    per = counts.clamp(min=1).double()

    def by_turn(x: torch.Tensor) -> list[float]:
        return ((x[:, :K].double() * mask[:, :K]).sum(0) / per).tolist()

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
        step_reward_density=st.step_reward_density(good),
        step_signal_frac=st.step_signal_frac(good),
        zero_adv_frac=grp["zero_adv_frac"],
        all_pass_frac=grp["all_pass_frac"],
        all_fail_frac=grp["all_fail_frac"],
        reward_std_in_group=grp["reward_std_in_group"],
        state_recurrence=st.state_recurrence(good),
        value_r2=r2,
        value_features=features,
        value_change_concentration=float(np.mean(conc)) if conc else None,
        uniform_share=float(np.mean([1.0 / e.num_turns for e in with_turns])) if with_turns else 1.0,
        post_obs_entropy=st.post_observation_entropy(good),
    )
    curves = ProbeCurves(
        turns_hist=dict(sorted(Counter(e.num_turns for e in good).items())),
        step_reward_by_turn=by_turn(batch.step_rewards),
        return_by_turn=by_turn(G),
        value_by_turn=by_turn(V) if r2 is not None else [],
        episodes_by_turn=counts.tolist(),
        concentration=conc,
        episode_turns=batch.num_turns[has_turns].tolist() if r2 is not None else [],
        group_counts={"all-pass": n_pass, "all-fail": n_fail, "mixed": scored - n_pass - n_fail},
    )
    return stats, curves
