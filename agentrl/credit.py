"""The credit-assigner protocol and the pieces assigners share.

An assigner turns a `TurnBatch` into per-token advantages. It may own a network (a critic, a
process reward model) that it trains in `fit` from the same batch; `assign` then returns the
advantages, a per-episode weight (0 drops an episode from the loss: dynamic sampling, masked
truncations) and diagnostics for the `credit/` metrics. The trainer looks assigners up in
`agentrl.algorithms.ASSIGNERS` and never branches on which one it holds.

>>> import torch
>>> A, stats = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
>>> [round(a, 4) for a in A.tolist()], stats["zero_adv_groups"], stats["all_pass_groups"]
([0.7071, -0.7071, 0.0, 0.0], 1, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from agentrl.algorithms.configs import CriticConfig
from agentrl.core import Episode
from agentrl.store import TurnBatch, segment_batch


@dataclass
class Credit:
    """What an assigner returns."""

    advantages: torch.Tensor  # (B, T); 0 off action tokens
    row_weight: torch.Tensor  # (B,) 1 to train on the episode, 0 to leave it out
    metrics: dict[str, float] = field(default_factory=dict)  # logged under credit/


@dataclass(frozen=True)
class Fit:
    """What `fit` learned from a batch that `assign` needs, passed to it explicitly: the metrics, the
    per-turn quantities computed under the heads as they were before fitting (held-out estimates),
    and whether the policy trains on this batch (False while a critic warms up)."""

    metrics: dict[str, float] = field(default_factory=dict)
    per_turn: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> (B, K)
    trains_policy: bool = True


class CreditAssigner(Protocol):
    """What the trainer calls; the registry entry (`agentrl.algorithms.AssignerSpec`) holds its name and options.

    `fit` may train the assigner's own networks (a critic, a PRM) on the batch; `assign` turns the
    batch and what `fit` returned into advantages. Neither writes into the batch.

    Optional, with defaults (`assigner_state`, `load_assigner_state`, `set_options`): ``state_dict()`` /
    ``load_state_dict(state)`` for what a checkpoint must keep (a critic's weights; an assigner without
    them keeps nothing), and ``set_options(config)`` for options an intervention changed (default: the
    new options replace ``cfg``)."""

    def fit(self, batch: TurnBatch) -> Fit: ...

    def assign(self, batch: TurnBatch, fit: Fit) -> Credit: ...


def assigner_state(assigner: Any) -> dict[str, Any]:
    """What a checkpoint keeps of `assigner`: its ``state_dict()``, or nothing for one without state."""
    save = getattr(assigner, "state_dict", None)
    return save() if callable(save) else {}


def load_assigner_state(assigner: Any, state: dict[str, Any]) -> None:
    """Give `assigner` back what `assigner_state` saved. A checkpoint that holds state for an assigner that
    cannot take it is refused (a resumed run is the same run)."""
    load = getattr(assigner, "load_state_dict", None)
    if callable(load):
        load(state)
    elif state:
        raise ValueError(f"the checkpoint holds state for the assigner ({', '.join(map(str, state))}), but "
                         f"{type(assigner).__name__} has no load_state_dict to take it")


def set_options(assigner: Any, config: Any) -> None:
    """Hand `assigner` options an intervention changed: its ``set_options(config)``, else ``cfg = config``."""
    setter = getattr(assigner, "set_options", None)
    if callable(setter):
        setter(config)
    else:
        assigner.cfg = config


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, std_norm: bool = True, baseline: str = "mean", eps: float = 1e-6
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Group-relative outcome advantages (docs/algorithms.md, grpo).

    mean baseline: A = (R - mean) / (std + eps), std unbiased as torch.std; without std_norm
    A = R - mean; "rloo": A = G / (G - 1) * (R - mean), the leave-one-out baseline. A group of one
    has no baseline: A = R. Groups whose rewards are all equal are counted (all-pass: every episode
    passed, R >= 1; all-fail: none did) and get A = 0.
    """
    A = torch.zeros_like(rewards, dtype=torch.float32)  # (B,)
    zero = torch.zeros_like(rewards, dtype=torch.bool)  # (B,) episode sits in a zero-advantage group
    n_groups = n_zero = n_pass = n_fail = 0
    stds = []
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero(as_tuple=True)[0]
        r = rewards[idx].float()
        n_groups += 1
        if len(idx) == 1:
            A[idx] = r
            continue
        stds.append(r.std().item())
        if torch.all(r == r[0]):
            n_zero += 1
            zero[idx] = True
            n_pass += int(r[0] >= 1.0)
            n_fail += int(r[0] <= 0.0)
            continue
        centred = r - r.mean()
        if baseline == "rloo":
            A[idx] = centred * len(idx) / (len(idx) - 1)
        elif std_norm:
            A[idx] = centred / (r.std() + eps)
        else:
            A[idx] = centred
    stats = {
        "groups": n_groups,
        "zero_adv_groups": n_zero,
        "all_pass_groups": n_pass,
        "all_fail_groups": n_fail,
        "zero_adv_frac": n_zero / max(n_groups, 1),
        "reward_std_in_group": sum(stds) / len(stds) if stds else 0.0,
        "zero_mask": zero,
    }
    return A, stats


