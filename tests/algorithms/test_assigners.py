"""Oracle tests for the turn-level assigners: known critics, step scores and state keys, advantages
computed by hand."""

from __future__ import annotations

import pytest
import torch

from agentrl.algorithms import ASSIGNERS
from agentrl.algorithms.arpo import ARPO, ARPOConfig
from agentrl.algorithms.gigpo import GiGPO, GiGPOConfig
from agentrl.algorithms.steppo import StepPO, StepPOConfig
from agentrl.algorithms.turn_ppo import TurnPPO, TurnPPOConfig
from agentrl.core import Episode, Turn
from agentrl.credit import Fit, discounted_returns, gae, turn_rewards
from agentrl.store import make_batch

S = 2 ** -0.5  # |A_i| of a two-episode group with rewards 1 and 0, std-normalised


def episode(reward, group=0, n_turns=2, step=None, keys=None, truncated=False, action_len=2):
    ep = Episode(prompt_ids=[1], reward=reward, group_id=group, truncated=truncated, terminated=not truncated,
                 env_id="toy")
    ctx = 1
    for k in range(n_turns):
        ep.turns.append(Turn(ctx, [5] * action_len, [-1.0] * action_len, [7], step_reward=(step or [0] * n_turns)[k],
                             state_key=None if keys is None else keys[k], hidden=[float(k)]))
        ctx += action_len + 1
    return ep


class TableCritic:
    """A known critic: fixed V(s_k) per (episode, turn) and a fixed bootstrap value."""

    def __init__(self, table, bootstrap=None):
        self.table = torch.tensor(table, dtype=torch.float32)
        self.boot = None if bootstrap is None else torch.tensor(bootstrap, dtype=torch.float32)
        self.fitted = 0

    def values(self, feats, mask):
        return self.table * mask

    def bootstrap(self, final, batch):
        return torch.zeros(batch.size) if self.boot is None else self.boot * batch.truncated.float()

    def fit(self, feats, mask, targets, old=None):
        self.fitted += 1
        return {"critic_loss": 0.0}


def close(t, expected, atol=1e-5):
    expected = torch.as_tensor(expected, dtype=torch.float32)
    assert torch.allclose(t.float(), expected, atol=atol), (t, expected)


def turn_values(credit, batch):
    """(B, K) advantage of each turn, read back from the token layout (first action token)."""
    return torch.stack([credit.advantages[b, batch.turn_pos[b].clamp(min=0) + 1]
                        for b in range(batch.size)]) * batch.turn_mask


def assert_observations_zero(credit, batch):
    assert (credit.advantages[batch.action_mask == 0] == 0).all()


# -- shared pieces ------------------------------------------------------------------------------


def test_turn_rewards_and_returns():
    batch = make_batch([episode(1.0, n_turns=3, step=[0.1, 0.2, 0.3])], 0)
    assert turn_rewards(batch, False).tolist() == [[0, 0, 1]]
    r = turn_rewards(batch, True)
    close(r, [[0.1, 0.2, 1.3]])
    close(discounted_returns(r, batch.turn_mask, 0.5), [[0.1 + 0.5 * 0.2 + 0.25 * 1.3, 0.2 + 0.5 * 1.3, 1.3]])


def test_gae_terminated_vs_truncated_by_hand():
    mask = torch.ones(1, 3, dtype=torch.bool)
    V = torch.tensor([[0.5, 0.6, 0.8]])
    # terminated, R = 1: no bootstrap
    A = gae(torch.tensor([[0.0, 0.0, 1.0]]), V, mask, torch.tensor([0.0]), gamma=0.9, lam=0.5)
    close(A, [[0.04 + 0.45 * 0.21, 0.12 + 0.45 * 0.2, 0.2]])
    # truncated, R = 0: V(s_4) = 0.7 bootstraps the future
    A = gae(torch.zeros(1, 3), V, mask, torch.tensor([0.7]), gamma=0.9, lam=0.5)
    d2 = 0.9 * 0.7 - 0.8
    a1 = 0.12 + 0.45 * d2
    close(A, [[0.04 + 0.45 * a1, a1, d2]])
    # lam = 1, gamma = 1: A_k = G_k - V_k (Monte Carlo)
    A = gae(torch.tensor([[0.0, 0.0, 1.0]]), V, mask, torch.tensor([0.0]), gamma=1.0, lam=1.0)
    close(A, [[0.5, 0.4, 0.2]])


# -- turn-ppo -----------------------------------------------------------------------------------


