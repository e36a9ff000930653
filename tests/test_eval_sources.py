"""eval.sources: the estimators against hand-computed values; a planted source, whose rewards are known per seed
whatever the policy writes, through the real evaluation path; a scorer of one's own; config errors that say what
and where; the step-0 evaluation of a short run in metrics.jsonl, the console and summary.json."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest
from pydantic import ValidationError
from rich.console import Console
from test_e2e import small_config

from agentrl.cli import main
from agentrl.config import TrainConfig, describe_errors
from agentrl.core import AgentEnv, Episode
from agentrl.eval_sources import (
    avg_at_k,
    evaluate_source,
    mean_pass_at_k,
    pass_at_k,
    reported_ks,
    resolve_sources,
    result_of,
)
from agentrl.monitor import Monitor
from agentrl.report import write_report
from agentrl.trainer import Trainer


class EvenSeeds(AgentEnv):
    """One turn; reward 1 iff the episode's seed is even, whatever the policy wrote."""

    max_turns = 1

    def say(self, text: str) -> str:
        """Say something."""
        self.finish()
        return "ok"

    tools = [say]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task_seed = seed
        return "Say something.", {}

    def verify(self) -> float:
        return float(self.task_seed % 2 == 0)


SCORED: Counter[int] = Counter()  # every_fourth's calls per seed
SEEN: list[tuple[int, int]] = []  # (episode's seed, env's seed) of every call


def every_fourth(episode: Episode, env: AgentEnv) -> bool:
    """A scorer that passes the 1st, 5th, 9th ... call on each seed: with k = 4 samples and one greedy episode a
    task gets 5 calls, of which the 1st and the 5th pass, so the samples hold exactly one pass in either order."""
    SEEN.append((episode.seed, env.task_seed))
    n = SCORED[episode.seed]
    SCORED[episode.seed] += 1
    return n % 4 == 0


def too_much(episode: Episode, env: AgentEnv) -> float:
    return 2.0


def source_config(**source) -> TrainConfig:
    return TrainConfig(env={"id": "test_e2e:Babble"}, rollout={"sampling": {"max_new_tokens": 8}},
                       eval={"sources": [{"name": "even", "env": {"id": "test_eval_sources:EvenSeeds"}, **source}]})


# -- (a) the estimators, by hand ------------------------------------------------------------------------


def test_pass_at_k_matches_hand_computed_values():
    assert pass_at_k(n=4, c=1, k=2) == 0.5  # 1 - 3/6
    assert pass_at_k(n=5, c=2, k=3) == pytest.approx(0.9)  # 1 - 1/10
    assert pass_at_k(n=10, c=3, k=1) == pytest.approx(0.3)  # pass@1 is c/n
    assert pass_at_k(n=4, c=0, k=4) == 0.0
    assert pass_at_k(n=4, c=1, k=4) == 1.0
    assert pass_at_k(n=8, c=1, k=3) == pytest.approx(0.375)  # 1 - 35/56


def test_pass_at_k_and_avg_at_k_over_planted_outcomes():
    outcomes = [[True, False, False, False],  # c=1: pass@2 0.5, avg 0.25
                [False, False, False, False],  # c=0: 0, 0
                [True, True, False, False]]  # c=2: pass@2 1 - 1/6 = 0.8333, avg 0.5
    assert mean_pass_at_k(outcomes, 2) == pytest.approx(0.4444444444)
    assert mean_pass_at_k(outcomes, 4) == pytest.approx(0.6666666667)
    assert mean_pass_at_k(outcomes, 1) == pytest.approx(0.25)
    assert avg_at_k(outcomes) == pytest.approx(0.25)


def test_a_score_below_one_is_partial_credit_not_a_pass():
    result = result_of("rg", 2, [[1.0, 0.5], [0.5, 0.0]], greedy=[0.5, 1.0], temperature=1.0)
    assert result.pass_at == {2: 0.5}  # only the first task holds a pass
    assert result.avg == 0.25 and result.greedy == 0.5 and result.score_mean == 0.5
    assert result.metrics() == {"eval/rg/pass@2": 0.5, "eval/rg/avg@2": 0.25, "eval/rg/greedy_pass@1": 0.5,
                                "eval/rg/score_mean": 0.5, "eval/rg/tasks": 2.0, "eval/rg/k": 2.0}


def test_estimators_refuse_impossible_counts():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(n=2, c=1, k=3)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(n=2, c=3, k=1)
    with pytest.raises(ValueError, match="at least one"):
        avg_at_k([])


