"""`agentrl report` on finished and running runs, and the TensorBoard logger read back."""

from __future__ import annotations

import base64
import json
import math
import re

import pytest
from test_health import example_rows

from agentrl.cli import main
from agentrl.health import check
from agentrl.report import read_metrics, write_report

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(folder, rows, tail: str = "", summary: dict | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    if summary:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_running_run_with_a_half_written_line_gets_a_report_with_its_alarms(tmp_path):
    run = write_run(tmp_path / "run", [{"step": 0, "eval/pass_rate": 0.4}] + example_rows(), tail='{"step": 4000, '
                    '"rollout/pass_')
    paths = write_report(run)
    md = paths["markdown"].read_text()
    assert "still running: 5 updates so far (last line half-written, skipped)" in md
    # replayed alarm timeline: collapse at 2400, stalled and KL drift at 3200, each with its reason
    assert re.search(r"\| ENTROPY COLLAPSE \| 2400 \| entropy 0\.480 .*floor 0\.549", md)
    assert "| STALLED | 3200 |" in md and "| KL DRIFT | 3200 |" in md
    assert {p.stem for p in paths["plots"]} == {"pass_rate", "entropy", "kl"}  # only what the run logged
    for p in paths["plots"]:
        assert p.read_bytes().startswith(PNG) and f"report_plots/{p.name}" in md


def test_the_html_is_self_contained(tmp_path):
    rows = [{**r, "credit/zero_adv_frac": 0.2, "train/clip_low_frac": 0.01, "train/clip_high_frac": 0.02,
             "rollout/turns_mean": 4.0,
             "rollout/truncated_frac": 0.1} for r in example_rows()]
    run = write_run(tmp_path / "run", rows,
                    summary={"updates": 3200, "warm_start_pass_rate": 0.4, "final_pass_rate": 0.79, "algo": "grpo",
                                                     "env": "agentrl/Vault-v0", "wall_s": 12.0})
    page = write_report(run)["html"].read_text()
    images = re.findall(r"src=['\"]data:image/png;base64,([A-Za-z0-9+/=]+)['\"]", page)
    assert len(images) == 6 and all(base64.b64decode(i).startswith(PNG) for i in images)
    assert not re.search(r"(src|href)=['\"]?(http|//|[\w./-]+\.(png|css|js))", page)  # nothing fetched from elsewhere
    assert "finished: 3200 updates" in page and "ENTROPY COLLAPSE" in page


def test_logged_alarm_states_are_what_the_report_shows(tmp_path):
    rows = example_rows()
    logged = [{**r, **check(rows[: i + 1]).metrics()} for i, r in enumerate(rows)]
    logged[0]["health/verifier_overfit"] = 1.0
    logged[0]["health/reasons"] = ["VERIFIER OVERFIT: as the run logged it"]
    md = write_report(write_run(tmp_path / "run", logged))["markdown"].read_text()
    assert "| VERIFIER OVERFIT | 200 | as the run logged it |" in md


def test_damaged_files_and_missing_runs_fail_with_the_place_named(tmp_path):
    run = write_run(tmp_path / "bad", example_rows()[:2], tail="not json\n" + json.dumps(example_rows()[2]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 3: not JSON"):
        read_metrics(run / "metrics.jsonl")
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert main(["report", str(write_run(tmp_path / "ok", example_rows()))]) == 0
    assert (tmp_path / "ok" / "report.html").is_file()


def test_tensorboard_events_read_back_equal_metrics_jsonl(tmp_path, vault_policy_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_e2e import small_config

    from agentrl.trainer import Trainer

    cfg = small_config(tmp_path, vault_policy_dir, log={"tensorboard": True})
    Trainer(cfg).train()
    run = tmp_path / "run"
    rows, _ = read_metrics(run / "metrics.jsonl")
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    checked = 0
    for r in rows:
        prefix = "final/" if r.get("final") else ""
        for k, v in r.items():
            if k in ("step", "time", "final") or isinstance(v, (str, list, bool)):
                continue
            events = [e for e in acc.Scalars(prefix + k) if e.step == r["step"]]
            assert len(events) == 1, (prefix + k, r["step"])
            assert events[0].value == pytest.approx(v, rel=1e-6, abs=1e-6) or (math.isnan(v)
                                                                               and math.isnan(events[0].value))
            checked += 1
    assert checked > 40 and {"health/stalled", "train/entropy", "eval/pass_rate", "final/eval/pass_rate"} <= tags


def test_the_report_shows_credit_the_config_and_log_axes_without_scratch_paths(tmp_path, monkeypatch):
    import matplotlib.axes

    rows = [{**r, "credit/critic_ev": 0.1 * i, "credit/adv_abs_mean": 0.5, "credit/critic_warmup": float(i < 2)}
            for i, r in enumerate(example_rows())]
    run = write_run(tmp_path / "scratch" / "my-run", rows)
    (run / "config.yaml").write_text("algo: turn-ppo\ncredit:\n  algo: turn-ppo\n  gamma: 0.99\n")
    scales, limits = {}, {}
    set_yscale, set_xlim = matplotlib.axes.Axes.set_yscale, matplotlib.axes.Axes.set_xlim
    monkeypatch.setattr(matplotlib.axes.Axes, "set_yscale",
                        lambda ax, v, **kw: (scales.__setitem__(ax.get_title() or len(scales), v),
                                             set_yscale(ax, v, **kw)))
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xlim",
                        lambda ax, *a, **kw: (limits.__setitem__(id(ax), a), set_xlim(ax, *a, **kw)))
    paths = write_report(run)
    md = paths["markdown"].read_text()
    assert "credit" in {p.stem for p in paths["plots"]}
    assert "## Resolved config" in md and "gamma: 0.99" in md and "gamma: 0.99" in paths["html"].read_text()
    assert str(tmp_path) not in md and str(tmp_path) not in paths["html"].read_text()  # the folder's name only
    assert "my-run" in md
    assert sorted(set(scales.values())) == ["log", "symlog"]  # entropy on log, KL on symlog
    assert len(set(limits.values())) == 1  # one shared x-axis over every panel
