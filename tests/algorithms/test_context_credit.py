"""Credit across a compaction (docs/algorithms.md, "Credit across a cut"), worked by hand.

Two episodes of one group. Each: a1 (its observation ends with the summary instruction), then the summary
(a turn of its own, no observation), then a2 given a new segment: the task and the summary. Episode 0 passes
(R = 1), episode 1 fails (R = 0). Every number below was computed by hand, not by the assigners' formulas.
"""

from __future__ import annotations

import torch
from test_assigners import TableCritic, close

from agentrl.algorithms import GiGPOConfig, GRPOConfig, TurnPPOConfig
from agentrl.algorithms.gigpo import GiGPO
from agentrl.algorithms.grpo import GRPO
from agentrl.algorithms.turn_ppo import TurnPPO
from agentrl.core import Episode, Turn
from agentrl.store import make_batch, segment_batch

A = 0.70710678  # grpo's advantage of a group of two with rewards 1 and 0: (1 - 0.5) / std([1, 0]) = 0.5 / 0.7071


def summarised(reward: float, last_state: str) -> Episode:
    """Layout [1 | 5 5 | 7 8 | 6 6 6 | 5 5]: prompt, a1, o1 + instruction, the summary, a2 (on [1, 9])."""
    return Episode([1], [
        Turn(1, [5, 5], [-1.0, -1.0], [7, 8], state_key="s1", hidden=[0.0]),
        Turn(5, [6, 6, 6], [-1.0] * 3, [], state_key="summary s1", hidden=[1.0], kind="summary"),
        Turn(8, [5, 5], [-1.0, -1.0], [7], state_key=last_state, hidden=[2.0], segment_context=[1, 9]),
    ], reward=reward, terminated=True, group_id=0)


def batch(mask_summary: bool = False):
    return make_batch([summarised(1.0, "s2"), summarised(0.0, "s3")], pad_id=0, mask_summary=mask_summary)


def test_grpo_gives_the_summary_the_episodes_advantage_in_both_segments():
    b = batch()
    credit = GRPO(GRPOConfig()).assign(b, GRPO().fit(b))
    close(credit.advantages, [[0, A, A, 0, 0, A, A, A, A, A], [0, -A, -A, 0, 0, -A, -A, -A, -A, -A]])
    # trained as segments: the summary with the context it was written in, a2 with the task and the summary
    seg = segment_batch(b.with_(advantages=credit.advantages))
    assert seg.input_ids[:2].tolist() == [[1, 5, 5, 7, 8, 6, 6, 6], [1, 9, 5, 5, 0, 0, 0, 0]]
    close(seg.advantages[:2], [[0, A, A, 0, 0, A, A, A], [0, 0, A, A, 0, 0, 0, 0]])


def test_turn_ppo_credits_the_summary_by_the_value_of_the_state_after_the_cut():
    # V(s_k): the state before a1, the state the summary is written in, the state after the cut (task + summary)
    critic = TableCritic([[0.5, 0.25, 0.75], [0.5, 0.25, 0.125]])
    tp = TurnPPO(TurnPPOConfig(gamma=0.5, lam=0.5, whiten=False, warmup_updates=0), critic=critic)
    b = batch()
    credit = tp.assign(b, tp.fit(b))
    # episode 0 (R = 1):  d = [0 + .5*.25 - .5, 0 + .5*.75 - .25, 1 - .75] = [-.375, .125, .25]
    #                     A = [-.375 + .25*.1875, .125 + .25*.25, .25] = [-.328125, .1875, .25]
    # episode 1 (R = 0):  d = [-.375, .5*.125 - .25, -.125] = [-.375, -.1875, -.125]
    #                     A = [-.375 + .25*-.21875, -.1875 + .25*-.125, -.125] = [-.4296875, -.21875, -.125]
    s0, s1 = 0.1875, -0.21875
    close(credit.advantages, [[0, -0.328125, -0.328125, 0, 0, s0, s0, s0, 0.25, 0.25],
                              [0, -0.4296875, -0.4296875, 0, 0, s1, s1, s1, -0.125, -0.125]])
    # mask_summary: the summary's tokens leave the loss, every other turn keeps its advantage
    masked = batch(mask_summary=True)
    tp = TurnPPO(TurnPPOConfig(gamma=0.5, lam=0.5, whiten=False, warmup_updates=0), critic=critic)
    close(tp.assign(masked, tp.fit(masked)).advantages,
          [[0, -0.328125, -0.328125, 0, 0, 0, 0, 0, 0.25, 0.25],
           [0, -0.4296875, -0.4296875, 0, 0, 0, 0, 0, -0.125, -0.125]])


def test_gigpo_compares_summaries_written_from_the_same_state():
    b = batch()
    g = GiGPO(GiGPOConfig())
    credit = g.assign(b, g.fit(b))
    # step returns (gamma .95): episode 0 [.9025, .95, 1], episode 1 [0, 0, 0]. Step groups: "s1" {.9025, 0} and
    # "summary s1" {.95, 0} give +-0.7071 each (a pair's (g - mean) / std); "s2" and "s3" are groups of one: 0.
    # A = grpo's +-0.7071 + step: a1 and the summary +-1.4142, a2 +-0.7071
    two = 2 * A
    close(credit.advantages, [[0, two, two, 0, 0, two, two, two, A, A],
                              [0, -two, -two, 0, 0, -two, -two, -two, -A, -A]], atol=1e-4)


def test_the_summary_turn_keeps_its_slot_for_a_turn_critic_when_masked():
    masked = batch(mask_summary=True)
    assert masked.turn_pos[0].tolist() == [0, 4, 7] and masked.num_turns.tolist() == [3, 3]
    assert masked.turn_index[0].tolist() == [-1, 0, 0, -1, -1, 1, 1, 1, 2, 2]
    assert torch.equal(masked.action_mask[0], torch.tensor([0, 1, 1, 0, 0, 0, 0, 0, 1, 1.0]))