def test_reported_ks_are_powers_of_two_below_k_and_k():
    assert reported_ks(1) == [1]
    assert reported_ks(2) == [2]
    assert reported_ks(6) == [2, 4, 6]
    assert reported_ks(16) == [2, 4, 8, 16]


# -- (b) a planted source through the real path ------------------------------------------------------------


def test_planted_source_gives_its_known_pass_rates(vault_policy):
    cfg = source_config(seed_offset=10, episodes=6, k=4)
    [source] = resolve_sources(cfg)
    assert source.seeds == [10, 11, 12, 13, 14, 15]
    result = evaluate_source(cfg, source, vault_policy, max_context=512)
    # seeds 10, 12 and 14 pass on all 4 samples and greedily, 11, 13 and 15 never
    assert result.pass_at == {2: 0.5, 4: 0.5}
    assert result.avg == 0.5
    assert result.greedy == 0.5
    assert result.tasks == 6 and result.temperature == 1.0


def test_planted_source_on_odd_seeds_only_is_zero_everywhere(vault_policy):
    cfg = source_config(seed_offset=11, episodes=1, k=2, greedy=False)
    result = evaluate_source(cfg, resolve_sources(cfg)[0], vault_policy, max_context=512)
    assert (result.pass_at, result.avg, result.greedy) == ({2: 0.0}, 0.0, None)


# -- (c) a scorer of one's own -----------------------------------------------------------------------------


def test_custom_scorer_is_called_with_the_episode_and_its_env_and_its_verdict_counts(vault_policy):
    SCORED.clear()
    SEEN.clear()
    cfg = source_config(seed_offset=10, episodes=3, k=4, scorer="test_eval_sources:every_fourth")
    result = evaluate_source(cfg, resolve_sources(cfg)[0], vault_policy, max_context=512)
    assert len(SEEN) == 3 * 5  # 4 samples and a greedy episode per task
    assert all(ep_seed == env_seed for ep_seed, env_seed in SEEN)  # the env the episode ran in
    # every task holds one pass in 4 samples (the env's own reward, odd seeds 0, is not used)
    assert result.pass_at == {2: 0.5, 4: 1.0}
    assert result.avg == 0.25
    assert result.greedy == 1.0


def test_a_scorer_answer_outside_0_1_stops_the_evaluation_naming_the_source(vault_policy):
    cfg = source_config(seed_offset=10, episodes=1, k=1, scorer="test_eval_sources:too_much")
    with pytest.raises(ValueError, match=r"eval.sources\[0\] \(even\): scorer test_eval_sources:too_much returned 2.0 "
                                         r"on seed 10"):
        evaluate_source(cfg, resolve_sources(cfg)[0], vault_policy, max_context=512)


# -- (d) config errors say what and where ----------------------------------------------------------------


def test_k_below_one_is_refused_naming_the_field():
    with pytest.raises(ValidationError) as e:
        source_config(k=0)
    assert "eval.sources.0.k: Input should be greater than or equal to 1" in describe_errors(e.value)


def test_unknown_env_is_refused_naming_the_source():
    cfg = TrainConfig(eval={"sources": [{"name": "ok", "env": {"id": "test_eval_sources:EvenSeeds"}},
                                        {"name": "typo", "env": {"id": "agentrl/Vualt-v0"}}]})
    with pytest.raises(ValueError, match=r"eval.sources\[1\] \(typo\): env agentrl/Vualt-v0: unknown environment "
                                         r"'agentrl/Vualt-v0'"):
        resolve_sources(cfg)


def test_scorer_that_cannot_be_imported_is_refused_naming_the_source():
    with pytest.raises(ValueError, match=r"eval.sources\[0\] \(even\): cannot import scorer 'no_such_module_q:f'"):
        resolve_sources(source_config(scorer="no_such_module_q:f"))
    with pytest.raises(ValueError, match=r"eval.sources\[0\] \(even\): scorer 'test_eval_sources:nope': module "
                                         r"test_eval_sources has no function 'nope'"):
        resolve_sources(source_config(scorer="test_eval_sources:nope"))
    with pytest.raises(ValidationError, match="expected module:function"):
        source_config(scorer="just_a_module")


def test_names_must_be_metric_segments_and_distinct():
    with pytest.raises(ValidationError, match="becomes eval/<name>"):
        source_config(name="a/b")
    with pytest.raises(ValidationError, match="even given twice"):
        TrainConfig(eval={"sources": [{"name": "even"}, {"name": "even"}]})