def test_turn_ppo_assigns_gae_per_turn_and_bootstraps_only_truncated():
    eps = [episode(1.0, n_turns=3), episode(0.0, n_turns=3, truncated=True)]
    batch = make_batch(eps, 0)
    critic = TableCritic([[0.5, 0.6, 0.8], [0.5, 0.6, 0.8]], bootstrap=[0.7, 0.7])
    tp = TurnPPO(TurnPPOConfig(gamma=0.9, lam=0.5, whiten=False, warmup_updates=0), critic=critic)
    credit = tp.assign(batch, tp.fit(batch))
    d2 = 0.9 * 0.7 - 0.8
    a1 = 0.12 + 0.45 * d2
    close(turn_values(credit, batch), [[0.1345, 0.21, 0.2], [0.04 + 0.45 * a1, a1, d2]])
    assert credit.row_weight.tolist() == [1, 1] and critic.fitted == 1
    assert_observations_zero(credit, batch)


def test_turn_ppo_whitens_over_turns_and_warms_up_critic_only():
    batch = make_batch([episode(1.0, n_turns=1), episode(0.0, n_turns=3)], 0)
    critic = TableCritic([[0.0, 0, 0], [0.0, 0.0, 0.0]])
    tp = TurnPPO(TurnPPOConfig(gamma=1.0, lam=1.0, warmup_updates=2, warmup_ev=2.0), critic=critic)
    weights = []
    for _ in range(3):
        c = tp.assign(batch, tp.fit(batch))
        weights.append(c.row_weight.tolist())
    assert weights == [[0, 0], [0, 0], [1, 1]]  # two critic-only updates, then the policy moves
    vals = turn_values(c, batch)[batch.turn_mask]
    # raw A over the 4 turns: [1, 0, 0, 0] -> whitened
    raw = torch.tensor([1.0, 0, 0, 0])
    close(vals, ((raw - raw.mean()) / (raw.std() + 1e-8)).tolist(), 1e-5)


# -- arpo ---------------------------------------------------------------------------------------


def arpo_batch():
    return make_batch([episode(1.0), episode(0.0)], 0)


def test_arpo_gate_closed_gives_grpo():
    batch = arpo_batch()
    critic = TableCritic([[0.5, 0.5], [0.5, 0.5]])  # EV 0: the gate stays shut
    a = ARPO(ARPOConfig(ramp_updates=1), critic=critic)
    m = a.fit(batch)
    credit = a.assign(batch, m)
    assert m.metrics["critic_ev"] == pytest.approx(0.0) and credit.metrics["arpo_lambda"] == 0.0
    close(turn_values(credit, batch), [[S, S], [-S, -S]], 1e-5)
    assert_observations_zero(credit, batch)


def test_arpo_reweights_by_value_change_once_gated():
    batch = arpo_batch()
    critic = TableCritic([[0.5, 0.9], [0.5, 0.1]])  # EV 0.48 on G = [1, 1, 0, 0]
    a = ARPO(ARPOConfig(lam_max=0.5, ramp_updates=1, ev_gate=0.2), critic=critic)
    m = a.fit(batch)
    credit = a.assign(batch, m)
    assert m.metrics["critic_ev"] == pytest.approx(0.48)
    # d = [0.4, 0.1] and [-0.4, -0.1] -> w = [0.8, 0.2]; w~ = 0.25 + 0.5 w = [0.65, 0.35]; A_ik = 2 w~ A_i
    close(turn_values(credit, batch), [[1.3 * S, 0.7 * S], [-1.3 * S, -0.7 * S]], 1e-5)
    # the turn-mean of A_ik is A_i
    assert turn_values(credit, batch).mean(1).tolist() == pytest.approx([S, -S], abs=1e-5)


def test_arpo_lambda_ramps_over_updates():
    batch = arpo_batch()
    a = ARPO(ARPOConfig(lam_max=0.6, ramp_updates=3), critic=TableCritic([[0.5, 0.9], [0.5, 0.1]]))
    lams = []
    for _ in range(4):
        lams.append(a.assign(batch, a.fit(batch)).metrics["arpo_lambda"])
    assert lams == pytest.approx([0.2, 0.4, 0.6, 0.6])


def test_arpo_signed_ablation():
    batch = arpo_batch()
    a = ARPO(ARPOConfig(signed=True, omega=1.0, ramp_updates=1), critic=TableCritic([[0.5, 0.9], [0.5, 0.1]]))
    credit = a.assign(batch, a.fit(batch))
    d = torch.tensor([0.4, 0.1, -0.4, -0.1])
    z = ((d - d.mean()) / (d.std() + 1e-6)).view(2, 2)
    expect = torch.tensor([[S, S], [-S, -S]]) + z
    close(turn_values(credit, batch), expect.tolist(), 1e-5)


def test_arpo_group_of_one_keeps_its_reward():
    batch = make_batch([episode(1.0, group=5)], 0)
    a = ARPO(ARPOConfig(ramp_updates=1), critic=TableCritic([[0.5, 0.9]]))
    close(turn_values(a.assign(batch, a.fit(batch)), batch), [[1.0, 1.0]])


# -- steppo -------------------------------------------------------------------------------------


