"""benchmarks/rl_longer_real.py: its config is recipe_real's sft+rl arm at more updates, a finished run of that
config is read rather than run again, and its curves and summary come out of hand-made metrics as computed here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rl_longer_real as bench  # noqa: E402


def args_for(argv):
    args = bench.build_parser().parse_args(argv)
    args.seeds, args.updates, args.eval_every = [0], 40, 10
    return args


def test_the_config_is_recipe_reals_sft_rl_arm_longer(tmp_path):
    import recipe_real

    rc, cfg = bench.stage_config(args_for([]), 1, tmp_path / "sft", tmp_path / "run")
    arm = recipe_real.config(recipe_real.sized(recipe_real.build_parser().parse_args([])), "rg-chain", "sft+rl", 1).rl
    assert (cfg.updates, cfg.eval.every, cfg.model, cfg.out) == (40, 10, str(tmp_path / "sft"), str(tmp_path / "run"))
    same = {"updates", "eval", "model", "out"}
    assert cfg.model_dump(exclude=same) == arm.model_dump(exclude=same)  # grpo, LoRA r16, lr 5e-5, 2 x 4, seed 1
    assert cfg.eval.episodes == arm.eval.episodes == 24 and rc.sft.seed == 1


def test_a_finished_run_of_the_same_config_is_read_and_another_is_not(tmp_path):
    import yaml

    _, cfg = bench.stage_config(args_for([]), 0, tmp_path / "sft", tmp_path / "run")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json") | {"out": "/elsewhere"}))
    assert not bench.finished(cfg, run)  # no summary.json: cut off
    (run / "summary.json").write_text("{}")
    assert bench.finished(cfg, run)  # the output folder aside, the same run
    assert not bench.finished(cfg.model_copy(update={"updates": 39}), run)

    def with_optim(**change):
        return cfg.model_copy(update={"optim": cfg.optim.model_copy(update=change)})

    assert not bench.finished(with_optim(lr=2 * cfg.optim.lr), run)
    assert bench.finished(with_optim(micro_batch_tokens=512), run)  # a memory knob: the same gradient, the same run


def write_metrics(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_curves_and_summary_by_hand(tmp_path):
    ent = [0.1, 0.1, None, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05]  # 11 updates, one without a gradient
    rows = [{"step": 0, "time": 1.0, "eval/pass_rate": 0.1}]
    for i, e in enumerate(ent, start=1):
        rows.append({"step": i, "time": 10.0 * i, "train/entropy": e, "train/kl": None if e is None else 0.001 * i,
                     "rollout/pass_rate": 0.25, "health/status": "healthy",
                     "health/reasons": ["entropy collapse: under the floor"] if i in (9, 10) else []}
                    | ({"eval/pass_rate": 0.2} if i == 5 else {}))
    rows.append({"step": 11, "time": 115.0, "final": True, "eval/pass_rate": 0.3})
    r = bench.run_record(write_metrics(tmp_path / "a", rows))
    assert [(h["step"], h["pass_rate"]) for h in r["heldout"]] == [(0, 0.1), (5, 0.2), (11, 0.3)]
    assert (r["step0"], r["final"], r["updates"], r["updates_without_gradient"]) == (0.1, 0.3, 11, 1)
    # the first five updates that moved: 0.1 x 5; the last five: 0.05 x 5; 0.05 / 0.1
    assert r["entropy_last5_over_first5"] == 0.5
    assert r["kl_max"] == 0.011 and r["fired"] == {"entropy collapse": 9} and r["seconds"] == 115.0

    other = dict(r, heldout=[{"step": 0, "pass_rate": 0.0}, {"step": 11, "pass_rate": 0.1}], step0=0.0, final=0.1,
                 fired={}, kl_max=0.002)
    s = bench.summarize({0: r, 1: other})
    # step 0: (0.1 + 0.0) / 2; final (0.3 + 0.1) / 2; rises 0.2 and 0.1, mean 0.15, sd 0.0707, se 0.05
    assert s["step0"]["mean"] == 0.05 and s["final"]["mean"] == 0.2 and s["ratio"] == 4.0
    assert s["rise"] == {"every_seed_above": True, "mean": 0.15, "stderr": 0.05, "beyond_spread": True}
    assert s["heldout"]["5"] == {"mean": 0.2, "stderr": None, "n": 1}  # only one seed evaluated at step 5
    assert s["fired"] == ["entropy collapse"] and s["kl_max"] == 0.011


def test_no_rise_beyond_the_spread_when_one_seed_falls():
    def run(start, end):
        return {"heldout": [{"step": 0, "pass_rate": start}, {"step": 4, "pass_rate": end}], "step0": start,
                "final": end, "fired": {}, "entropy_last5_over_first5": None, "kl_max": None}

    s = bench.summarize({0: run(0.1, 0.4), 1: run(0.2, 0.1)})  # rises 0.3 and -0.1: mean 0.1, se 0.2
    assert s["rise"]["every_seed_above"] is False and s["rise"]["beyond_spread"] is False
    assert s["rise"]["stderr"] == pytest.approx(0.2)
