"""The horizon probe: each statistic on small synthetic stores with hand-computed answers, the rule
list, threshold derivation from a sweep, stores from disk (and broken ones), the report, the CLI."""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np
import pytest

from agentrl.cli import main
from agentrl.core import Episode, Turn
from agentrl.horizon_report import to_html, write_report
from agentrl.probe import (
    ProbeStats,
    ProbeThresholds,
    default_thresholds,
    measure,
    probe_episodes,
    probe_store,
    recommend,
    thresholds_from_sweep,
)
from agentrl.probe.bakeoff import learning_slope
from agentrl.probe.calibration import summarize_sweep
from agentrl.probe.stats import (
    concentration,
    group_outcomes,
    mc_returns,
    post_observation_entropy,
    state_recurrence,
    step_reward_density,
    step_signal_frac,
    tokens_per_episode,
    turns_summary,
    value_changes,
)
from agentrl.probe.value import choose_alpha, cv_r2, group_folds, ridge_fit
from agentrl.store import StoreError, TrajectoryStore


def ep(n_turns: int, reward: float = 0.0, group: int = 0, **turn_kw) -> Episode:
    """An episode of `n_turns` one-token actions with two-token observations."""
    turns = [Turn(2 + 3 * k, [10 + k], [-0.5], [7, 8], **turn_kw) for k in range(n_turns)]
    return Episode(prompt_ids=[1, 2], turns=turns, reward=reward, group_id=group)


# -- the statistics ------------------------------------------------------------------------------


def test_turns_summary_median_p90_mean():
    eps = [ep(k) for k in (1, 2, 3, 4, 10)]
    # p90 by linear interpolation: position 0.9 * 4 = 3.6 -> 4 + 0.6 * (10 - 4) = 7.6
    assert turns_summary(eps) == pytest.approx({"median": 3.0, "p90": 7.6, "mean": 4.0})


def test_tokens_per_episode():
    eps = [ep(1), ep(3)]
    # action tokens 1 and 3; context = prompt 2 + actions + observations but the last: 3 and 2 + 3 + 4 = 9
    assert tokens_per_episode(eps) == {"action": 2.0, "context": 6.0}


def test_step_reward_density():
    a, b = ep(3), ep(1)
    a.turns[1].step_reward = 0.5
    assert step_reward_density([a, b]) == 0.25  # one of four turns


def test_step_signal_frac_counts_groups_whose_step_scores_differ():
    eps = [ep(2, 0.0, 0), ep(2, 0.0, 0),  # group 0: step sums 0.5 and 0.25 differ
           ep(2, 0.0, 1), ep(2, 0.0, 1),  # group 1: both 0.5 (scored on different turns)
           ep(2, 0.0, 2), ep(2, 0.0, 2),  # group 2: no step scores
           ep(2, 0.0, 3)]  # a group of one: not counted
    eps[0].turns[0].step_reward, eps[1].turns[1].step_reward = 0.5, 0.25
    eps[2].turns[0].step_reward, eps[3].turns[1].step_reward = 0.5, 0.5
    assert step_signal_frac(eps) == pytest.approx(1 / 3)
    assert step_signal_frac([ep(1)]) == 0.0


def test_group_outcomes_counts_and_std():
    eps = [ep(1, 1.0, 0), ep(1, 1.0, 0),  # all-pass
           ep(1, 0.0, 1), ep(1, 0.0, 1),  # all-fail
           ep(1, 1.0, 2), ep(1, 0.0, 2),  # mixed: std (unbiased) sqrt(0.5)
           ep(1, 0.5, 3), ep(1, 0.5, 3),  # all equal but neither pass nor fail
           ep(1, 1.0, 4)]                 # a group of one: no baseline, not scored
    g = group_outcomes(eps)
    assert (g["groups"], g["groups_scored"]) == (5, 4)
    assert (g["zero_adv_frac"], g["all_pass_frac"], g["all_fail_frac"]) == (0.75, 0.25, 0.25)
    assert g["reward_std_in_group"] == pytest.approx(math.sqrt(0.5) / 4)


def test_state_recurrence_counts_shared_states_within_groups():
    def keyed(keys, group):
        e = ep(len(keys), group=group)
        for t, k in zip(e.turns, keys):
            t.state_key = k
        return e

    # group 0: "a" twice, "b" and "c" once; group 1's "a" is another group's state -> 2 of 5 turns
    assert state_recurrence([keyed("ab", 0), keyed("ac", 0), keyed("a", 1)]) == pytest.approx(0.4)
    assert state_recurrence([ep(2)]) is None


def test_post_observation_entropy_reads_first_action_token():
    a = Episode([1], [Turn(1, [5, 6], [-0.2, -3.0], [7]), Turn(4, [8], [-1.0], [9])])
    b = Episode([1], [Turn(1, [5], [-0.6], [7])])
    assert post_observation_entropy([a, b]) == pytest.approx((0.2 + 1.0 + 0.6) / 3)
    assert post_observation_entropy([Episode([1], [Turn(1, [], [], [7])])]) is None


