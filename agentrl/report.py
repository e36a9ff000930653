"""`agentrl report RUN_DIR`: a markdown and a self-contained HTML report of a run, with plots.

Works on a finished run and on one still running: `metrics.jsonl` is read line by line and a
half-written last line is skipped. Alarm spans come from the states the run logged (`health/*`);
a run without them (older, or logged elsewhere) is replayed through `agentrl.health.check`.

>>> import json, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> rows = [{"step": s, "rollout/pass_rate": 0.1 * s, "train/entropy": 1.0} for s in range(1, 4)]
>>> _ = (d / "metrics.jsonl").write_text("\\n".join(map(json.dumps, rows)) + '\\n{"step": 4, "rollo')
>>> paths = write_report(d)
>>> sorted(paths), "still running" in paths["markdown"].read_text()
(['html', 'markdown', 'plots'], True)
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.config import SOURCE_NAME, read_yaml
from agentrl.health.alarms import ALARMS, ENTROPY_COLLAPSE, KL_DRIFT, alarm_spans, replay
from agentrl.health.config import HealthConfig
from agentrl.health.series import series
from agentrl.pages import figure, page, png, pyplot, table

Row = dict[str, Any]
# (file name, title, [(metric, label)], y label)
PLOTS = [
    ("pass_rate", "Pass rate: train vs held-out",
     [("rollout/pass_rate", "train (rollout)"), ("eval/pass_rate", "held-out")], "pass rate"),
    # drawn only for a run that logs it (on-policy distillation), next to the pass rate it should lift
    ("teacher_kl", "On-policy distillation: reverse KL to the teacher",
     [("credit/teacher_kl", "KL(student || teacher), per action token")], "nats / token"),
    ("entropy", "Entropy of action tokens", [("train/entropy", "entropy")], "nats / token"),
    ("kl", "KL to the reference (k3)", [("train/kl", "KL")], "per token"),
    ("zero_adv", "Zero-advantage groups",
     [("credit/zero_adv_frac", "zero-advantage"), ("credit/all_pass_frac", "all pass"),
                                           ("credit/all_fail_frac", "all fail")], "fraction of groups"),
    ("clip", "Clip fraction", [("train/clip_low_frac", "low (A < 0)"), ("train/clip_high_frac", "high (A > 0)")],
     "fraction of tokens"),
    ("length", "Episode length", [("rollout/turns_mean", "turns"), ("rollout/truncated_frac", "truncated fraction")],
     "turns / fraction"),
    ("credit", "Credit: what the assigner learned and handed out",
     [("credit/critic_ev", "turn critic explained variance"), ("credit/prm_outcome_corr", "PRM-outcome correlation"),
      ("credit/adv_abs_mean", "mean |advantage|"), ("credit/value_change_concentration", "value-change concentration"),
      ("credit/critic_warmup", "critic-only warm-up (1)")], "value"),
]
# one spike must not hide a collapse: these are drawn on log axes (symlog where the metric can be 0)
LOG_SCALE = {"entropy": "log", "kl": "symlog"}


def read_metrics(path: Path | str) -> tuple[list[Row], bool]:
    """The rows of a metrics.jsonl and whether its last line was cut off (a run still writing it).

    A broken line anywhere but last is an error: that file was damaged, not merely in progress.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (is this a run folder?)")
    lines = path.read_text().splitlines()
    rows, partial = [], False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                partial = True  # being written right now
                continue
            raise ValueError(f"{path}, line {i + 1}: not JSON ({e.msg}); only the last line may be "
                             "half-written") from None
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(f"{path}, line {i + 1}: a metrics row must be an object with 'step'")
        rows.append(row)
    return rows, partial


def _health_config(run: Path) -> HealthConfig:
    cfg_file = run / "config.yaml"
    if cfg_file.is_file():
        data = read_yaml(cfg_file)  # bounded in size and alias expansion, as any config the user gives
        if isinstance(data.get("health"), dict):
            return HealthConfig(**data["health"])
    return HealthConfig()


def _colour(alarm: str) -> str:
    """The colour an alarm's spans are shaded with: its spec's (`AlarmSpec.colour`); grey for a name no longer
    registered (an old run's)."""
    return ALARMS[alarm].colour if alarm in ALARMS else "#bbbbbb"