def test_steppo_env_prm_reward_to_go_of_group_normalised_scores():
    batch = make_batch([episode(1.0, step=[0.5, 0.5]), episode(0.0, step=[0.5, 0.0])], 0)
    s = StepPO(StepPOConfig(prm="env"))
    m = s.fit(batch)
    credit = s.assign(batch, m)
    # scores [0.5, 0.5, 0.5, 0] -> mean 0.375, std 0.25 -> [0.5, 0.5, 0.5, -1.5]; to-go [1, 0.5], [-1, -1.5]
    close(turn_values(credit, batch), [[S + 1.0, S + 0.5], [-S - 1.0, -S - 1.5]], 1e-5)
    assert m.metrics["prm_outcome_corr"] == pytest.approx(1.0)  # summed scores 1.0 vs 0.5 against outcomes 1 vs 0
    assert_observations_zero(credit, batch)


def test_steppo_implicit_prm_sums_log_ratio_per_turn():
    batch = make_batch([episode(1.0), episode(0.0)], 0)
    batch = batch.with_(ref_logp=batch.behaviour_logp.clone())
    batch.ref_logp[0, 1:3] -= 0.5  # turn 0 of episode 0: log(pi/ref) = +0.5 on each of its 2 tokens
    s = StepPO(StepPOConfig(prm="implicit", implicit_beta=0.1))
    close(s.score(batch), [[0.1, 0.0], [0.0, 0.0]])


def test_steppo_learned_prm_learns_outcome_from_states():
    torch.manual_seed(0)
    eps = [episode(float(i % 2), group=i // 2) for i in range(16)]
    for i, ep in enumerate(eps):
        for t in ep.turns:
            t.hidden = [float(i % 2), 1.0]  # a state feature that predicts the outcome
    batch = make_batch(eps, 0)
    from agentrl.credit import CriticConfig

    s = StepPO(StepPOConfig(prm="learned", head=CriticConfig(epochs=200, lr=0.05, value_clip=None)), hidden_size=2)
    s.fit(batch)
    scores = s.score(batch)
    assert (scores[1::2].mean() - scores[0::2].mean()) > 0.5
    assert s.fit(batch).metrics["prm_outcome_corr"] > 0.9


# -- gigpo --------------------------------------------------------------------------------------


def test_gigpo_step_groups_by_state_key():
    eps = [
        episode(1.0, n_turns=2, keys=["s0", "s1"]),
        episode(1.0, n_turns=3, keys=["s0", "s2", "s1"]),
        episode(0.0, n_turns=2, keys=["s0", "s3"]),
    ]
    batch = make_batch(eps, 0)
    g = GiGPO(GiGPOConfig(gamma=0.5, omega=1.0))
    credit = g.assign(batch, g.fit(batch))
    A = torch.tensor([1.0, 1.0, 0.0])
    A = (A - A.mean()) / (A.std() + 1e-6)
    # step returns: s0 -> [0.5, 0.25, 0] -> standardised [1, 0, -1]; s1 -> [1, 1] -> 0; s2, s3 alone -> 0
    expect = [[A[0] + 1.0, A[0] + 0.0, 0.0], [A[1] + 0.0, A[1], A[1]], [A[2] - 1.0, A[2], 0.0]]
    close(turn_values(credit, batch), torch.tensor(expect).tolist(), 1e-4)
    assert credit.metrics["state_recurrence"] == pytest.approx(5 / 7)
    assert_observations_zero(credit, batch)


def test_gigpo_unique_states_reduce_to_grpo_and_missing_keys_fail():
    batch = make_batch([episode(1.0, keys=["a", "b"]), episode(0.0, keys=["c", "d"])], 0)
    close(turn_values(GiGPO().assign(batch, Fit()), batch), [[S, S], [-S, -S]], 1e-5)
    with pytest.raises(ValueError, match="gigpo needs state_key"):
        GiGPO().assign(make_batch([episode(1.0), episode(0.0)], 0), Fit())


def test_every_assigner_is_registered_with_config_and_description():
    assert set(ASSIGNERS) == {"grpo", "arpo", "steppo", "turn-ppo", "gigpo", "distill"}
    for name, spec in ASSIGNERS.items():
        assert spec.name == name and spec.description and spec.config().algo == name and callable(spec.load())
    # what each declares, as its module's maths says
    assert {n for n, s in ASSIGNERS.items() if s.turn_level} == {"arpo", "steppo", "turn-ppo", "gigpo"}
    assert {n for n, s in ASSIGNERS.items() if s.reads_hidden()} == {"arpo", "turn-ppo"}  # steppo's default PRM is env
    assert ASSIGNERS["steppo"].reads_hidden(StepPOConfig(prm="learned"))
    assert {n for n, s in ASSIGNERS.items() if s.resampling} == {"grpo", "arpo", "steppo", "gigpo"}
    assert {n for n, s in ASSIGNERS.items() if s.reads_teacher} == {"distill"}
