"""The turn-value probe: can a critic learn V(s_k) from what the policy sees? Cross-validated ridge.

Features are the policy's hidden state before each action when the run captured it, else cheap
features every store has. Folds split whole groups, so no task is both fit and scored, and the
ridge penalty is chosen inside each training fold (nested), so the R² is not flattered by the choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from agentrl.core import Episode

CHEAP_FEATURES = ("turn / max turns", "context tokens / max", "step reward so far", "malformed so far")


def cheap_features(episodes: Sequence[Episode]) -> np.ndarray:
    """(N turns, 4) features any store has, known at the start of each turn.

    Not the episode's own length (so not "fraction of this episode done"): it is known only when
    the episode ends, and it leaks the outcome (a failing episode runs to the turn budget), which
    would flatter the probe. The turn index is scaled by the longest episode in the store instead.
    """
    k_max = max((e.num_turns for e in episodes), default=1) or 1
    c_max = max((t.context_len for e in episodes for t in e.turns), default=1) or 1
    rows = []
    for e in episodes:
        reward_so_far = malformed_so_far = 0.0
        for k, t in enumerate(e.turns):
            rows.append([k / k_max, t.context_len / c_max, reward_so_far, malformed_so_far])
            reward_so_far += t.step_reward
            malformed_so_far += t.malformed
    return np.array(rows, dtype=float).reshape(-1, len(CHEAP_FEATURES))


def hidden_features(episodes: Sequence[Episode]) -> np.ndarray | None:
    """(N turns, H) the policy's hidden state before each action, when every turn has one."""
    turns = [t for e in episodes for t in e.turns]
    if not turns or any(t.hidden is None for t in turns) or len({len(t.hidden) for t in turns}) != 1:
        return None
    return np.array([t.hidden for t in turns], dtype=float)


def ridge_fit(X: np.ndarray, y: np.ndarray, alpha: float) -> Callable[[np.ndarray], np.ndarray]:
    """Closed-form ridge on standardised features with an unpenalised intercept; returns predict.

    >>> f = ridge_fit(np.array([[0.0], [1.0], [2.0]]), np.array([1.0, 3.0, 5.0]), alpha=0.0)
    >>> f(np.array([[3.0]])).round(6).tolist()
    [7.0]
    """
    mu, sd = X.mean(0), X.std(0)
    sd = np.where(sd < 1e-8, 1.0, sd)  # a constant column contributes nothing, not a division by 0
    Z = (X - mu) / sd
    y0 = y.mean()
    w = np.linalg.solve(Z.T @ Z + alpha * np.eye(Z.shape[1]), Z.T @ (y - y0)) if Z.shape[1] else np.zeros(0)
    return lambda Xn: ((Xn - mu) / sd) @ w + y0


def group_folds(group_ids: Sequence[int], k: int, seed: int = 0) -> np.ndarray:
    """Fold of each row, whole groups to a fold (shuffled with `seed`), at most `k` folds."""
    uniq = sorted(set(group_ids))
    order = np.random.default_rng(seed).permutation(len(uniq))
    fold_of = {uniq[j]: i % k for i, j in enumerate(order)}
    return np.array([fold_of[g] for g in group_ids], dtype=int)


def choose_alpha(X: np.ndarray, y: np.ndarray, groups: np.ndarray, alphas: Sequence[float], k: int = 3) -> float:
    """The penalty with the least squared error over an inner group k-fold of (X, y)."""
    uniq = np.unique(groups)
    if len(uniq) < 2:
        return float(max(alphas))  # nothing to validate on: the safest (strongest) penalty
    inner = group_folds(groups.tolist(), min(k, len(uniq)))
    errors = []
    for a in alphas:
        err = 0.0
        for f in np.unique(inner):
            test = inner == f
            err += float(((ridge_fit(X[~test], y[~test], a)(X[test]) - y[test]) ** 2).sum())
        errors.append(err)
    return float(alphas[int(np.argmin(errors))])


def cv_r2(
    X: np.ndarray,
    y: np.ndarray,
    folds: np.ndarray,
    alpha: float | None,
    groups: np.ndarray | None = None,
    alphas: Sequence[float] = (0.1, 1.0, 10.0, 100.0, 1000.0),
) -> tuple[float, np.ndarray]:
    """Out-of-fold R² (1 - SSE / SST over all rows) and the out-of-fold predictions.

    With `alpha` None the penalty is chosen inside each training fold (`choose_alpha` over its
    `groups`), never on the fold it is scored on. R² is 0 when the target does not vary (nothing
    to learn); it is negative when the probe predicts worse than the mean.
    """
    pred = np.zeros_like(y)
    for f in np.unique(folds):
        test = folds == f
        a = (
            alpha
            if alpha is not None
            else choose_alpha(X[~test], y[~test], (groups if groups is not None else folds)[~test], alphas)
        )
        pred[test] = ridge_fit(X[~test], y[~test], a)(X[test])
    sst = float(((y - y.mean()) ** 2).sum())
    if sst < 1e-12:
        return 0.0, pred
    return 1.0 - float(((y - pred) ** 2).sum()) / sst, pred