def state_groups(episodes: Sequence[Episode]) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """GiGPO's step groups: every turn, as (episode index, turn index), under its (group_id, state_key); a
    turn without a state_key is in none. The probe's state recurrence and gigpo's credit read the same groups.

    >>> from agentrl.core import Turn
    >>> eps = [Episode([0], [Turn(0, [1], [0.0], [1], state_key=k) for k in keys], group_id=0)
    ...        for keys in (["a", "b"], ["a", "c"])]
    >>> groups = state_groups(eps)
    >>> groups[(0, "a")], state_recurrence(groups)
    ([(0, 0), (1, 0)], 0.5)
    """
    groups: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for b, episode in enumerate(episodes):
        for k, turn in enumerate(episode.turns):
            if turn.state_key is not None:
                groups.setdefault((episode.group_id, turn.state_key), []).append((b, k))
    return groups


def state_recurrence(groups: dict[tuple[int, str], list[tuple[int, int]]]) -> float | None:
    """The share of the grouped turns whose state another turn of their group shares (a step group of two or
    more, where gigpo has a step advantage to give); None when no turn has a state_key."""
    n = sum(len(members) for members in groups.values())
    return sum(len(m) for m in groups.values() if len(m) > 1) / n if n else None


def tokens_from_episodes(adv: torch.Tensor, batch: TurnBatch) -> torch.Tensor:
    """(B,) episode advantages -> (B, T): every action token of episode b gets adv[b]."""
    return adv[:, None] * batch.action_mask


def tokens_from_turns(adv: torch.Tensor, batch: TurnBatch) -> torch.Tensor:
    """(B, K) turn advantages -> (B, T): every action token of turn k gets adv[b, k]."""
    idx = batch.turn_index.clamp(min=0)  # (B, T)
    return adv.gather(1, idx) * batch.action_mask


# --------------------------------------------------------------------------------------------
# Turn-level pieces shared by arpo, steppo, turn-ppo and gigpo


def turn_rewards(batch: TurnBatch, use_step_rewards: bool) -> torch.Tensor:
    """(B, K) per-turn rewards: the step reward (or 0) on every turn, plus R on the last turn."""
    r = batch.step_rewards.clone() if use_step_rewards else torch.zeros_like(batch.step_rewards)
    last = (batch.num_turns - 1).clamp(min=0)  # (B,)
    has = batch.num_turns > 0
    r[has, last[has]] += batch.rewards[has]
    return r * batch.turn_mask


def discounted_returns(r: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                       bootstrap: torch.Tensor | None = None) -> torch.Tensor:
    """(B, K) G_k = sum_{k' >= k} gamma^(k'-k) r_k' (+ gamma^(K-k) * bootstrap), over valid turns."""
    B, K = r.shape
    G = torch.zeros_like(r)
    nxt = bootstrap.clone().float() if bootstrap is not None else torch.zeros(B)
    for k in range(K - 1, -1, -1):
        valid = mask[:, k]
        G[:, k] = torch.where(valid, r[:, k] + gamma * nxt, 0.0)
        nxt = torch.where(valid, G[:, k], nxt)
    return G