def plot(rows: Sequence[Row], name: str, title: str, lines: Sequence[tuple[str, str]], ylabel: str,
         spans: dict[str, list[tuple[float, float]]], folder: Path, hc: HealthConfig) -> Path | None:
    """One PNG: the metrics of `lines` over steps, alarm spans shaded. None if no metric is logged."""
    plt = pyplot()
    # an evaluation (eval/...) is drawn from step 0, the starting model's, to the final row's; other metrics from 1
    data = {key: [(s, v) for s, v in series(rows, key) if key.startswith("eval/") or s != 0] for key, _ in lines}
    finals = [r for r in rows if r.get("final")]
    for key in data:
        if key.startswith("eval/") and finals and key in finals[-1]:
            data[key] = data[key] + [(float(finals[-1]["step"]), float(finals[-1][key]))]
    if not any(data.values()):
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    steps = sorted({float(r["step"]) for r in rows if not r.get("final")})
    if steps:  # every plot over the same x-axis, the whole run, so that panels line up
        ax.set_xlim(0, max(max(steps), 1))
    for name_, runs in spans.items():
        for a, b in runs:
            # shade the interval since the row before: an alarm at a row covers the updates that led to it
            left = max((s for s in steps if s < a), default=a - 0.5)
            ax.axvspan(left, b if b > left + 0.5 else b + 0.5, color=_colour(name_), alpha=0.18, lw=0)
    for key, label in lines:
        pts = data[key]
        if pts:
            xs, ys = zip(*pts)
            style = dict(marker="o", ms=4) if key.startswith("eval/") else dict(lw=1.4)
            ax.plot(xs, ys, label=label, **style)
    if name == "kl":
        ax.axhline(hc.kl_warn, color=_colour(KL_DRIFT), ls="--", lw=0.8, label=f"warn {hc.kl_warn}")
    if name == "entropy":
        floor = replay(rows, hc)[-1].entropy_floor if rows else None
        if floor:
            ax.axhline(floor, color=_colour(ENTROPY_COLLAPSE), ls="--", lw=0.8, label=f"collapse floor {floor:.3f}")
    for name_ in spans:  # a legend entry per alarm shown
        ax.fill_between([], [], color=_colour(name_), alpha=0.3, label=name_)
    scale = LOG_SCALE.get(name)
    values = [v for pts in data.values() for _, v in pts]
    if scale == "log" and values and min(values) > 0:
        ax.set_yscale("log")
    elif scale:
        ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("update")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    path = folder / f"{name}.png"
    path.write_bytes(png(fig))
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def write_report(run_dir: Path | str, out: Path | str | None = None) -> dict[str, Any]:
    """Write report.md, report.html and report_plots/*.png; returns their paths."""
    run = Path(run_dir)
    rows, partial = read_metrics(run / "metrics.jsonl")
    if not rows:
        raise ValueError(f"{run / 'metrics.jsonl'} holds no complete row yet")
    out_dir = Path(out) if out else run
    plots_dir = out_dir / "report_plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    hc = _health_config(run)
    spans = alarm_spans(rows, hc)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else None
    updates = [r for r in rows if not r.get("final") and float(r["step"]) > 0]
    last = updates[-1] if updates else rows[-1]
    if summary:
        state = (f"finished: {summary.get('updates_done', summary.get('updates'))} updates"
                 + (f", stopped early ({summary['stopped']})" if summary.get("stopped") else ""))
    else:
        state = f"still running: {len(updates)} updates so far" + (" (last line half-written, skipped)" if partial
                                                                   else "")

    # figures: the fixed ones, then one per evaluation source
    sources = source_keys(rows)
    specs = PLOTS + [(f"source_{name}", f"Evaluation source {name}", [(f"eval/{name}/{m}", m) for m in metrics],
                      "pass rate") for name, metrics in sources.items()]
    pngs = [p for p in (plot(rows, *spec, spans, plots_dir, hc) for spec in specs) if p is not None]
    source_table = [(name, m, *first_and_last(rows, f"eval/{name}/{m}")) for name, metrics in sources.items()
                    for m in metrics]

    # alarm timeline: spans and the first reason logged (or replayed) for each
    reasons: dict[str, str] = {}
    for r in updates:
        for text in r.get("health/reasons", []):
            name = text.split(":", 1)[0]
            reasons.setdefault(name, text.split(":", 1)[-1].strip())
    if not any("health/reasons" in r for r in updates):
        for h in replay(rows, hc):
            for a in h.alarms:
                reasons.setdefault(a.name, a.reason)
    timeline = [(name, ", ".join(f"{a:.0f}" if a == b else f"{a:.0f}-{b:.0f}" for a, b in spans[name]),
                 reasons.get(name, ""))
                for name in ALARMS if name in spans]
    actions = [(r["step"], a) for r in updates for a in r.get("health/actions", [])]
    heldout = [(s, v) for s, v in series(rows, "eval/pass_rate")] + [
        (float(r["step"]), r["eval/pass_rate"]) for r in rows if r.get("final") and "eval/pass_rate" in r]

    status = last.get("health/status") or (replay(rows, hc)[-1].status if updates else "-")
    # the folder's own name, not the path it was written under (no scratch paths in committed reports)
    facts = [("run", run.resolve().name), ("state", state), ("status at last update", str(status))]
    if summary:
        facts += [("held-out pass rate", f"{summary.get('warm_start_pass_rate', float('nan')):.3f} -> "
                   f"{summary.get('final_pass_rate', float('nan')):.3f}"),
                  ("algo / env", f"{summary.get('algo')} / {summary.get('env')}"),
                  ("wall time", f"{summary.get('wall_s', 0):.0f} s")]
    elif heldout:
        facts += [("held-out pass rate", " -> ".join(f"{v:.3f}" for _, v in (heldout[0], heldout[-1])))]
    keys = ["rollout/pass_rate", "eval/pass_rate", "credit/teacher_kl", "train/entropy", "train/kl",
            "credit/zero_adv_frac",
            "train/clip_low_frac", "train/clip_high_frac",
            "rollout/turns_mean", "rollout/truncated_frac", "train/grad_norm"]
    last_metrics = [(k, _fmt(last[k])) for k in keys if k in last]

    config = (run / "config.yaml").read_text() if (run / "config.yaml").is_file() else ""
    md = _markdown(facts, timeline, actions, last_metrics, pngs, out_dir, source_table) + _config_md(config)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(md)
    html_path.write_text(_html(facts, timeline, actions, last_metrics, pngs, config, source_table))
    return {"markdown": md_path, "html": html_path, "plots": pngs}


