"""The horizon report: what `agentrl probe` writes.

    report.json   the whole `ProbeResult` (statistics, curves, rules, thresholds) and the bakeoff
    report.md     the statistics, the rules and the recommendation, with the plots as PNG files beside it
    report.html   one self-contained page: the same, with the plots embedded as base64 data URIs, no
                  scripts, fonts or links to fetch, so it opens offline and can be mailed around

>>> from agentrl.core import Episode, Turn
>>> from agentrl.probe import ProbeThresholds, probe_episodes
>>> eps = [Episode([0], [Turn(1, [5], [-0.5], [6])], reward=float(i % 2), group_id=i // 4) for i in range(8)]
>>> html = to_html(probe_episodes(eps, ProbeThresholds()), images={})
>>> "<script" in html, "grpo" in html
(False, True)
"""

from __future__ import annotations

import html as html_lib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.pages import figure, page, png, pyplot
from agentrl.probe.bakeoff import BakeoffRun
from agentrl.probe.result import ProbeResult

# (label, field of ProbeStats, format) in the order the console, the markdown and the page show them
STAT_ROWS: list[tuple[str, str, str]] = [
    ("episodes probed", "episodes", "{:d}"),
    ("groups", "groups", "{:d}"),
    ("pass rate", "pass_rate", "{:.2f}"),
    ("turns per episode, median", "turns_median", "{:g}"),
    ("turns per episode, p90", "turns_p90", "{:g}"),
    ("action tokens per episode", "action_tokens_mean", "{:.1f}"),
    ("context tokens per episode", "context_tokens_mean", "{:.1f}"),
    ("truncated", "truncated_frac", "{:.0%}"),
    ("step-reward density", "step_reward_density", "{:.0%}"),
    ("groups whose step scores differ", "step_signal_frac", "{:.0%}"),
    ("zero-advantage groups", "zero_adv_frac", "{:.0%}"),
    ("  all-pass", "all_pass_frac", "{:.0%}"),
    ("  all-fail", "all_fail_frac", "{:.0%}"),
    ("within-group reward std", "reward_std_in_group", "{:.3f}"),
    ("state recurrence in groups", "state_recurrence", "{:.0%}"),
    ("turn-value probe R² (cross-validated)", "value_r2", "{:.3f}"),
    ("  features", "value_features", "{}"),
    ("value-change concentration", "value_change_concentration", "{:.3f}"),
    ("  uniform share 1/K", "uniform_share", "{:.3f}"),
    ("post-observation entropy (nats)", "post_obs_entropy", "{:.3f}"),
]


def stat_rows(result: ProbeResult) -> list[tuple[str, str]]:
    """(label, formatted value) for every statistic; '-' where it could not be measured."""
    out = []
    for label, key, fmt in STAT_ROWS:
        v = getattr(result.stats, key)
        out.append((label, "-" if v is None else fmt.format(v)))
    return out


# --------------------------------------------------------------------------------------------
# Plots


