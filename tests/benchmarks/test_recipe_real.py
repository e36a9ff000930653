"""benchmarks/recipe_real.py builds a valid run for every (family, arm), at its full and its quick size, without
running one; and its JSON writer turns hand-made runs into the schema the issue asks for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import recipe_real as bench  # noqa: E402


def args_for(argv: list[str]):
    return bench.sized(bench.build_parser().parse_args(argv))


@pytest.mark.parametrize("argv", [[], ["--quick"]], ids=["full", "quick"])
def test_every_run_is_a_valid_config_at_its_size(argv):
    args = args_for(argv)
    quick = bool(argv)
    assert args.seeds == ([0] if quick else [0, 1, 2])
    for family, fam in bench.FAMILIES.items():
        arms = bench.arms_of(family)
        turn_level = {"sft+dpo+rl:turn-ppo", "sft+dpo+rl:gigpo"}
        assert turn_level & set(arms) == (turn_level if fam.longer else set())
        for arm in arms:
            rc = bench.config(args, family, arm, seed=2)
            assert rc.sft.env.id == fam.env_id and rc.sft.seed == 2 and rc.sft.updates == 0
            assert rc.sft.model == (None if quick else "smollm2-135m-instruct")
            assert rc.sft.sft.episodes == (32 if quick else fam.sft_episodes)
            assert rc.sft.rollout.sampling.max_new_tokens == (48 if quick else 160)
            assert rc.sft.eval.episodes == (4 if quick else 24) and rc.sft.eval.every == 0
            budget = 8 if quick else fam.budget
            if arm == "sft":
                assert rc.rl is None and rc.dpo is None
                continue
            # every RL arm samples the whole budget after SFT: DPO's rollouts plus RL's
            assert rc.dpo_episodes + rc.rl_episodes == budget
            assert rc.rl.updates * rc.rl.rollout.groups * rc.rl.rollout.group_size == rc.rl_episodes
            assert rc.rl.algo == {"sft+dpo+rl:turn-ppo": "turn-ppo", "sft+dpo+rl:gigpo": "gigpo"}.get(arm, "grpo")
            assert (rc.dpo is not None) == ("+dpo+" in arm)
            if rc.dpo is not None:
                assert rc.dpo.loss == "dpo" and rc.dpo.groups * rc.dpo.group_size == rc.dpo_episodes
            if not quick:  # PRETRAINED's RL settings where the benchmark sets none: LoRA r16 at 5e-5
                assert (rc.rl.optim.lora.r, rc.rl.optim.lr) == (16, 5e-5)


def test_turn_ppo_and_grpo_get_the_same_budget():
    args = args_for([])
    grpo = bench.config(args, "rg-chain", "sft+dpo+rl", seed=0)
    turn = bench.config(args, "rg-chain", "sft+dpo+rl:turn-ppo", seed=0)
    assert (grpo.rl.updates, grpo.rl.rollout.groups, grpo.rl.rollout.group_size) == \
        (turn.rl.updates, turn.rl.rollout.groups, turn.rl.rollout.group_size)
    assert grpo.dpo == turn.dpo  # one DPO model per seed, shared


def test_full_default_budget_split_by_hand():
    # bfcl: 48 episodes, 8 an update; a quarter is 12, rounded down to whole updates: 8 for DPO, 5 updates of RL
    rc = bench.config(args_for([]), "bfcl", "sft+dpo+rl", seed=0)
    assert (rc.dpo_episodes, rc.rl.updates) == (8, 5)
    rc = bench.config(args_for([]), "rg-chain", "sft+rl", seed=0)
    assert (rc.dpo_episodes, rc.rl.updates) == (0, 8)


def stage(name, p, seconds, episodes=4, **extra):
    return {"stage": name, "pass_at_1": p, "episodes": episodes, "seconds": seconds, **extra}


def test_the_json_writer_on_hand_made_runs(tmp_path, monkeypatch):
    args = args_for(["--quick"])
    monkeypatch.setattr(bench, "pool_size", lambda family, split: {"train": 160, "eval": 40}[split])
    rl_stage = {**stage("rl (grpo)", 0.75, 30.0), "entropy": [1.2, None], "kl": [0.01, None],
                "alarms": {"entropy_collapse": "entropy_collapse: entropy fell"}}
    runs = []
    for seed, (sft_p, final) in enumerate([(0.25, 0.75), (0.5, 1.0)]):
        sft = bench.config(args, "bfcl", "sft", seed)
        runs.append(bench.run_record(sft, [stage("sft", sft_p, 10.0)]))
        full = bench.config(args, "bfcl", "sft+dpo+rl", seed)
        runs.append(bench.run_record(full, [stage("sft", sft_p, 10.0), stage("dpo", 0.5, 5.0, pairs=2),
                                            {**rl_stage, "pass_at_1": final}]))
    res = bench.result(args, runs, planned=None)
    out = bench.save("recipe_real", res, path=tmp_path / "r.json")
    data = json.loads(out.read_text())
    assert data["model"] and set(data["families"]) == {"bfcl", "rg-chain"}
    row = data["runs"][1]
    assert {"family", "arm", "seed", "heldout_tasks", "train_tasks", "scorer", "pass_at_1", "seconds",
            "alarms"} <= set(row)
    assert row["arm"] == "sft+dpo+rl" and row["heldout_tasks"] == 4 and row["train_tasks"] == 160
    assert row["pass_at_1"] == {"sft": 0.25, "dpo": 0.5, "rl": 0.75}
    assert row["seconds"] == {"sft": 10.0, "dpo": 5.0, "rl": 30.0, "total": 45.0}
    assert row["entropy"] == [1.2, None] and list(row["alarms"]) == ["entropy_collapse"]
    # per (family, arm) over the two seeds: the final pass@1s 0.75 and 1.0 -> mean 0.875, stderr
    # stdev(0.75, 1.0) / sqrt 2 = 0.1768 / 1.4142 = 0.125
    assert data["summary"]["bfcl/sft+dpo+rl"]["final"] == {"mean": 0.875, "stderr": 0.125, "n": 2}
    assert data["summary"]["bfcl/sft+dpo+rl"]["per_seed"]["1"] == {"sft": 0.5, "dpo": 0.5, "rl": 1.0, "seconds": 45.0}
    # ratio: sft+dpo+rl's mean final (0.875) over sft's (0.25 and 0.5 -> 0.375)
    assert data["ratio"] == round(0.875 / 0.375, 3)


def test_ratio_is_none_when_sft_scores_zero_everywhere(monkeypatch):
    args = args_for(["--quick"])
    monkeypatch.setattr(bench, "pool_size", lambda family, split: 8)
    runs = [bench.run_record(bench.config(args, "rg-chain", "sft", 0), [stage("sft", 0.0, 1.0)]),
            bench.run_record(bench.config(args, "rg-chain", "sft+dpo+rl", 0),
                             [stage("sft", 0.0, 1.0), {"stage": "dpo (skipped: no pairs)", "skipped": True,
                                                       "seconds": 2.0},
                              stage("rl (grpo)", 0.5, 3.0, entropy=[None], kl=[None], alarms={})])]
    assert bench.summarize(runs)[1] is None
    assert runs[1]["dpo_skipped"] and runs[1]["pass_at_1"]["dpo"] == 0.0  # the SFT model, unchanged


def slice_file(tmp_path, name, runs):
    args = args_for(["--quick"])
    return bench.save("recipe_real", bench.result(args, runs, planned=None), path=tmp_path / name)


def test_merge_combines_slices_and_judges_the_rise_from_step_0(tmp_path, monkeypatch, capsys):
    """Slices run apart (seed 0 in one file, seeds 1 and 2 in another, seed 0 rerun in a third) merge into one
    result: a later file's run replaces an earlier's, and the rise from step 0 is judged over the three seeds."""
    args = args_for(["--quick"])
    monkeypatch.setattr(bench, "pool_size", lambda family, split: 8)

    def full(seed, final):
        rc = bench.config(args, "rg-chain", "sft+dpo+rl", seed)
        return bench.run_record(rc, [stage("base", 0.125, 1.0), stage("sft", 0.25, 1.0), stage("dpo", 0.25, 1.0),
                                     stage("rl (grpo)", final, 1.0, entropy=[], kl=[], alarms={})])

    a = slice_file(tmp_path, "a.json", [full(0, 0.0)])  # replaced by c.json's seed 0
    b = slice_file(tmp_path, "b.json", [full(1, 0.5), full(2, 0.75)])
    c = slice_file(tmp_path, "c.json", [full(0, 0.25)])
    out = tmp_path / "merged.json"
    bench.main(["--quick", "--merge", str(a), str(b), str(c), "--json", str(out)])
    data = json.loads(out.read_text())
    assert [(r["seed"], r["final_pass_at_1"]) for r in data["runs"]] == [(0, 0.25), (1, 0.5), (2, 0.75)]
    assert list(data["families"]) == ["rg-chain"] and [s["file"] for s in data["slices"]] == ["a.json", "b.json",
                                                                                              "c.json"]
    rise = data["rise"]["rg-chain"]
    # finals 0.25, 0.5, 0.75: mean 0.5, stdev 0.25, stderr 0.25 / sqrt 3 = 0.1443; step 0 is 0.125.
    # every seed is above 0.125, and the rise, 0.375, is more than 2 x 0.1443 = 0.2887: beyond the spread
    assert rise["step0"] == 0.125 and rise["final"] == {"mean": 0.5, "stderr": 0.1443, "n": 3}
    assert rise["every_seed_above"] and rise["beyond_spread"]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rise"]["rg-chain"]["beyond_spread"]


def test_a_rise_within_the_spread_is_not_beyond_it(monkeypatch):
    args = args_for(["--quick"])
    monkeypatch.setattr(bench, "pool_size", lambda family, split: 8)
    runs = [bench.run_record(bench.config(args, "rg-chain", "sft+dpo+rl", seed),
                             [stage("base", 0.0, 1.0), stage("sft", 0.0, 1.0),
                              stage("rl (grpo)", final, 1.0, entropy=[], kl=[], alarms={})])
            for seed, final in enumerate([0.0, 0.125, 0.375])]
    # seed 0 ends at step 0's 0.0: not every seed rises, so not beyond the spread, whatever the mean says
    rise = bench.rise(runs, "rg-chain")
    assert not rise["every_seed_above"] and not rise["beyond_spread"]
    # one seed only: no spread to be beyond
    assert bench.rise(runs[2:], "rg-chain")["beyond_spread"] is False
    assert bench.rise(runs, "bfcl") is None


def test_merge_refuses_a_file_of_another_benchmark(tmp_path):
    other = tmp_path / "context.json"
    other.write_text(json.dumps({"benchmark": "context", "runs": []}))
    with pytest.raises(SystemExit, match="not a recipe_real result"):
        bench.main(["--quick", "--merge", str(other)])


def test_rl_health_counts_updates_without_a_gradient_and_the_entropy_drift(monkeypatch):
    args = args_for(["--quick"])
    monkeypatch.setattr(bench, "pool_size", lambda family, split: 8)
    curves = [([0.1, None, 0.08], [0.0, None, 0.002], {}), ([None, 0.05, 0.06, None], [None, 0.0, 0.001, None],
                                                          {"kl_drift": "kl_drift: ..."})]
    runs = [bench.run_record(bench.config(args, "rg-chain", "sft+rl", seed),
                             [stage("sft", 0.0, 1.0), stage("rl (grpo)", 0.1, 1.0, entropy=e, kl=k, alarms=a)])
            for seed, (e, k, a) in enumerate(curves)]
    h = bench.rl_health(runs, "rg-chain")
    # 3 + 4 updates, 1 + 2 without a gradient; entropy last/first 0.08 / 0.1 = 0.8 and 0.06 / 0.05 = 1.2
    assert h == {"rl_runs": 2, "updates": 7, "updates_critic_only": 0, "updates_without_gradient": 3,
                 "entropy_last_over_first_min": 0.8, "entropy_last_over_first_max": 1.2, "kl_max": 0.002,
                 "alarms": ["kl_drift"]}
    assert bench.rl_health(runs, "bfcl") is None


def test_rl_health_counts_a_critics_warm_up_apart_from_updates_without_a_gradient(monkeypatch):
    args = args_for(["--quick"])
    monkeypatch.setattr(bench, "pool_size", lambda family, split: 8)
    # turn-ppo: two critic-only updates (no policy step, so no entropy), then one all-zero update, then a step
    rl = stage("rl (turn-ppo)", 0.1, 1.0, entropy=[None, None, None, 0.09], kl=[None, None, None, 0.001], alarms={},
               critic_only=[True, True, False, False])
    runs = [bench.run_record(bench.config(args, "rg-chain", "sft+dpo+rl:turn-ppo", 0), [stage("sft", 0.0, 1.0), rl])]
    assert runs[0]["critic_only"] == [True, True, False, False]
    h = bench.rl_health(runs, "rg-chain")
    assert (h["updates"], h["updates_critic_only"], h["updates_without_gradient"]) == (4, 2, 1)


def test_merge_names_a_file_it_cannot_read(tmp_path):
    broken = tmp_path / "half.json"
    broken.write_text('{"benchmark": "recipe_real", "runs": [')  # a slice cut off mid-write
    with pytest.raises(SystemExit, match="cannot read .*half.json"):
        bench.main(["--quick", "--merge", str(broken)])
    with pytest.raises(SystemExit, match="cannot read .*absent.json"):
        bench.main(["--quick", "--merge", str(tmp_path / "absent.json")])
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="not a recipe_real result"):
        bench.main(["--quick", "--merge", str(listed)])


def test_the_plan_takes_a_stage_measured_at_the_same_size_over_its_estimate(tmp_path):
    args = args_for(["--families", "rg-chain", "--arms", "sft+rl", "--seeds", "0"])
    settings = {"sft": {"episodes": 128, "epochs": 2}, "dpo_episodes": 0}
    run = {"family": "rg-chain", "heldout_episodes": 24, "settings": settings,
           "stages": [stage("base", 0.0, 100.0), stage("sft", 0.1, 600.0), stage("rl (grpo)", 0.1, 240.0, updates=8)]}
    other = {**run, "heldout_episodes": 48, "stages": [stage("base", 0.0, 9999.0)]}  # another evaluation size
    slow = {**run, "stages": [stage("base", 0.0, 300.0), stage("sft", 0.1, 900.0),
                              stage("rl (grpo)", 0.1, 400.0, updates=8)]}
    path = tmp_path / "recipe_real.json"
    path.write_text(json.dumps({"runs": [run, other, slow, run]}))
    assert bench.measured_stages(path, 24)["rg-chain"] == {  # medians of 100, 300, 100; 600, 900, 600; 30, 50, 30
        ("base", None): 100.0, ("sft", (128, 2)): 600.0, ("rl_update", None): 30.0}
    rows = {r["arm"]: r for r in bench.plan(args, say=lambda s: None, measured_from=path)["runs"]}
    assert (rows["base"]["eta_s"], rows["base"]["measured"]) == (100, True)
    # the SFT model (600 s, its evaluation in it), then 8 updates at 30 s, the final evaluation in them
    assert (rows["sft+rl"]["eta_s"], rows["sft+rl"]["measured"]) == (600 + 8 * 30, True)
    # another SFT size was never measured: the SFT part is an estimate, and the row says so
    resized = args_for(["--families", "rg-chain", "--arms", "sft+rl", "--seeds", "0", "--sft-episodes", "64"])
    row = bench.plan(resized, say=lambda s: None, measured_from=path)["runs"][1]
    assert row["measured"] is False and row["eta_s"] != 600 + 8 * 30
    assert bench.measured_stages(tmp_path / "absent.json", 24) == {}