def source_keys(rows: Sequence[Row]) -> dict[str, list[str]]:
    """The evaluation sources a run logged (eval/<name>/<metric>), each with its pass-rate metrics in logged order.

    >>> source_keys([{"step": 0, "eval/pass_rate": 0.5, "eval/rg/pass@2": 0.5, "eval/rg/avg@2": 0.25,
    ...               "eval/rg/tasks": 8.0}])
    {'rg': ['pass@2', 'avg@2']}
    """
    out: dict[str, list[str]] = {}
    for r in rows:
        for key in r:
            parts = key.split("/")
            # a source's name is a file name's part below (its plot): only the names eval.sources accepts
            if len(parts) == 3 and parts[0] == "eval" and SOURCE_NAME.fullmatch(parts[1]) \
                    and parts[2] not in ("tasks", "k", "score_mean"):
                metrics = out.setdefault(parts[1], [])
                if parts[2] not in metrics:
                    metrics.append(parts[2])
    return out


def first_and_last(rows: Sequence[Row], key: str) -> tuple[str, str]:
    """`key`'s first value (step 0: the starting model) and its last (the final row's, if there is one), each
    with its step, as the report's table cells."""
    cells = [f"{_fmt(float(r[key]))} (step {float(r['step']):.0f}{', final' if r.get('final') else ''})"
             for r in rows if key in r]
    return (cells[0], cells[-1]) if cells else ("-", "-")


def _markdown(facts, timeline, actions, last_metrics, pngs, out_dir: Path, source_table=()) -> str:
    lines = ["# Run report", ""] + [f"- **{k}**: {v}" for k, v in facts]
    if source_table:
        lines += ["", "## Evaluation sources", "", "| source | metric | first | last |", "|---|---|---|---|"]
        lines += [f"| {n} | {m} | {a} | {b} |" for n, m, a, b in source_table]
    lines += ["", "## Alarm timeline", ""]
    if timeline:
        lines += ["| alarm | updates | why (first time) |", "|---|---|---|"]
        lines += [f"| {n} | {s} | {w} |" for n, s, w in timeline]
    else:
        lines.append("No alarm fired.")
    lines += ["", "## Interventions", ""]
    lines += [f"- step {s}: {a}" for s, a in actions] or ["None acted."]
    lines += ["", "## Last update", "", "| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in last_metrics]
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.relative_to(out_dir)})" for p in pngs]
    return "\n".join(lines) + "\n"


def _config_md(config: str) -> str:
    return f"\n## Resolved config\n\n```yaml\n{config.rstrip()}\n```\n" if config else ""


def _config_html(config: str) -> str:
    if not config:
        return ""
    return f"<h2>Resolved config</h2><details><summary>config.yaml</summary><pre>{html.escape(config)}</pre></details>"


CSS = ("body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}"
       "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;"
       "text-align:left}img{max-width:100%;display:block;margin:.6em 0}figure{margin:0}"
       ".alarm{color:#b00;font-weight:bold}.ok{color:#070}")


def _html(facts, timeline, actions, last_metrics, pngs, config: str = "", source_table=()) -> str:
    """One file, no external resource: CSS inline, every PNG embedded as base64."""
    e = html.escape
    parts = ["<h1>Run report</h1>", table(facts, th_first=True)]
    if source_table:
        parts += ["<h2>Evaluation sources</h2>",
                  table(list(source_table), header=("source", "metric", "first", "last"))]
    parts.append("<h2>Alarm timeline</h2>")
    if timeline:
        parts.append(table(timeline, header=("alarm", "updates", "why (first time)"), first_class="alarm"))
    else:
        parts.append("<p class='ok'>No alarm fired.</p>")
    parts.append("<h2>Interventions</h2>")
    parts.append("<ul>" + "".join(f"<li>step {e(str(s))}: {e(a)}</li>" for s, a in actions) + "</ul>" if actions
                 else "<p>None acted.</p>")
    parts += ["<h2>Last update</h2>", table(last_metrics, th_first=True), "<h2>Plots</h2>"]
    parts += [figure(p.stem, p.read_bytes()) for p in pngs]
    return page("agentrl run report", CSS, [*parts, _config_html(config)])


__all__ = ["read_metrics", "write_report"]