def value_changes(r: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, K) d_k = r_k + V(s_{k+1}) - V(s_k) over valid turns, V(s_{K+1}) = 0 (R is folded into r_K):
    how far each turn moved the expected value (arpo's turn weights, the probe's concentration).

    >>> value_changes(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.75]]), torch.tensor([[True, True]])).tolist()
    [[0.25, 0.25]]
    """
    m = mask.to(values.dtype)
    v = values * m
    nxt = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)  # V(s_{k+1}); 0 past the last turn
    return (r + nxt - v) * m


def value_change_concentration(d: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) max_k |d_k| / sum_k |d_k|: 1/K when value moves evenly, 1 when one turn moves it all, and
    1/K when nothing moves (arpo's weights fall back to uniform then).

    >>> d = torch.tensor([[0.0, -0.3, 0.1], [0.0, 0.0, 0.0]])
    >>> [round(c, 4) for c in value_change_concentration(d, torch.ones(2, 3, dtype=torch.bool)).tolist()]
    [0.75, 0.3333]
    """
    a = d.abs() * mask
    total = a.sum(1)
    K = mask.sum(1).clamp(min=1).to(d.dtype)
    return torch.where(total > 1e-8, a.max(1).values / total.clamp(min=1e-8), 1.0 / K)


def gae(r: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, bootstrap: torch.Tensor, gamma: float,
        lam: float) -> torch.Tensor:
    """(B, K) GAE over turns: d_k = r_k + gamma V(s_{k+1}) - V(s_k), A_k = sum_l (gamma lam)^l d_{k+l}.

    V(s_{K+1}) is `bootstrap` (the critic's value after the last turn when the episode was
    truncated; 0 when it terminated: there is no future to value).
    """
    B, K = r.shape
    A = torch.zeros_like(r)
    next_v, next_a = bootstrap.float().clone(), torch.zeros(B)
    for k in range(K - 1, -1, -1):
        valid = mask[:, k]
        delta = r[:, k] + gamma * next_v - values[:, k]
        a = delta + gamma * lam * next_a
        A[:, k] = torch.where(valid, a, 0.0)
        next_v = torch.where(valid, values[:, k], next_v)
        next_a = torch.where(valid, a, next_a)
    return A


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - pred) / Var(target); 0 when the target does not vary."""
    var = target.var(unbiased=False)
    if target.numel() < 2 or var < 1e-12:
        return 0.0
    return float(1 - (target - pred).var(unbiased=False) / var)


class TurnHead(torch.nn.Module):
    """MLP: hidden state (H) -> scalar. Used as a value critic (MSE) or a PRM (BCE on logits)."""

    def __init__(self, in_dim: int, cfg: CriticConfig, seed: int = 0):
        super().__init__()
        g = torch.random.fork_rng()
        with g:
            torch.manual_seed(seed)
            self.net = torch.nn.Sequential(
                torch.nn.LayerNorm(in_dim), torch.nn.Linear(in_dim, cfg.width), torch.nn.Tanh(),
                torch.nn.Linear(cfg.width, 1)
            )
        self.cfg = cfg
        self.opt = torch.optim.Adam(self.parameters(), lr=cfg.lr)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def train_state(self) -> dict[str, Any]:
        """The head's weights and its optimizer's moments (what its next `fit` starts from), for checkpoints."""
        return {"net": self.state_dict(), "opt": self.opt.state_dict()}

    def load_train_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])

    def fit(self, x: torch.Tensor, y: torch.Tensor, old: torch.Tensor | None = None, loss: str = "mse") -> float:
        """Train on examples (N, H) -> (N,); returns the last epoch's mean loss."""
        if len(x) == 0:
            return 0.0
        last = 0.0
        for _ in range(self.cfg.epochs):
            perm = torch.randperm(len(x))
            total = 0.0
            for idx in perm.split(self.cfg.minibatch):
                pred = self(x[idx])
                if loss == "bce":
                    err = torch.nn.functional.binary_cross_entropy_with_logits(pred, y[idx])
                elif old is not None and self.cfg.value_clip is not None:
                    clipped = old[idx] + (pred - old[idx]).clamp(-self.cfg.value_clip, self.cfg.value_clip)
                    err = torch.max((pred - y[idx]) ** 2, (clipped - y[idx]) ** 2).mean()
                else:
                    err = ((pred - y[idx]) ** 2).mean()
                self.opt.zero_grad(set_to_none=True)
                err.backward()
                self.opt.step()
                total += err.item() * len(idx)
            last = total / len(x)
        return last