def test_mc_returns_with_and_without_step_rewards():
    e = ep(3, reward=1.0)
    e.turns[0].step_reward, e.turns[2].step_reward = 0.25, 0.5
    assert mc_returns(e, use_step_rewards=False) == [1.0, 1.0, 1.0]
    assert mc_returns(e, use_step_rewards=True) == [1.75, 1.5, 1.5]


def test_value_changes_and_concentration():
    assert value_changes([0.0, 0.0, 1.0], [0.2, 0.6, 0.6]) == pytest.approx([0.4, 0.0, 0.4])
    assert concentration([0.4, 0.0, 0.4]) == pytest.approx(0.5)
    assert concentration([0.0, -0.3, 0.1]) == pytest.approx(0.75)
    assert concentration([0.0, 0.0, 0.0, 0.0]) == 0.25  # nothing moves: uniform, as arpo falls back


def test_ridge_and_cross_validated_r2():
    x = np.arange(12, dtype=float)[:, None]
    assert ridge_fit(x, 2 * x[:, 0] + 1, alpha=0.0)(np.array([[20.0]]))[0] == pytest.approx(41.0)
    folds = group_folds([i // 2 for i in range(12)], k=3)
    assert sorted(np.bincount(folds).tolist()) == [4, 4, 4]  # whole groups of two per fold
    r2, _ = cv_r2(x, 2 * x[:, 0] + 1, folds, alpha=0.0)
    assert r2 == pytest.approx(1.0)
    assert cv_r2(x, np.ones(12), folds, alpha=0.0)[0] == 0.0  # nothing to learn
    noise = np.random.default_rng(0).normal(size=(12, 1))
    assert cv_r2(noise, 2 * x[:, 0], folds, alpha=1.0)[0] < 0.2  # uninformative features: no R²
    groups = np.array([i // 2 for i in range(12)])
    assert choose_alpha(x, 2 * x[:, 0], groups, [0.1, 1000.0]) == 0.1  # an exact line: the least penalty
    wide = np.random.default_rng(1).normal(size=(12, 8))
    # noise: shrink it all
    assert choose_alpha(wide, np.random.default_rng(2).normal(size=12), groups, [0.1, 1000.0]) == 1000.0
    assert cv_r2(x, 2 * x[:, 0] + 1, folds, alpha=None, groups=groups)[0] == pytest.approx(1.0, abs=1e-3)


def test_value_probe_on_hidden_states_hand_computed():
    """Each group: one passing episode whose hidden state turns 1 after its first turn, one failing
    episode whose state stays 0. Least squares on one binary feature gives the two cell means:
    V(0) = 1 pass row / 4 rows = 0.25, V(1) = 1. Every training fold has the same mix, so the
    out-of-fold values are those too. R² = 1 - SSE / SST: SST = 6N x 0.25, SSE = N (0.75² + 3 x 0.25²)
    = 0.75 N -> 0.5. Changes: passing [0.75, 0, 0], failing [0, 0, -0.25]: both fully concentrated."""
    eps = []
    for g in range(6):
        win, lose = ep(3, 1.0, g), ep(3, 0.0, g)
        for t, h in zip(win.turns, (0.0, 1.0, 1.0)):
            t.hidden = [h]
        for t in lose.turns:
            t.hidden = [0.0]
        eps += [win, lose]
    stats, curves = measure(eps, ProbeThresholds(ridge_alpha=0.0, cv_folds=3))
    assert stats.value_features == "policy hidden state (H=1)"
    assert stats.value_r2 == pytest.approx(0.5)
    assert stats.value_change_concentration == pytest.approx(1.0)
    assert stats.uniform_share == pytest.approx(1 / 3)
    assert curves.value_by_turn == pytest.approx([0.25, 0.625, 0.625])
    assert curves.return_by_turn == pytest.approx([0.5, 0.5, 0.5])


def test_value_probe_falls_back_to_cheap_features():
    """No hidden states: the probe uses the cheap features, of which "malformed so far" carries the
    signal here. Each group: a passing episode, and a failing one whose first call was malformed
    (so its second turn starts with one malformed call behind it); two turns each. Least squares on
    (turn, malformed so far) fits the three cells exactly: turn 0 -> 0.5 (one pass, one fail),
    passing turn 1 -> 1, failing turn 1 -> 0; every training fold has the same mix. SST = 4N x 0.25,
    SSE = N (0.25 + 0.25) -> R² = 0.5 (a tiny ridge penalty keeps the collinear columns solvable)."""
    eps = []
    for g in range(6):
        win, lose = ep(2, 1.0, g), ep(2, 0.0, g)
        lose.turns[0].malformed = 1
        eps += [win, lose]
    stats, curves = measure(eps, ProbeThresholds(ridge_alpha=1e-8, cv_folds=3))
    assert stats.value_features.startswith("cheap:")
    assert stats.value_r2 == pytest.approx(0.5, abs=1e-4)
    assert curves.value_by_turn == pytest.approx([0.5, 0.5], abs=1e-4)
    one_group = measure([ep(2, 1.0, 0), ep(2, 0.0, 0)], ProbeThresholds())[0]
    assert one_group.value_r2 is None and one_group.value_change_concentration is None


# -- the rules -----------------------------------------------------------------------------------


def stats(**kw) -> ProbeStats:
    base = dict(episodes=64, groups=8, pass_rate=0.5, reward_mean=0.5, truncated_frac=0.3, turns_median=20,
                turns_p90=25, turns_mean=20,
                action_tokens_mean=100, context_tokens_mean=300, step_reward_density=0.0, zero_adv_frac=0.1,
                all_pass_frac=0.05,
                all_fail_frac=0.05, reward_std_in_group=0.4, state_recurrence=0.0, value_r2=0.5, value_features="x",
                value_change_concentration=0.08, uniform_share=0.05, post_obs_entropy=1.0)
    return ProbeStats(**{**base, **kw})


TH = ProbeThresholds(horizon_cutoff=10, min_budget_episodes=500)


@pytest.mark.parametrize(
    "kw, budget, th, rule, algo",
    [
        ({"episodes": 8}, None, TH, "too-few-episodes", "grpo"),
        ({"zero_adv_frac": 0.9}, None, TH, "no-signal", "grpo"),
        ({"zero_adv_frac": 0.9, "step_signal_frac": 0.6}, None, TH, "step-scores-only", "steppo"),
        ({"zero_adv_frac": 0.9, "step_signal_frac": 0.4, "step_reward_density": 0.5}, None, TH, "no-signal", "grpo"),
        ({"turns_median": 6}, None, TH, "short-horizon", "grpo"),
        ({}, None, TH.model_copy(update={"horizon_cutoff": None}), "short-horizon", "grpo"),
        ({}, 100, TH, "small-budget", "grpo"),
        ({"step_reward_density": 0.5}, 1000, TH, "dense-step-scores", "steppo"),
        ({"value_r2": 0.05, "state_recurrence": 0.5}, None, TH, "critic-not-learnable", "gigpo"),
        ({"value_r2": 0.05}, None, TH, "critic-not-learnable", "grpo"),
        ({"value_change_concentration": 0.4}, None, TH, "concentrated-value-changes", "arpo"),
        ({}, None, TH, "long-horizon", "turn-ppo"),
        # the sweep left steppo out of the candidates: dense steps no longer pick it
        ({"step_reward_density": 0.5}, None,
         TH.model_copy(update={"turn_level_candidates": ["gigpo"], "long_horizon_algo": "gigpo"}), "long-horizon",
         "gigpo"),
    ],
)
def test_rules_first_match_fires(kw, budget, th, rule, algo):
    rec, outcomes = recommend(stats(**kw), th, budget)
    assert (rec.rule, rec.algo) == (rule, algo)
    fired = next(r for r in outcomes if r.matched)
    assert fired.name == rule and rec.reason.startswith(rule)
    assert [r.name for r in outcomes][-1] == "long-horizon" and fired.thresholds  # says which thresholds it read


def test_no_signal_comes_with_advice():
    rec, _ = recommend(stats(zero_adv_frac=1.0, all_fail_frac=1.0), TH)
    assert rec.advice and "sampling" in rec.advice


# -- thresholds from a sweep ---------------------------------------------------------------------


def sweep(finals: dict[int, dict[str, list[float]]], eval_episodes: int | None = None) -> dict:
    """finals[locks][algo] = final pass rate per seed; max_turns = 2 * locks + 1."""
    hs = {}
    for locks, per in finals.items():
        runs = {f"{a}/{s}": {"algo": a, "seed": s, "final_pass_rate": p, "curve": []} for a, ps in per.items() for s,
                p in enumerate(ps)}
        hs[str(locks)] = {"locks": locks, "max_turns": 2 * locks + 1, "warm_start_pass_rate": 0.4, "runs": runs}
    args = {"locks": list(finals), "updates": 20, "groups": 4, "group_size": 8}
    if eval_episodes:
        args["eval_episodes"] = eval_episodes
    return {"started": "2026-01-02 03:04", "args": args, "horizons": hs}


def test_thresholds_from_sweep_finds_the_crossover():
    s = sweep({1: {"grpo": [0.8, 0.9], "gigpo": [0.85, 0.85], "arpo": [0.7, 0.8]},      # 3 turns: ties
               # 7 turns: gigpo +0.025, spread ~0.06
               3: {"grpo": [0.5, 0.6], "gigpo": [0.55, 0.6], "arpo": [0.5, 0.5]},
               8: {"grpo": [0.3, 0.4], "gigpo": [0.6, 0.7], "arpo": [0.55, 0.65]}})    # 17 turns: gigpo +0.3
    t = thresholds_from_sweep(s, source="test")
    assert t.horizon_cutoff == (7 + 17) / 2
    assert t.turn_level_candidates == ["arpo", "gigpo"]  # arpo's 0.60 lies within the spread of gigpo's 0.65
    assert t.long_horizon_algo == "gigpo"
    assert t.min_budget_episodes == 20 * 4 * 8
    assert t.sweep_started == "2026-01-02 03:04" and "--locks 1 3 8" in t.sweep_command and t.source == "test"
    assert "17 max turns" in t.derivation
    # the rule list then agrees with the sweep: grpo at 7 turns, gigpo past 12
    assert recommend(stats(turns_median=7), t, 640)[0].algo == "grpo"
    assert recommend(stats(turns_median=17), t, 640)[0].algo == "gigpo"


def test_thresholds_from_sweep_without_crossover_never_picks_turn_level():
    t = thresholds_from_sweep(sweep({1: {"grpo": [0.8, 0.9], "arpo": [0.8, 0.85]},
                                     8: {"grpo": [0.5, 0.7], "arpo": [0.55, 0.65]}}))
    assert t.horizon_cutoff is None and t.turn_level_candidates == []
    assert "no horizon where a turn-level assigner beat grpo" in t.derivation
    rec, _ = recommend(stats(turns_median=500), t)
    assert (rec.algo, rec.rule) == ("grpo", "short-horizon") and "found no horizon" in rec.reason


def test_sweep_spread_has_an_evaluation_floor():
    # one seed each: no seed std, but 16 held-out episodes leave a standard error of ~0.12
    s = sweep({1: {"grpo": [0.5], "gigpo": [0.55]}, 8: {"grpo": [0.3], "gigpo": [0.6]}}, eval_episodes=16)
    h = summarize_sweep(s)
    assert h[0].spread == pytest.approx(math.sqrt(0.525 * 0.475 / 16))
    assert h[0].within == ["gigpo", "grpo"]
    assert thresholds_from_sweep(s).horizon_cutoff == (3 + 17) / 2  # +0.05 at 3 turns is noise; +0.3 at 17 is not


def test_thresholds_from_sweep_needs_grpo():
    with pytest.raises(ValueError, match="no grpo runs"):
        thresholds_from_sweep(sweep({1: {"arpo": [0.5]}}))


def test_thresholds_from_a_sweep_file_or_the_fallback(tmp_path):
    from agentrl.probe.calibration import thresholds_from_file

    assert thresholds_from_file(tmp_path / "missing.json").source == "literature"
    f = tmp_path / "horizon_sweep.json"
    f.write_text(json.dumps(sweep({1: {"grpo": [0.5, 0.6]}, 8: {"grpo": [0.2, 0.3], "turn-ppo": [0.6, 0.7]}})))
    t = thresholds_from_file(f)
    assert t.source == str(f) and t.horizon_cutoff == 10.0 and t.long_horizon_algo == "turn-ppo"
    f.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        thresholds_from_file(f)


# -- stores from disk, the report, the CLI --------------------------------------------------------


def synthetic_store(n_groups: int = 8, G: int = 4) -> TrajectoryStore:
    eps = []
    for g in range(n_groups):
        for i in range(G):
            e = ep(2 + (i + g) % 3, float((i + g) % 2), g)
            for t in e.turns:
                t.state_key = "s"  # one state: every turn recurs
            eps.append(e)
    return TrajectoryStore(eps)


def test_probe_a_saved_store_without_env_or_model(tmp_path):
    store = synthetic_store()
    run = tmp_path / "run"
    store.save(run / "store" / "update_00001_0.parquet")
    direct = probe_store(store, ProbeThresholds())
    from_file = probe_store(run / "store" / "update_00001_0.parquet", ProbeThresholds())
    from_run = probe_store(run, ProbeThresholds())  # a run folder: its store/
    assert from_file.stats == direct.stats == from_run.stats
    assert from_file.source.endswith("update_00001_0.parquet")
    assert direct.stats.episodes == 32 and direct.stats.state_recurrence == 1.0


def test_corrupt_or_missing_store_gives_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="no store at"):
        probe_store(tmp_path / "nowhere")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(StoreError, match="bad.parquet is not a readable Parquet file"):
        probe_store(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="holds no .parquet files"):
        probe_store(tmp_path / "empty")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "other.parquet")
    with pytest.raises(StoreError, match="not an agentrl store: missing columns"):
        probe_store(tmp_path / "other.parquet")


def test_report_is_self_contained(tmp_path):
    result = probe_episodes(synthetic_store().episodes, ProbeThresholds(horizon_cutoff=2))
    paths = write_report(result, tmp_path)
    page = paths["html"].read_text()
    assert "<script" not in page and "http://" not in page and "https://" not in page and "@import" not in page
    srcs = re.findall(r'src="([^"]+)"', page)
    assert len(srcs) == 4 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert all(base64.b64decode(s.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n" for s in srcs)
    data = json.loads(paths["json"].read_text())
    assert data["probe"]["recommendation"]["algo"] == result.recommendation.algo
    md = paths["md"].read_text()
    assert "Recommended assigner" in md and "turns.png" in md and (tmp_path / "turns.png").is_file()
    assert "<img" not in to_html(result, images={})


def test_learning_slope():
    assert learning_slope([0.2, 0.4, 0.6, 0.8]) == pytest.approx(0.2)
    assert learning_slope([0.5]) == 0.0


def test_cli_probe_store(tmp_path, capsys):
    synthetic_store().save(tmp_path / "s.parquet")
    rc = main(["probe", "--store", str(tmp_path / "s.parquet"), "--out", str(tmp_path / "rep"), "--threshold",
               "horizon_cutoff=2",
               "--threshold", "min_episodes=8"])
    out = capsys.readouterr().out
    assert rc == 0 and "recommended assigner" in out and "turn-value probe" in out
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["probe"]["thresholds"]["horizon_cutoff"] == 2.0


def test_cli_probe_errors(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_text("garbage")
    assert main(["probe", "--store", str(bad), "--out", str(tmp_path / "rep")]) == 2
    assert "not a readable Parquet file" in capsys.readouterr().err  # errors go to stderr
    assert main(["probe", "--store", str(bad), "--threshold", "horizon_cutof=3"]) == 2
    assert "horizon_cutof" in capsys.readouterr().err


def test_probe_env_rolls_out_with_hidden_states(vault_policy, tmp_path):
    from agentrl.config import TrainConfig
    from agentrl.probe import probe_env

    cfg = TrainConfig(env={"id": "agentrl/Vault-v0", "kwargs": {"locks": 1, "slack": 1}}, updates=2,
                      rollout={"groups": 2, "group_size": 2, "sampling": {"max_new_tokens": 8}})
    r = probe_env(cfg, groups=2, group_size=2, policy=vault_policy, store_out=tmp_path / "p.parquet")
    assert r.stats.episodes == 4 and r.budget_episodes == 8
    assert r.stats.value_features == "policy hidden state (H=16)"
    assert len(TrajectoryStore.load(tmp_path / "p.parquet")) == 4


def test_bakeoff_runs_each_assigner_from_the_same_start(vault_policy_dir, tmp_path):
    from agentrl.config import TrainConfig
    from agentrl.probe import bakeoff

    cfg = TrainConfig(env={"id": "agentrl/Vault-v0", "kwargs": {"locks": 1, "slack": 1}}, model=str(vault_policy_dir),
                      device="cpu",
                      rollout={"groups": 1, "group_size": 2, "sampling": {"max_new_tokens": 8}}, eval={"episodes": 2})
    runs = bakeoff(cfg, ["grpo", "gigpo"], updates=2, out=tmp_path, eval_episodes=2, say=lambda _: None)
    assert [r.algo for r in runs] == ["grpo", "gigpo"]
    assert all(len(r.curve) == 2 for r in runs) and runs[0].warm_pass_rate == runs[1].warm_pass_rate
    assert (tmp_path / "bakeoff-gigpo" / "summary.json").is_file()


# -- the registry decides which assigners are turn-level ------------------------------------------


def test_a_newly_registered_turn_level_assigner_can_be_recommended(monkeypatch):
    """No probe code names it: registered with turn_level, it is swept, the calibration makes it the
    long-horizon pick, and `picks` can route a condition to it. (The probe reads only `turn_level`
    from a registry entry, so a stand-in entry is all this test needs.)"""
    import types

    from agentrl.algorithms import ASSIGNERS
    from agentrl.probe.thresholds import turn_level_assigners

    s = sweep({1: {"grpo": [0.8, 0.9], "toy-turn": [0.8, 0.85]},
               8: {"grpo": [0.3, 0.4], "toy-turn": [0.6, 0.7], "gigpo": [0.35, 0.4]}})
    before = thresholds_from_sweep(s)  # unregistered: the sweep's toy-turn runs are not turn-level credit
    assert before.horizon_cutoff is None and "toy-turn" not in turn_level_assigners()

    monkeypatch.setitem(ASSIGNERS, "toy-turn", types.SimpleNamespace(turn_level=True))
    t = thresholds_from_sweep(s)
    assert (t.horizon_cutoff, t.turn_level_candidates, t.long_horizon_algo) == ((3 + 17) / 2, ["toy-turn"], "toy-turn")
    rec, _ = recommend(stats(turns_median=17), t, 640)
    assert (rec.algo, rec.rule) == ("toy-turn", "long-horizon")

    picks = {**TH.picks, "dense-step-scores": "toy-turn"}
    routed = TH.model_copy(update={"turn_level_candidates": ["toy-turn"], "picks": picks})
    rec, _ = recommend(stats(step_reward_density=0.5), routed, 1000)
    assert (rec.algo, rec.rule) == ("toy-turn", "dense-step-scores")


def test_thresholds_name_only_registered_assigners():
    with pytest.raises(ValueError, match=r"picks: \['nosuch'\] not registered"):
        ProbeThresholds(picks={"dense-step-scores": "nosuch"})
    with pytest.raises(ValueError, match="long_horizon_algo"):
        ProbeThresholds(long_horizon_algo="turn_ppo")


def test_packaged_thresholds_are_the_default_and_a_bad_record_is_refused():
    from agentrl.probe.thresholds import thresholds_from_record

    t = default_thresholds()
    assert t.source.startswith("packaged") and t.sweep_sha256 and t.horizon_cutoff == 4.0
    assert probe_episodes(synthetic_store().episodes).thresholds == t  # what every caller gets without thresholds
    with pytest.raises(ValueError, match=r"fields \['min_episodes'\] are not calibrated"):
        thresholds_from_record({"thresholds": {"min_episodes": 3}}, "x.json")
    with pytest.raises(ValueError, match="x.json: expected an object with a 'thresholds' object"):
        thresholds_from_record([1, 2], "x.json")
    with pytest.raises(ValueError, match="x.json: .*horizon_cutoff"):
        thresholds_from_record({"thresholds": {"horizon_cutoff": "soon"}}, "x.json")


# -- the probe out of sample: benchmarks/probe_vs_sweep.py's regret and the two-family calibration ---------


def _probe_vs_sweep():
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("probe_vs_sweep", bench / "probe_vs_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_regret_of_the_probe_and_of_every_fixed_choice():
    pvs = _probe_vs_sweep()
    s = sweep({1: {"grpo": [0.6, 0.8], "steppo": [0.5, 0.5]}, 8: {"grpo": [0.2, 0.4], "steppo": [0.6, 0.8]}})
    reg = pvs.regrets(s, {"1": "grpo", "8": "steppo"})
    assert set(reg) == {"probe", "grpo", "steppo"}  # only the assigners the sweep ran
    # best means: 0.7 at locks 1 (grpo), 0.7 at locks 8 (steppo)
    assert reg["probe"]["regret"] == pytest.approx(0.0)
    assert reg["probe"]["per_seed"] == pytest.approx({0: 0.2, 1: -0.2})  # (0.7-0.6)+(0.7-0.6); (0.7-0.8)+(0.7-0.8)
    assert reg["probe"]["seed_std"] == pytest.approx(math.sqrt(0.08))
    assert reg["grpo"]["per_horizon"] == pytest.approx({"1": 0.0, "8": 0.4})
    assert reg["grpo"]["per_seed"] == pytest.approx({0: 0.6, 1: 0.2})
    assert reg["steppo"]["regret"] == pytest.approx(0.2)
    assert reg["steppo"]["per_seed"] == pytest.approx({0: 0.3, 1: 0.1})
    with pytest.raises(ValueError, match="'gigpo' has no runs"):
        pvs.regrets(s, {"1": "gigpo", "8": "steppo"})


def test_two_family_calibration_interleaves_horizons_and_keeps_the_smaller_budget():
    from agentrl.probe.calibration import merge_sweeps

    vault = sweep({1: {"grpo": [0.5, 0.6], "steppo": [0.5, 0.6]},          # 3 turns: a tie
                   8: {"grpo": [0.3, 0.4], "steppo": [0.6, 0.7]}})         # 17 turns: steppo +0.3
    hanoi = sweep({2: {"grpo": [0.3, 0.4], "steppo": [0.8, 0.9]}})         # 5 turns: steppo +0.5
    hanoi.update(family="hanoi", knob="disks")
    hanoi["args"]["updates"] = 10
    merged = merge_sweeps({"v.json": vault, "h.json": hanoi})
    assert sorted(merged["horizons"]) == ["hanoi/2", "vault/1", "vault/8"]
    assert merged["args"]["updates"] == 10  # 320 episodes per run, the smaller budget
    alone, both = thresholds_from_sweep(vault), thresholds_from_sweep(merged)
    assert alone.horizon_cutoff == (3 + 17) / 2
    assert both.horizon_cutoff == (3 + 5) / 2  # the Hanoi horizon at 5 turns is the crossover now
    assert both.min_budget_episodes == 10 * 4 * 8 and both.long_horizon_algo == "steppo"


# -- the no-reliable-difference gate, the evidence behind it, several families calibrated together ---------


def evidence_th(**leads) -> ProbeThresholds:
    """TH with evidence: leads[algo] = (lead over grpo, spread)."""
    from agentrl.probe.thresholds import Evidence

    ev = {a: Evidence(lead=lead, spread=spread, horizons=2, wins=int(lead > spread)) for a, (lead, spread) in
          leads.items()}
    return TH.model_copy(update={"evidence": ev})


def test_a_turn_level_pick_the_sweeps_did_not_separate_from_grpo_becomes_grpo():
    s = stats(turns_median=20, step_reward_density=0.5)  # dense-step-scores fires: steppo
    rec, _ = recommend(s, evidence_th(steppo=(0.03, 0.05)), 1000)  # steppo led by 0.03 < spread 0.05
    assert (rec.algo, rec.rule, rec.confidence) == ("grpo", "no-reliable-difference", "no reliable difference")
    assert rec.reason.startswith("no reliable difference: grpo. dense-step-scores would pick steppo")
    assert "+0.030 (seeds' spread 0.050)" in rec.evidence
    rec, _ = recommend(s, evidence_th(steppo=(0.12, 0.05)), 1000)  # a lead beyond the spread: kept
    assert (rec.algo, rec.rule, rec.confidence) == ("steppo", "dense-step-scores", "measured")
    rec, _ = recommend(s, evidence_th(gigpo=(0.2, 0.05)), 1000)  # steppo never ran past the cut-off
    assert (rec.algo, rec.confidence) == ("grpo", "no reliable difference")
    rec, _ = recommend(s, TH, 1000)  # no evidence recorded (the literature thresholds): the pick stands, unmeasured
    assert (rec.algo, rec.rule, rec.confidence) == ("steppo", "dense-step-scores", "unmeasured")


def test_the_gate_leaves_step_scores_only_and_says_how_sure_a_grpo_pick_is():
    th = evidence_th(steppo=(-0.1, 0.05))
    rec, _ = recommend(stats(zero_adv_frac=0.9, step_signal_frac=0.6), th, None)  # silent outcomes: grpo learns nothing
    assert (rec.algo, rec.rule, rec.confidence) == ("steppo", "step-scores-only", "unmeasured")
    rec, _ = recommend(stats(turns_median=6), th, None)
    assert (rec.algo, rec.rule, rec.confidence) == ("grpo", "short-horizon", "measured")
    rec, _ = recommend(stats(episodes=8), th, None)
    assert (rec.rule, rec.confidence) == ("too-few-episodes", "unmeasured")


def backed_th(**ev) -> ProbeThresholds:
    """TH with evidence: ev[algo] = (lead, seeds' spread, stderr of the mean lead, horizons)."""
    from agentrl.probe.thresholds import Evidence

    return TH.model_copy(update={"evidence": {
        a: Evidence(lead=lead, spread=sp, stderr=se, horizons=n, wins=0) for a, (lead, sp, se, n) in ev.items()}})


def test_a_lead_seen_on_many_horizons_is_reliable_though_each_horizon_alone_is_within_the_spread():
    from agentrl.probe.thresholds import Evidence

    # +0.03 on each of 9 horizons, the seeds' spread 0.06 at each: no single horizon separates them, but the
    # mean lead's spread is 0.06 / sqrt(9) = 0.02
    assert Evidence(lead=0.03, spread=0.06, stderr=0.02, horizons=9, wins=0).reliable
    assert not Evidence(lead=0.03, spread=0.06, stderr=0.04, horizons=9, wins=0).reliable
    assert not Evidence(lead=0.03, spread=0.06, horizons=9, wins=0).reliable  # an old record: against the spread
    assert not Evidence(lead=0.03, spread=0.06, stderr=0.0, horizons=0, wins=0).reliable


def test_an_unbacked_pick_gives_way_to_the_free_assigner_the_sweeps_back():
    # critic-not-learnable with recurring states picks gigpo; the sweeps put gigpo level with grpo and steppo
    # ahead beyond its lead's spread; the environment scores 10% of turns, so steppo needs no PRM here
    th = backed_th(gigpo=(0.0, 0.06, 0.02, 9), steppo=(0.04, 0.06, 0.015, 9))
    s = stats(value_r2=0.05, state_recurrence=0.5, step_reward_density=0.1)
    rec, outcomes = recommend(s, th, None)
    assert next(r for r in outcomes if r.matched).algo == "gigpo"
    assert (rec.algo, rec.rule, rec.confidence) == ("steppo", "best-backed", "measured")
    assert "+0.040 ± 0.015" in rec.evidence and "step_reward_density 0.10" in rec.reason
    # no step scores: steppo would need a PRM, so it is not free; gigpo is free but not backed: grpo
    rec, _ = recommend(s.model_copy(update={"step_reward_density": 0.0}), th, None)
    assert (rec.algo, rec.rule, rec.confidence) == ("grpo", "no-reliable-difference", "no reliable difference")


def test_a_heuristic_grpo_past_the_cut_off_takes_the_backed_free_assigner_but_a_measured_one_stays():
    th = backed_th(steppo=(0.04, 0.06, 0.015, 9), arpo=(0.2, 0.06, 0.01, 9))
    s = stats(value_r2=0.05, state_recurrence=0.0, step_reward_density=0.1)  # no recurrence: grpo, a heuristic
    rec, _ = recommend(s, th, None)
    assert (rec.algo, rec.rule) == ("steppo", "best-backed")  # arpo leads more, but it trains a critic
    rec, _ = recommend(s, TH, None)  # no sweep evidence: the heuristic stands
    assert (rec.algo, rec.rule) == ("grpo", "critic-not-learnable")
    rec, _ = recommend(stats(turns_median=6, step_reward_density=0.1), th, None)  # below the cut-off: measured
    assert (rec.algo, rec.rule, rec.confidence) == ("grpo", "short-horizon", "measured")
    bad = th.model_copy(update={"free_signal": {"steppo": "no_such_statistic"}})
    with pytest.raises(ValueError, match="no_such_statistic.*not a probe statistic"):
        recommend(s, bad, None)


def test_the_calibration_records_each_assigners_lead_past_the_crossover():
    s = sweep({1: {"grpo": [0.5, 0.6], "steppo": [0.5, 0.6], "gigpo": [0.4, 0.5]},   # 3 turns: a tie
               4: {"grpo": [0.3, 0.4], "steppo": [0.7, 0.8], "gigpo": [0.3, 0.5]},   # 9 turns: steppo +0.4
               8: {"grpo": [0.2, 0.3], "steppo": [0.4, 0.5], "gigpo": [0.2, 0.2]}})  # 17 turns: steppo +0.2
    t = thresholds_from_sweep(s)
    assert t.horizon_cutoff == 6.0
    # past the crossover (9 and 17 turns): steppo leads by (0.4 + 0.2) / 2, gigpo by (0.05 - 0.05) / 2
    assert t.evidence["steppo"].lead == pytest.approx(0.3) and t.evidence["steppo"].horizons == 2
    assert t.evidence["steppo"].wins == 2 and t.evidence["steppo"].reliable
    assert t.evidence["gigpo"].lead == pytest.approx(0.0) and not t.evidence["gigpo"].reliable
    # each horizon's spread is the pooled seed std: at 9 turns sqrt((0.005 + 0.005 + 0.02) / 3) = 0.1, at 17
    # sqrt((0.005 + 0.005 + 0) / 3); the evidence keeps their mean
    assert t.evidence["steppo"].spread == pytest.approx((0.1 + math.sqrt(0.01 / 3)) / 2, abs=1e-4)


def test_calibrating_on_several_sweep_files_merges_them(tmp_path):
    from agentrl.probe.__main__ import main
    from agentrl.probe.calibration import calibration_record

    vault = sweep({1: {"grpo": [0.5, 0.6], "steppo": [0.5, 0.6]}, 8: {"grpo": [0.3, 0.4], "steppo": [0.6, 0.7]}})
    hanoi = sweep({2: {"grpo": [0.3, 0.4], "steppo": [0.8, 0.9]}})
    hanoi.update(family="hanoi", knob="disks")
    (tmp_path / "v.json").write_text(json.dumps(vault))
    (tmp_path / "h.json").write_text(json.dumps(hanoi))
    rec = calibration_record([tmp_path / "v.json", tmp_path / "h.json"], ["v.json", "h.json"])
    t = rec["thresholds"]
    assert t["horizon_cutoff"] == (3 + 5) / 2 and t["source"] == "v.json + h.json"
    assert len(t["sweep_sha256"].split()) == 2 and rec["generated_by"].endswith("calibrate v.json h.json")
    assert t["evidence"]["steppo"]["horizons"] == 2
    out = tmp_path / "th.json"
    assert main([str(tmp_path / "v.json"), str(tmp_path / "h.json"), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["thresholds"]["horizon_cutoff"] == 4.0
    with pytest.raises(ValueError, match="2 sweep files but 1 names"):
        calibration_record([tmp_path / "v.json", tmp_path / "h.json"], ["v.json"])


def _probe_lofo():
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("probe_lofo", bench / "probe_lofo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lofo_regret_is_the_mean_over_horizons_and_the_bootstrap_brackets_it():
    import numpy as np

    lofo = _probe_lofo()
    finals = {"1": {"grpo": [0.6, 0.8], "steppo": [0.5, 0.5]}, "8": {"grpo": [0.2, 0.4], "steppo": [0.6, 0.8]}}
    # best means: 0.7 (grpo) at 1, 0.7 (steppo) at 8; always grpo: (0 + 0.4) / 2, always steppo: (0.2 + 0) / 2
    assert lofo.regret(finals, {"1": "grpo", "8": "grpo"})[0] == pytest.approx(0.2)
    assert lofo.regret(finals, {"1": "steppo", "8": "steppo"})[0] == pytest.approx(0.1)
    assert lofo.regret(finals, {"1": "grpo", "8": "steppo"}) == (pytest.approx(0.0), {"1": 0.0, "8": 0.0})
    b = lofo.boot_regrets(finals, {"grpo": {"1": "grpo", "8": "grpo"}, "steppo": {"1": "steppo", "8": "steppo"}},
                          2000, np.random.default_rng(0))
    lo, hi = lofo.interval(b["grpo"])
    assert lo <= 0.2 <= hi and (b["grpo"] >= 0).all()  # a regret is never negative: the best is re-taken
    # with one seed there is nothing to resample: every draw is the point estimate
    one = {"1": {"grpo": [0.6], "steppo": [0.5]}}
    assert lofo.interval(lofo.boot_regrets(one, {"s": {"1": "steppo"}}, 50, np.random.default_rng(0))["s"]) == \
        [pytest.approx(0.1), pytest.approx(0.1)]


def test_the_probes_thresholds_are_frozen_under_its_version():
    """A pre-registered prediction (benchmarks/results/probe_preregistered.json) names the probe that made it:
    changing the thresholds without a new PROBE_VERSION would let a later probe borrow its record."""
    from agentrl.probe.thresholds import FROZEN_SHA256, PROBE_VERSION, probe_fingerprint

    f = probe_fingerprint()
    assert (f["thresholds_sha256"], f["resolved_thresholds_sha256"]) == (
        FROZEN_SHA256["thresholds.json"], FROZEN_SHA256["resolved"]), (
        f"the probe's thresholds changed under PROBE_VERSION {PROBE_VERSION}: bump it and record the new digests")