def figures(result: ProbeResult, bakeoff: Sequence[BakeoffRun] | None = None) -> dict[str, bytes]:
    """The report's plots as PNG bytes, by file name."""
    plt = pyplot()
    s, c, th = result.stats, result.curves, result.thresholds
    out: dict[str, bytes] = {}

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ks = list(c.turns_hist)
    ax.bar(ks, [c.turns_hist[k] for k in ks], color="#4c72b0", width=0.8)
    ax.axvline(s.turns_median, color="black", ls="-", lw=1, label=f"median {s.turns_median:g}")
    ax.axvline(s.turns_p90, color="black", ls="--", lw=1, label=f"p90 {s.turns_p90:g}")
    if th.horizon_cutoff is not None:
        ax.axvline(th.horizon_cutoff, color="#c44e52", ls=":", lw=1.5, label=f"cut-off {th.horizon_cutoff:g}")
    ax.set_xlabel("turns per episode")
    ax.set_ylabel("episodes")
    ax.set_title("Turns per episode")
    ax.legend(fontsize=8)
    out["turns.png"] = png(fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    x = list(range(1, len(c.return_by_turn) + 1))
    ax.plot(x, c.return_by_turn, marker="o", ms=3, label="Monte Carlo return G_k")
    if c.value_by_turn:
        ax.plot(x, c.value_by_turn, marker="s", ms=3, label="probe value V(s_k), out of fold")
    ax.plot(x, c.step_reward_by_turn, marker="^", ms=3, label="step reward r_k")
    ax.set_xlabel("turn index k")
    ax.set_ylabel("mean over episodes reaching k")
    ax.set_title("Reward and value by turn")
    ax.legend(fontsize=8)
    out["by_turn.png"] = png(fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    if c.concentration:
        ax.scatter(c.episode_turns, c.concentration, s=10, alpha=0.5, label="episodes")
        kk = list(range(1, max(c.episode_turns) + 1))
        ax.plot(kk, [1 / k for k in kk], color="black", lw=1, label="uniform 1/K")
        ax.plot(kk, [min(1.0, th.concentration_ratio / k) for k in kk], color="#c44e52", ls=":", lw=1.5,
                label=f"arpo threshold {th.concentration_ratio:g}/K")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "not measured (fewer than 2 groups)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("turns K")
    ax.set_ylabel("max|d_k| / sum|d_k|")
    ax.set_ylim(0, 1.05)
    ax.set_title("Value-change concentration")
    out["concentration.png"] = png(fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    names = list(c.group_counts)
    ax.bar(names, [c.group_counts[n] for n in names], color=["#55a868", "#c44e52", "#4c72b0"][: len(names)])
    ax.set_ylabel("groups")
    ax.set_title(f"Zero-advantage groups: {s.zero_adv_frac:.0%} (limit {th.max_zero_adv_frac:.0%})")
    out["zero_adv.png"] = png(fig)

    if bakeoff:
        fig, ax = plt.subplots(figsize=(5.5, 3.2))
        for run in bakeoff:
            ax.plot(range(1, len(run.curve) + 1), run.curve, marker="o", ms=3, label=f"{run.algo} (slope "
                    f"{run.slope:+.3f})")
        ax.axhline(bakeoff[0].warm_pass_rate, color="grey", ls=":", lw=1, label="warm start (held-out)")
        ax.set_xlabel("update")
        ax.set_ylabel("training pass rate")
        ax.set_ylim(0, 1)
        ax.set_title("Bakeoff: learning curves from the same start")
        ax.legend(fontsize=7)
        out["bakeoff.png"] = png(fig)
    return out


CAPTIONS = {
    "turns.png": "Turns per episode, with the horizon cut-off the recommendation compares the median with.",
    "by_turn.png": "Mean Monte Carlo return, the value probe's out-of-fold estimate and the step reward at each turn.",
    "concentration.png": "Per episode, the largest share of the total |value change| one turn carries, against 1/K.",
    "zero_adv.png": "Groups whose episodes all passed or all failed carry no group-relative signal.",
    "bakeoff.png": "Training pass rate per update of each candidate assigner, all from the same start and budget.",
}


# --------------------------------------------------------------------------------------------
# Text


def _threshold_lines(result: ProbeResult) -> list[str]:
    th = result.thresholds
    lines = [f"Thresholds from: {th.source}"]
    if th.sweep_started:
        lines.append(f"Sweep started: {th.sweep_started}")
    if th.sweep_command:
        lines.append(f"Sweep command: {th.sweep_command}")
    if th.sweep_sha256:  # which results exactly: the file's hash, and the commit that last changed it
        lines.append(f"Sweep results: sha256 {th.sweep_sha256}"
                     + (f", commit {th.sweep_commit}" if th.sweep_commit else ""))
    lines.append(f"Derivation: {th.derivation}")
    return lines


def to_markdown(result: ProbeResult, bakeoff: Sequence[BakeoffRun] | None = None, images: Sequence[str] = ()) -> str:
    """The report as markdown; `images` are PNG file names lying beside it."""
    rec = result.recommendation
    lines = ["# Horizon report", "", f"Source: {result.source}", "", f"**Recommended assigner: `{rec.algo}`** (rule "
             f"`{rec.rule}`)", "", rec.reason, "", f"Confidence: **{rec.confidence}**"
             + (f" ({rec.evidence})" if rec.evidence else ""), ""]
    if rec.advice:
        lines += [f"Advice: {rec.advice}", ""]
    lines += ["## Statistics", "", "| statistic | value |", "|---|---|"]
    lines += [f"| {label.strip()} | {value} |" for label, value in stat_rows(result)]
    if result.budget_episodes is not None:
        lines.append(f"| planned training episodes | {result.budget_episodes} |")
    lines += ["", "## Rules (first match fires)", "", "| rule | matched | pick | statistics | thresholds |",
              "|---|---|---|---|---|"]
    for r in result.rules:
        mark = "**fired**" if r.name == rec.rule else ("yes" if r.matched else "no")
        lines.append(f"| {r.name} | {mark} | {r.algo} | {_kv(r.statistics)} | {_kv(r.thresholds)} |")
    lines += ["", "## Where the thresholds come from", ""] + [f"- {x}" for x in _threshold_lines(result)]
    if bakeoff:
        lines += ["", "## Bakeoff", "", "| assigner | warm start | final (held-out) | slope / update |",
                  "|---|---|---|---|"]
        lines += [f"| {b.algo} | {b.warm_pass_rate:.2f} | {b.final_pass_rate:.2f} | {b.slope:+.4f} |" for b in bakeoff]
    if images:
        lines += ["", "## Plots", ""] + [f"![{CAPTIONS.get(n, n)}]({n})" for n in images]
    return "\n".join(lines) + "\n"


def _kv(d: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}"
        return "-" if v is None else str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in d.items())


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
  color: #222; }
h1 { margin-bottom: 0.2em; }
.rec { background: #eef6ee; border-left: 5px solid #55a868; padding: 0.8em 1em; margin: 1em 0; }
.advice { background: #fff4e5; border-left: 5px solid #dd8452; padding: 0.6em 1em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
tr.fired { background: #eef6ee; font-weight: 600; } .muted { color: #777; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; } figure { margin: 0; }
img { width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; }
"""


def to_html(result: ProbeResult, bakeoff: Sequence[BakeoffRun] | None = None,
            images: dict[str, bytes] | None = None) -> str:
    """One self-contained page: inline CSS, plots as data URIs, nothing to fetch."""
    e = html_lib.escape
    rec = result.recommendation
    parts = ["<h1>Horizon report</h1>", f'<p class="muted">Source: {e(result.source)}</p>',
             f'<div class="rec"><b>Recommended assigner: <code>{e(rec.algo)}</code></b> (rule '
             f'<code>{e(rec.rule)}</code>)<br>{e(rec.reason)}<br>Confidence: <b>{e(rec.confidence)}</b>'
             + (f" ({e(rec.evidence)})" if rec.evidence else "") + "</div>"]
    if rec.advice:
        parts.append(f'<p class="advice">Advice: {e(rec.advice)}</p>')
    parts.append("<h2>Statistics</h2><table><tr><th>statistic</th><th>value</th></tr>")
    parts += [f"<tr><td>{e(label)}</td><td>{e(value)}</td></tr>" for label, value in stat_rows(result)]
    if result.budget_episodes is not None:
        parts.append(f"<tr><td>planned training episodes</td><td>{result.budget_episodes}</td></tr>")
    parts.append("</table><h2>Rules (first match fires)</h2>"
                 "<table><tr><th>rule</th><th>matched</th><th>pick</th><th>statistics</th><th>thresholds</th></tr>")
    for r in result.rules:
        fired = r.name == rec.rule
        mark = "fired" if fired else ("yes" if r.matched else "no")
        parts.append(f'<tr class="{"fired" if fired else ""}"><td>{e(r.name)}</td><td>{mark}</td><td>{e(r.algo)}</td>'
                     f"<td>{e(_kv(r.statistics))}</td><td>{e(_kv(r.thresholds))}</td></tr>")
    parts.append("</table><h2>Where the thresholds come from</h2><ul>")
    parts += [f"<li>{e(x)}</li>" for x in _threshold_lines(result)]
    parts.append("</ul>")
    if bakeoff:
        parts.append("<h2>Bakeoff</h2><table><tr><th>assigner</th><th>warm start</th><th>final (held-out)</th>"
                     "<th>slope / update</th></tr>")
        parts += [f"<tr><td>{e(b.algo)}</td><td>{b.warm_pass_rate:.2f}</td><td>{b.final_pass_rate:.2f}</td>"
                  f"<td>{b.slope:+.4f}</td></tr>" for b in bakeoff]
        parts.append("</table>")
    if images:
        parts.append('<h2>Plots</h2><div class="plots">')
        parts += [figure(name, data, CAPTIONS.get(name, name)) for name, data in images.items()]
        parts.append("</div>")
    return page("Horizon report", STYLE, parts)


def write_report(result: ProbeResult, out: str | Path, bakeoff: Sequence[BakeoffRun] | None = None) -> dict[str, Path]:
    """Write report.json, report.md (with its PNGs) and report.html into `out`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    images = figures(result, bakeoff)
    for name, image in images.items():
        (out / name).write_bytes(image)
    data = {"probe": result.model_dump(mode="json"), "bakeoff": [b.model_dump(mode="json") for b in bakeoff or []]}
    paths = {"json": out / "report.json", "md": out / "report.md", "html": out / "report.html"}
    paths["json"].write_text(json.dumps(data, indent=1))
    paths["md"].write_text(to_markdown(result, bakeoff, list(images)))
    paths["html"].write_text(to_html(result, bakeoff, images))
    return paths


__all__ = ["figures", "stat_rows", "to_html", "to_markdown", "write_report"]
