"""Advice on a warm start before RL: does it leave the groups something to learn from?

A GRPO group teaches only when it holds both a pass and a fail; a warm start at the floor or the
ceiling leaves most groups all-fail or all-pass. The trainer says this before its first update, and
`agentrl sft` after building one (docs/warm_start.md).
"""

from __future__ import annotations

import math


def mixed_group_share(pass_rate: float, group_size: int = 8) -> float:
    """The share of GRPO groups of `group_size` episodes that hold both a pass and a fail at this pass
    rate: the groups whose advantages are not all zero, i.e. what RL can learn from.

    >>> round(mixed_group_share(0.5), 3), round(mixed_group_share(0.97), 3)
    (0.992, 0.216)
    """
    return 1.0 - pass_rate**group_size - (1.0 - pass_rate) ** group_size


ADVICE_MIN_EPISODES = 4  # fewer held-out episodes than this cannot place a warm start at the floor or the ceiling


def warm_start_advice(pass_rate: float, episodes: int, expert_pass_rate: float | None = None,
                      band: tuple[float, float] = (0.15, 0.85), group_size: int = 8) -> str | None:
    """A warning for a warm start that leaves RL little to work with, with the next thing to try; None
    when it is fine. At the floor or the ceiling (outside `band`) most GRPO groups are all-fail or
    all-pass and their advantages are zero; far below the expert it learned from (less than half its
    pass rate, by more than three standard errors), SFT did not teach what the demonstrations show.

    >>> warm_start_advice(0.5, 128, 0.6) is None
    True
    >>> warm_start_advice(0.0, 128).split(":")[0]
    'the warm start is at the floor (held-out pass rate 0.000 over 128 episodes)'
    >>> warm_start_advice(1.0, 1) is None  # one episode (agentrl sft --eval-episodes 1) says nothing either way
    True
    """
    if episodes < ADVICE_MIN_EPISODES:
        return None
    share = mixed_group_share(pass_rate, group_size)
    where = f"(held-out pass rate {pass_rate:.3f} over {episodes} episodes)"
    if pass_rate < band[0]:
        hint = ("lower the expert's slip rate (--sft.noise auto tries cleaner demonstrations), or train longer "
                "(--sft.epochs, --sft.episodes)")
        if expert_pass_rate is not None and expert_pass_rate < band[0]:
            hint = (f"its demonstrations pass only {expert_pass_rate:.2f}: lower --sft.noise (--sft.noise auto does) "
                    "or make the task easier")
        return (f"the warm start is at the floor {where}: {share:.0%} of groups of {group_size} will hold a pass "
                f"and a fail (99% at 0.5), so RL's signal is thin and slow to start; {hint}")
    if pass_rate > band[1]:
        return (f"the warm start is at the ceiling {where}: {share:.0%} of groups of {group_size} will hold a pass "
                "and a fail (99% at 0.5), so RL has little left to improve; for a task that shows what RL adds, make "
                "it harder (the env's size or horizon); to leave RL headroom on this one, fewer --sft.epochs or "
                "--sft.episodes (a higher --sft.noise teaches the policy the expert's slips)")
    if expert_pass_rate is not None and episodes > 0:
        se = math.sqrt(max(pass_rate * (1 - pass_rate), 0.25 / episodes) / episodes)
        if pass_rate < expert_pass_rate / 2 and expert_pass_rate - pass_rate > 3 * se:
            return (f"the warm start {where} is far below the expert it learned from (its demonstrations pass "
                    f"{expert_pass_rate:.2f}): SFT did not teach what they show; train longer (--sft.epochs, "
                    "--sft.episodes) or use a larger --tiny model")
    return None


__all__ = ["ADVICE_MIN_EPISODES", "mixed_group_share", "warm_start_advice"]