def test_the_command_line_takes_sources_with_set_and_refuses_a_bad_one(capsys):
    given = "eval.sources=[{name: even, env: {id: 'test_eval_sources:EvenSeeds'}, k: 2, every: 5}]"
    assert main(["train", "--set", given, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "name: even" in printed and "k: 2" in printed and "every: 5" in printed
    bad = "eval.sources=[{name: even, scorer: 'no_such_module_q:f'}]"
    assert main(["train", "--set", bad, "--updates", "0", "--model", "unused"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "eval.sources[0] (even): cannot import scorer 'no_such_module_q:f'" in err


def test_a_source_on_the_held_out_split_of_the_training_env_is_not_flagged_as_seen_whatever_its_seeds():
    from agentrl.eval_sources import overlaps_training

    def flagged(env_id, train_kwargs, **source):
        cfg = TrainConfig(env={"id": env_id, "kwargs": train_kwargs},
                          eval={"sources": [{"name": "s", "seed_offset": 0, **source}]})
        [resolved] = resolve_sources(cfg)
        return resolved.env_kwargs.get("split"), overlaps_training(resolved, cfg)

    planted = "test_checker:Planted"  # an env that declares a split
    assert flagged(planted, {}) == ("eval", False)  # the training env, built with its held-out split: other tasks
    assert flagged(planted, {"split": "train"}) == ("train", True)  # the split named: training's tasks and seeds
    assert flagged("test_eval_sources:EvenSeeds", {}) == (None, True)  # no split: the seeds decide, and overlap
    assert flagged(planted, {}, env={"id": "test_eval_sources:EvenSeeds"}) == (None, False)  # another env


def test_without_sources_nothing_is_added():
    assert TrainConfig().eval.sources == []
    assert resolve_sources(TrainConfig()) == []


# -- (e) the starting model at step 0, and after ---------------------------------------------------------


def test_short_run_logs_each_source_at_step_0_on_its_cadence_and_at_the_end(tmp_path, vault_policy_dir):
    cfg = small_config(tmp_path, vault_policy_dir, eval={
        "episodes": 4, "every": 0,
        "sources": [{"name": "even", "env": {"id": "test_eval_sources:EvenSeeds"}, "episodes": 2, "k": 2,
                     "every": 1}]})
    out = tmp_path / "run"
    out.mkdir()
    console = io.StringIO()
    Trainer(cfg, monitor=Monitor(out, total=cfg.updates, console=Console(file=console, width=300))).train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # seeds 1,000,000 (even: passes) and 1,000,001 (odd: never)
    first = rows[0]
    assert first["step"] == 0 and not first.get("final")
    assert (first["eval/even/pass@2"], first["eval/even/avg@2"], first["eval/even/greedy_pass@1"]) == (0.5, 0.5, 0.5)
    assert "eval/pass_rate" in first  # the held-out evaluation stays, under its own name
    logged = [(r["step"], bool(r.get("final"))) for r in rows if "eval/even/pass@2" in r]
    assert logged == [(0, False), (1, False), (2, True)]  # every 1 update; the last update's is the final row
    text = console.getvalue()
    assert "eval even @ step 0: pass@2 0.500  avg@2 0.500  greedy pass@1 0.500  (2 tasks x 2 at T=1)" in text
    assert text.count("eval even @ step") == 3
    summary = json.loads((out / "summary.json").read_text())
    even = summary["eval_sources"]["even"]
    assert even["start"]["pass@2"] == 0.5 and even["final"]["pass@2"] == 0.5
    assert even["seeds"] == [1_000_000, 1_000_001] and even["scorer"] == "env" and even["k"] == 2
    report = write_report(out)["markdown"].read_text()
    assert "## Evaluation sources" in report and "| even | pass@2 | 0.5 (step 0) | 0.5 (step 2, final) |" in report


def test_a_resumed_run_keeps_its_step_0_source_results(tmp_path, vault_policy_dir):
    sources = {"sources": [{"name": "even", "env": {"id": "test_eval_sources:EvenSeeds"}, "episodes": 2, "k": 2}]}
    Trainer(small_config(tmp_path, vault_policy_dir, updates=1, checkpoint={"every": 1}, eval=sources)).train()
    resumed = Trainer(small_config(tmp_path, vault_policy_dir, updates=2, checkpoint={"every": 1}, eval=sources),
                      resume=True)
    summary = resumed.train()
    # the step-0 evaluation is not run again: its results come back from the checkpoint
    assert summary["eval_sources"]["even"]["start"] == {"pass@2": 0.5, "avg@2": 0.5, "greedy_pass@1": 0.5,
                                                        "score_mean": 0.5, "tasks": 2.0, "k": 2.0}
    assert summary["eval_sources"]["even"]["final"]["pass@2"] == 0.5
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], bool(r.get("final"))) for r in rows if "eval/even/pass@2" in r] == [(0, False), (2, True)]
