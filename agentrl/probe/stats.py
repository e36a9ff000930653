"""The probe's statistics: small pure functions over a list of `Episode`s.

The credit quantities (per-turn rewards, Monte Carlo returns, group outcome counts, value changes
and their concentration) are the assigners' own, from `agentrl.credit`, computed on the same
`TurnBatch` layout the trainer hands them: the probe measures what the assigners will see.

>>> from agentrl.core import Episode, Turn
>>> turns = lambda: [Turn(1, [5], [-0.7], [6]), Turn(3, [7], [-0.1], [8])]
>>> eps = [Episode([0], turns(), reward=r, group_id=0) for r in (1.0, 0.0)]
>>> turns_summary(eps)
{'median': 2.0, 'p90': 2.0, 'mean': 2.0}
>>> round(post_observation_entropy(eps), 3)
0.4
>>> mc_returns(eps[0], use_step_rewards=False)
[1.0, 1.0]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch

from agentrl import credit
from agentrl.core import Episode
from agentrl.store import TurnBatch, make_batch


def as_batch(episodes: Sequence[Episode]) -> TurnBatch:
    """The episodes laid out as the trainer lays them out (no model reads it: the pad id is moot)."""
    return make_batch(episodes, pad_id=0)


def turns_summary(episodes: Sequence[Episode]) -> dict[str, float]:
    """Median, 90th percentile (numpy's linear interpolation) and mean of turns per episode."""
    k = np.array([e.num_turns for e in episodes], dtype=float)
    return {"median": float(np.median(k)), "p90": float(np.percentile(k, 90)), "mean": float(k.mean())}


def tokens_per_episode(episodes: Sequence[Episode]) -> dict[str, float]:
    """Mean action tokens (trained) and mean context tokens (the whole sequence: prompt, actions,
    observations but the last) per episode."""
    return {
        "action": float(np.mean([e.num_action_tokens for e in episodes])),
        "context": float(np.mean([len(e.token_ids()) for e in episodes])),
    }


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
    """Zero-advantage groups (all rewards equal: all-pass R >= 1, all-fail R <= 0) and the mean
    within-group reward std, as `credit.group_advantages` counts them for grpo; the fractions are
    over groups of two or more episodes (a group of one has no baseline and no spread)."""
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
    group_ids = torch.tensor([e.group_id for e in episodes], dtype=torch.long)
    _, g = credit.group_advantages(rewards, group_ids)
    n = int((torch.unique(group_ids, return_counts=True)[1] > 1).sum())
    return {
        "groups": float(g["groups"]),
        "groups_scored": float(n),
        "zero_adv_frac": g["zero_adv_groups"] / n if n else 0.0,
        "all_pass_frac": g["all_pass_groups"] / n if n else 0.0,
        "all_fail_frac": g["all_fail_groups"] / n if n else 0.0,
        "reward_std_in_group": float(g["reward_std_in_group"]),
    }


def state_recurrence(episodes: Sequence[Episode]) -> float | None:
    """Fraction of turns whose (group, state_key) another turn in the group shares: gigpo's step
    groups of two or more (the figure gigpo logs as credit/state_recurrence). None when no turn
    carries a state_key (gigpo itself refuses such a batch)."""
    return credit.state_recurrence(credit.state_groups(episodes))


def post_observation_entropy(episodes: Sequence[Episode]) -> float | None:
    """Mean of -log p of the first action token after each observation (the prompt counts as the
    first): a sampled token's -log p is an unbiased Monte Carlo estimate of the entropy of the
    distribution it was drawn from, so a store's behaviour log-probs suffice. None without them."""
    xs = [-t.logprobs[0] for e in episodes for t in e.turns if t.logprobs]
    return float(np.mean(xs)) if xs else None


def turn_rewards(episode: Episode, use_step_rewards: bool) -> list[float]:
    """r_k per turn: the step reward (or 0), with the terminal reward R folded into the last turn
    (`credit.turn_rewards`, as arpo, turn-ppo and gigpo build them)."""
    return credit.turn_rewards(as_batch([episode]), use_step_rewards)[0, : episode.num_turns].tolist()


def mc_returns(episode: Episode, use_step_rewards: bool) -> list[float]:
    """G_k = sum_{k' >= k} r_k' (gamma = 1): the Monte Carlo target of a turn critic (`credit.discounted_returns`)."""
    b = as_batch([episode])
    return credit.discounted_returns(credit.turn_rewards(b, use_step_rewards), b.turn_mask)[
        0, : episode.num_turns
    ].tolist()


def value_changes(rewards: Sequence[float], values: Sequence[float]) -> list[float]:
    """d_k = r_k + V(s_{k+1}) - V(s_k) for one episode, with V(s_{K+1}) = 0 (`credit.value_changes`).

    >>> value_changes([0.0, 1.0], [0.5, 0.75])
    [0.25, 0.25]
    """
    r = torch.tensor([list(rewards)], dtype=torch.float64)
    return credit.value_changes(
        r, torch.tensor([list(values)], dtype=torch.float64), torch.ones_like(r, dtype=torch.bool)
    )[0].tolist()


def concentration(d: Sequence[float]) -> float:
    """max |d_k| / sum |d_k| for one episode (`credit.value_change_concentration`): 1/K when value
    moves evenly, 1 when one turn moves it all, 1/K when nothing moves (arpo falls back to uniform)."""
    x = torch.tensor([list(d)], dtype=torch.float64)
    return float(credit.value_change_concentration(x, torch.ones_like(x, dtype=torch.bool))[0])
