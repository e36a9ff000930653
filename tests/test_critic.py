"""The turn critic's parts, with hand-computed answers: explained variance, `TurnHead.fit` and its
clipped value loss, `TurnCritic`, `turn_features` and `final_features` (the truncation bootstrap).

Every turn-ppo/arpo oracle in test_assigners.py swaps in a table critic, so these are the only tests of
the network side. The last two pin the alignment of the hidden state the torch engine captures during
a rollout with the one `turn_features` recomputes from the stored episode: an off-by-one there would
feed every critic the state after the action's first token, and nothing else would notice.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from agentrl.core import Episode, Turn
from agentrl.credit import CriticConfig, TurnCritic, TurnHead, explained_variance, final_features, turn_features
from agentrl.engines import SamplingConfig, TorchEngine
from agentrl.policy import token_stats
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.store import make_batch

# -- explained variance ---------------------------------------------------------------------------


def test_explained_variance_by_hand():
    y = torch.tensor([1.0, 2.0, 3.0, 4.0])  # population variance 1.25
    assert explained_variance(y.clone(), y) == pytest.approx(1.0)
    assert explained_variance(y + 5.0, y) == pytest.approx(1.0)  # an offset is not explained variance lost
    assert explained_variance(torch.full((4,), 2.5), y) == pytest.approx(0.0)  # the mean explains nothing
    # residual [-1, 0, 0, 1]: variance 0.5 -> 1 - 0.5 / 1.25
    assert explained_variance(torch.tensor([2.0, 2.0, 3.0, 3.0]), y) == pytest.approx(0.6)
    # residual [-3, -1, 1, 3]: variance 5 -> 1 - 5 / 1.25, worse than predicting the mean
    assert explained_variance(torch.tensor([4.0, 3.0, 2.0, 1.0]), y) == pytest.approx(-3.0)
    assert explained_variance(torch.tensor([0.0, 9.0]), torch.tensor([1.0, 1.0])) == 0.0  # nothing to explain
    assert explained_variance(torch.tensor([3.0]), torch.tensor([1.0])) == 0.0  # one sample has no variance


# -- TurnHead.fit ---------------------------------------------------------------------------------


def constant_head(value: float, in_dim: int = 3, frozen: bool = False, **cfg) -> TurnHead:
    """A head that outputs `value` for every input (last layer zeroed), so its loss is hand-computable;
    `frozen`: its optimizer steps by 0, so every minibatch sees that same output."""
    head = TurnHead(in_dim, CriticConfig(width=8, **cfg))
    with torch.no_grad():
        head.net[-1].weight.zero_()
        head.net[-1].bias.fill_(value)
    if frozen:
        for group in head.opt.param_groups:
            group["lr"] = 0.0
    return head


def params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def test_clipped_value_loss_by_hand():
    """Prediction 0.5 everywhere, clip 0.2; loss per example max((p - y)^2, (old + clip(p - old) - y)^2):
    old 0, y 1:    p moved 0.5 past old -> clipped 0.2: max(0.25, 0.64) = 0.64
    old 0, y 0.1:  clipped 0.2:                           max(0.16, 0.01) = 0.16
    old 0.4, y 0:  moved 0.1, inside the clip:            max(0.25, 0.25) = 0.25
    old 1, y 2:    moved -0.5 -> clipped 0.8:             max(2.25, 1.44) = 2.25
    With one minibatch and one epoch, fit returns the loss before its step."""
    x = torch.randn(4, 3)
    old = torch.tensor([0.0, 0.0, 0.4, 1.0])
    y = torch.tensor([1.0, 0.1, 0.0, 2.0])
    head = constant_head(0.5, epochs=1, minibatch=4, value_clip=0.2)
    assert head.fit(x, y, old) == pytest.approx((0.64 + 0.16 + 0.25 + 2.25) / 4)
    mse = (0.25 + 0.16 + 0.25 + 2.25) / 4
    assert constant_head(0.5, epochs=1, minibatch=4, value_clip=0.2).fit(x, y) == pytest.approx(mse)  # no old values
    assert constant_head(0.5, epochs=1, minibatch=4, value_clip=None).fit(x, y, old) == pytest.approx(mse)


def test_clipped_value_loss_stops_the_gradient_past_the_clip():
    """PPO's value clip: a prediction that already moved further than the clip from the old value,
    towards the target, gets no gradient (the clipped term is larger and constant in p)."""
    x = torch.randn(1, 3)
    head = constant_head(0.5, epochs=3, minibatch=1, value_clip=0.2, lr=0.1)
    before = params(head)
    head.fit(x, torch.tensor([1.0]), old=torch.tensor([0.0]))
    assert all(torch.equal(a, b) for a, b in zip(before, params(head)))
    # the same prediction with the target behind it: the unclipped term wins and the head moves towards 0.1
    head.fit(x, torch.tensor([0.1]), old=torch.tensor([0.0]))
    assert not all(torch.equal(a, b) for a, b in zip(before, params(head)))
    with torch.no_grad():
        assert head(x).item() < 0.5


def test_fit_loss_is_the_mean_over_examples_not_over_minibatches():
    """A frozen head keeps the prediction at 0: squared errors 0, 1, 4, 9, 16 -> mean 6, whatever the shuffle
    (minibatches of 2, 2 and 1; a mean of minibatch means would give 0.5 + 6.5 + 16 over 3 = 7.67 for one order)."""
    head = constant_head(0.0, frozen=True, epochs=2, minibatch=2, value_clip=None)
    torch.manual_seed(0)
    assert head.fit(torch.randn(5, 3), torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])) == pytest.approx(6.0)


def test_fit_bce_loss_on_logits_by_hand():
    head = constant_head(1.0, frozen=True, epochs=1, minibatch=8)  # logit 1 everywhere
    loss = head.fit(torch.randn(2, 3), torch.tensor([1.0, 0.0]), loss="bce")
    # -log sigmoid(1) = log(1 + e^-1); -log(1 - sigmoid(1)) = log(1 + e)
    assert loss == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(1))) / 2, rel=1e-6)


def test_fit_on_nothing_is_a_no_op():
    head = constant_head(0.5)
    before = params(head)
    assert head.fit(torch.zeros(0, 3), torch.zeros(0)) == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, params(head)))


def test_fit_learns_a_linear_value():
    torch.manual_seed(0)
    x = torch.randn(128, 8)
    y = x @ torch.linspace(-1, 1, 8) + 0.5
    head = TurnHead(8, CriticConfig(width=32, lr=1e-2, epochs=300, minibatch=128, value_clip=None))
    with torch.no_grad():
        ev_before = explained_variance(head(x), y)
    head.fit(x, y)
    with torch.no_grad():
        assert ev_before < 0.5 and explained_variance(head(x), y) > 0.95


def test_head_seed_is_reproducible_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b = TurnHead(4, CriticConfig(), seed=1), TurnHead(4, CriticConfig(), seed=1)
    c = TurnHead(4, CriticConfig(), seed=2)
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.net[1].weight, c.net[1].weight)


# -- TurnCritic -----------------------------------------------------------------------------------


def test_critic_values_and_bootstrap_are_masked():
    critic = TurnCritic(3, CriticConfig(width=8))
    critic.head = constant_head(0.5)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert critic.values(torch.randn(2, 3, 3), mask).tolist() == [[0.5, 0.5, 0.0], [0.5, 0.0, 0.0]]
    batch = SimpleNamespace(size=2, truncated=torch.tensor([False, True]))
    assert critic.bootstrap(None, batch).tolist() == [0.0, 0.0]  # no truncated episode: nothing to value
    assert critic.bootstrap(torch.randn(2, 3), batch).tolist() == [0.0, 0.5]  # a terminated episode has no future


def test_critic_fits_only_the_turns_that_exist():
    """Empty turn slots (padding, target 1e6) must not reach the loss nor the gradient."""
    cfg = CriticConfig(width=8, epochs=3, minibatch=2)
    feats = torch.randn(2, 3, 4)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    targets = torch.tensor([[1.0, 2.0, 1e6], [3.0, 1e6, 1e6]])
    critic = TurnCritic(4, cfg, seed=5)
    alone = TurnHead(4, cfg, seed=5)  # the same head fit on the three real turns only
    torch.manual_seed(0)
    critic.fit(feats, mask, targets)
    torch.manual_seed(0)
    alone.fit(feats[mask], torch.tensor([1.0, 2.0, 3.0]))
    assert all(torch.allclose(p, q) for p, q in zip(critic.head.parameters(), alone.parameters()))
    # and by hand: a frozen zero head scores (1 + 4 + 9) / 3 on the real turns
    still = TurnCritic(4, CriticConfig(width=8))
    still.head = constant_head(0.0, in_dim=4, frozen=True, epochs=1, minibatch=8)
    assert still.fit(feats, mask, targets)["critic_loss"] == pytest.approx(14 / 3)


# -- turn_features and final_features on a model whose state is (token, position) ------------------


class Echo(torch.nn.Module):
    """A stand-in causal LM whose last hidden state at position t is (input_ids[t], t): which token a
    feature was read at can be seen in the feature itself."""

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))  # final_features asks for the model's device

    def forward(self, input_ids, attention_mask, position_ids=None, output_hidden_states=False, use_cache=False):
        pos = attention_mask.long().cumsum(1) - 1  # (B, T)
        hidden = torch.stack([input_ids.float(), pos.float()], dim=-1)  # (B, T, 2)
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, 64), hidden_states=(hidden,))


def hand_episodes() -> list[Episode]:
    """ep0 terminated: [1 2 3] a[10 11] o[20 21] a[12] (o[22] ends it)
    ep1 truncated:  [4 5] a[13] (o[23 24 25] is the state it stopped in)
    ep2 truncated:  [6] a[14 15] o[26] a[16] (o[27 28])"""
    return [
        Episode([1, 2, 3], [Turn(3, [10, 11], [0.0, 0.0], [20, 21]), Turn(7, [12], [0.0], [22])], reward=1.0,
                terminated=True),
        Episode([4, 5], [Turn(2, [13], [0.0], [23, 24, 25])], truncated=True),
        Episode([6], [Turn(1, [14, 15], [0.0, 0.0], [26]), Turn(4, [16], [0.0], [27, 28])], truncated=True),
    ]


def test_turn_features_read_the_last_context_token_before_each_action():
    batch = make_batch(hand_episodes(), pad_id=0)
    feats = turn_features(batch, Echo())
    assert feats.tolist() == [
        [[3.0, 2.0], [21.0, 6.0]],  # before a[10 11]: token 3 at position 2; before a[12]: token 21 at 6
        [[5.0, 1.0], [0.0, 0.0]],  # one turn: the second slot is empty
        [[6.0, 0.0], [26.0, 3.0]],
    ]


def test_turn_features_use_captured_states_and_refuse_to_guess():
    eps = hand_episodes()
    for e in eps:
        for k, t in enumerate(e.turns):
            t.hidden = [float(k), -1.0]
    batch = make_batch(eps, pad_id=0)
    assert turn_features(batch, None) is batch.turn_hidden  # captured at rollout: no forward at all
    with pytest.raises(ValueError, match="no hidden states and no policy"):
        turn_features(replace(batch, turn_hidden=None), None)


def test_final_features_are_the_state_after_the_last_observation_of_truncated_episodes():
    batch = make_batch(hand_episodes(), pad_id=0)
    final = final_features(batch, Echo(), pad_id=0)
    # ep0 terminated: no future, zeros; ep1 stopped after o[23 24 25]: token 25 at position 5; ep2 after o[27 28]
    assert final.tolist() == [[0.0, 0.0], [25.0, 5.0], [28.0, 6.0]]
    terminated_only = make_batch(hand_episodes()[:1], pad_id=0)
    assert final_features(terminated_only, Echo(), pad_id=0) is None
    assert final_features(batch, None, pad_id=0) is None


# -- the real engine against the recomputation ----------------------------------------------------


@pytest.fixture
def captured(vault_policy):
    """A sampled rollout of the micro policy with hidden states captured by the torch engine; slack
    0, 1 and 2 give turn budgets 4, 5 and 6, so rows leave the batch at different turns."""
    torch.manual_seed(0)
    chat = vault_policy.chat
    envs = [make("agentrl/Vault-v0", locks=2, slack=s) for s in (0, 1, 2, 0, 1, 2)]
    engine = TorchEngine(vault_policy.model, SamplingConfig(max_new_tokens=12), chat.stop_ids, chat.eos_id, chat.pad_id,
                         seed=3,
                         capture_hidden=True)
    episodes, _ = rollout(envs, list(range(6)), engine, chat)
    assert len({e.num_turns for e in episodes}) > 1  # rows did leave the batch at different turns
    return episodes


def test_captured_hidden_state_equals_the_recomputed_one(vault_policy, captured):
    batch = make_batch(captured, vault_policy.chat.pad_id)
    assert batch.turn_hidden is not None and batch.turn_hidden.shape[-1] == vault_policy.model.config.hidden_size
    recomputed = turn_features(replace(batch, turn_hidden=None), vault_policy.model)  # (B, K, H)
    m = batch.turn_mask
    assert torch.allclose(recomputed[m], batch.turn_hidden[m],
                          atol=1e-4), (recomputed[m] - batch.turn_hidden[m]).abs().max()
    # the check can tell neighbours apart: the state one token later (after the action's first token)
    # is far from the captured one
    with torch.inference_mode():
        # hs[:, t] precedes t
        hs = token_stats(vault_policy.model, batch.input_ids, batch.attention_mask, hidden=True).hidden
    later = hs.gather(1, (batch.turn_pos + 2).clamp(min=0)[..., None].expand(-1, -1, hs.shape[-1]))
    assert (later[m] - batch.turn_hidden[m]).abs().amax(-1).min() > 1e-2


def test_truncation_bootstrap_is_the_state_the_next_turn_would_read(vault_policy, captured):
    """final_features of a truncated episode must equal what the engine captures as the next turn's
    state if the episode had gone on: a session opened on the whole history, last observation included."""
    chat = vault_policy.chat
    batch = make_batch(captured, chat.pad_id)
    rows = batch.truncated.nonzero(as_tuple=True)[0].tolist()
    assert rows  # the untrained policy runs out of turns
    final = final_features(batch, vault_policy.model, chat.pad_id)
    engine = TorchEngine(vault_policy.model, SamplingConfig(max_new_tokens=1), chat.stop_ids, chat.eos_id, chat.pad_id,
                         seed=0,
                         capture_hidden=True)
    histories = [captured[b].token_ids() + captured[b].turns[-1].obs_ids for b in rows]
    expected = torch.tensor([g.hidden for g in engine.open(histories).generate()])  # (R, H)
    assert torch.allclose(final[rows], expected, atol=1e-4), (final[rows] - expected).abs().max()
    assert not final[batch.terminated].any()