def turn_features(batch: TurnBatch, model: torch.nn.Module | None) -> torch.Tensor:
    """(B, K, H) hidden state before each turn's action: captured at rollout, else one forward over the
    contexts the actions were sampled in (the segments, where an episode has several: after a compaction
    the state a turn starts from is the compacted context, not the appended history)."""
    if batch.turn_hidden is not None:
        return batch.turn_hidden
    if model is None:
        raise ValueError("turn features: the batch carries no hidden states and no policy was given")
    from agentrl.policy import token_stats

    seg = segment_batch(batch)
    if seg is not batch:
        with torch.inference_mode():
            hs = token_stats(model, seg.input_ids, seg.attention_mask, hidden=True).hidden  # (S, T', H)
        s, t = (seg.seg_pos >= 0).nonzero(as_tuple=True)  # every action token of every segment
        b, k, p = seg.seg_row[s], seg.turn_index[s, t], seg.seg_pos[s, t]
        first = p == batch.turn_pos[b, k] + 1  # a turn's first action token: its preceding state is the context's
        out = torch.zeros(batch.size, batch.turn_pos.shape[1], hs.shape[-1], device=hs.device)
        out[b[first].to(hs.device), k[first].to(hs.device)] = hs[s[first].to(hs.device), t[first].to(hs.device)].float()
        return out
    with torch.inference_mode():
        # (B, T, H); hs[:, t] precedes token t
        hs = token_stats(model, batch.input_ids, batch.attention_mask, hidden=True).hidden
    # the first action token's position: its preceding state is the context's last
    pos = (batch.turn_pos + 1).clamp(min=0)
    return hs.gather(1, pos[..., None].expand(-1, -1, hs.shape[-1])).float() * batch.turn_mask[..., None]


def final_features(batch: TurnBatch, model: torch.nn.Module | None, pad_id: int) -> torch.Tensor | None:
    """(B, H) hidden state after the last observation, for truncated episodes (others zero).

    A truncated episode's future is valued by the critic at this state (the bootstrap); it costs
    one forward over the truncated episodes only.
    """
    rows = batch.truncated.nonzero(as_tuple=True)[0].tolist()
    if not rows or model is None:
        return None

    # the last segment (the context the model was last given: the whole episode unless it was compacted or the
    # template rewrote it) and the last observation
    seqs = [batch.episodes[b].segments()[-1][0] + (batch.episodes[b].turns[-1].obs_ids if batch.episodes[b].turns
                                                  else []) for b in rows]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model(input_ids=ids.to(device), attention_mask=att.to(device), output_hidden_states=True, use_cache=False)
    last = att.sum(1) - 1
    h = out.hidden_states[-1][torch.arange(len(seqs)), last.to(device)].float().cpu()  # (R, H)
    full = torch.zeros(batch.size, h.shape[-1])
    full[rows] = h
    return full


class TurnCritic:
    """V(s_k) on turn features; tracks its explained variance on data it has not been fit on."""

    def __init__(self, in_dim: int, cfg: CriticConfig | None = None, seed: int = 0):
        self.cfg = cfg or CriticConfig()
        self.head = TurnHead(in_dim, self.cfg, seed)

    @torch.no_grad()
    def values(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, K, H) -> (B, K), 0 on empty turn slots."""
        return self.head(feats) * mask

    @torch.no_grad()
    def bootstrap(self, final: torch.Tensor | None, batch: TurnBatch) -> torch.Tensor:
        if final is None:
            return torch.zeros(batch.size)
        return self.head(final) * batch.truncated.float()

    def state_dict(self) -> dict[str, Any]:
        return self.head.train_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head.load_train_state(state)

    def fit(self, feats: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor,
            old: torch.Tensor | None = None) -> dict[str, float]:
        m = mask.bool()
        loss = self.head.fit(feats[m], targets[m].float(), None if old is None else old[m].float())
        return {"critic_loss": loss}
