"""Kill -9 a run, resume it, compare: does a resumed run end as the uninterrupted one did?

A short run of `agentrl train`'s default shape (Vault-v0, the tiny policy's cached warm start, grpo,
env calls serial) runs twice uninterrupted: the baseline every resume is compared with, and a second
run that shows two runs left alone agree (and times the run: its phases, from AGENTRL_PHASE_LOG, and
when its first checkpoint lands). Then, N times, the same run is started in a fresh folder and killed
with SIGKILL, and resumed with `agentrl train --resume` until it finishes. Every kill lands on a live
process after its first checkpoint is in place (the benchmark waits for the folder), at one of two
kinds of moment:

- **timed**: a moment drawn over the rest of the run, measured by the timing run from its first
  checkpoint to its exit; the draws are stratified (one in each of N equal slices, in random order), so
  the kills spread over the run and its phases by the share of time each takes. The moment is placed in
  the cut run by progress, not by the clock (`Timing`): the phase it falls in and how far into it, scaled
  by the cut run's own pace, so a run slower or faster than the timing run (the machine's load moves) is
  killed alive at the same place. A kill that finds the process gone is tried again earlier in the same
  phase (`attempts`, `missed`).
- **during a checkpoint write**: the benchmark polls for the temporary folder of a later checkpoint
  (`checkpoints/.tmp-update_XXXXX-PID`, agentrl/checkpoint.py's atomic write), and kills a random
  0-20 ms after it appears; it counts only if the folder is still there after the kill (the write had
  not been renamed into place), else it is tried again.

The phase of each kill is the last line the killed process wrote to its AGENTRL_PHASE_LOG file
(agentrl/trainer.py: one append per phase, so the last line is the phase it died in). A run matches
when its final weights equal the baseline's (max abs difference 0), its metrics.jsonl is equal except
for timing fields, every update's store file is present exactly once, and summary.json is equal
except for wall time.

    python benchmarks/kill_resume.py            # 20 kills (4 during a checkpoint write), then 3 under arrival
    python benchmarks/kill_resume.py --quick    # 3 kills of a 4-update run (a smoke test, ~2 min on 2 cores)

Env calls run serially (`rollout.env_workers serial`): with a thread pool under the default `arrival`
schedule the rows' join times (set by the tools' latency) change which rows share a forward and so the
last bit of the log-probs; two uninterrupted runs differ then too. `--arrival N` (3 by default in the
long form) measures that case: two runs left alone and N killed-and-resumed ones under the default
workers and schedule, compared episode by episode (tasks, tokens, rewards, log-probs) and by weights.

Last line: one JSON object with the figures, `ratio` = runs matching / runs tried; also written (with
one entry per kill under `runs`) to benchmarks/results/kill_resume.json (kill_resume_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report, save  # noqa: E402

PHASE_LOG = "AGENTRL_PHASE_LOG"  # agentrl/trainer.py
ENV = {**os.environ, "COLUMNS": "400"}  # the console's lines unwrapped, so that the resume's can be read


def train_args(out: Path, a: argparse.Namespace, serial: bool = True) -> list[str]:
    args = [sys.executable, "-m", "agentrl", "train", "--out", str(out), "--updates", str(a.updates),
            "--rollout.groups", str(a.groups), "--rollout.group-size", str(a.group_size),
            "--eval.episodes", str(a.eval_episodes), "--eval.every", str(a.eval_every),
            "--checkpoint.every", str(a.every), "--seed", str(a.seed)]
    return args + (["--rollout.env-workers", "serial"] if serial else [])


def timeless(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/") and "tokens_per_s" not in k}
            for r in rows]


def compare(ref: Path, run: Path, updates: int) -> dict[str, object]:
    from safetensors.torch import load_file

    wa, wb = load_file(ref / "checkpoint" / "model.safetensors"), load_file(run / "checkpoint" / "model.safetensors")
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa) if wa.keys() == wb.keys() else float("inf")
    store = sorted(p.name for p in (run / "store").iterdir())
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (ref, run))
    for s in (sa, sb):
        s.pop("wall_s")
        s.pop("checkpoint")
    checks = {"weights_max_abs_diff": diff,
              "metrics_equal": timeless(ref / "metrics.jsonl") == timeless(run / "metrics.jsonl"),
              "store_once_each": store == [f"update_{u:05d}_0.parquet" for u in range(1, updates + 1)],
              "summary_equal": sa == sb}
    checks["match"] = diff == 0.0 and all(v for k, v in checks.items() if k != "weights_max_abs_diff")
    return checks


def episodes_compared(ref: Path, run: Path, updates: int) -> dict[str, object]:
    """Episode by episode, update by update: the same tasks (seed, group), the same tokens, rewards, log-probs?"""
    import pyarrow.parquet as pq

    same_tasks, same_tokens, same_rewards, n, lp_diff, first_token_diff = True, 0, 0, 0, 0.0, None
    for u in range(1, updates + 1):
        a, b = (pq.read_table(d / "store" / f"update_{u:05d}_0.parquet").to_pylist() for d in (ref, run))
        same_tasks &= [(e["seed"], e["group_id"]) for e in a] == [(e["seed"], e["group_id"]) for e in b]
        for ea, eb in zip(a, b):
            n += 1
            tokens = [t["action_ids"] for t in ea["turns"]] == [t["action_ids"] for t in eb["turns"]]
            same_tokens += tokens
            same_rewards += ea["reward"] == eb["reward"]
            if tokens:
                lp_diff = max([lp_diff] + [abs(x - y) for ta, tb in zip(ea["turns"], eb["turns"])
                                           for x, y in zip(ta["logprobs"], tb["logprobs"])])
            elif first_token_diff is None:
                first_token_diff = u
    return {"tasks_equal": same_tasks, "episodes": n, "episodes_same_tokens": same_tokens,
            "episodes_same_reward": same_rewards, "first_update_tokens_differ": first_token_diff,
            "logprob_max_abs_diff_same_tokens": lp_diff}


def phases(log: Path) -> list[tuple[float, str, int]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        t, phase, update = line.split()
        out.append((float(t), phase, int(update)))
    return out


class Launch:
    """One `agentrl train` process with its phase log, watched from here."""

    def __init__(self, out: Path, args: list[str]):
        self.out, self.log = out, out.parent / f"{out.name}.phases"
        self.log.unlink(missing_ok=True)  # the trainer appends: a retried run starts a fresh log
        self.t0 = time.time()
        self.console = open(out.parent / f"{out.name}.out", "w")  # noqa: SIM115 (closed in wait)
        self.proc = subprocess.Popen(args, stdout=self.console, stderr=subprocess.STDOUT,
                                     env={**ENV, PHASE_LOG: str(self.log)})
        self.t_exit: float | None = None

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        if self.t_exit is None:
            self.t_exit = time.time()
        return False

    def wait_for(self, path: Path, step: float = 0.005, timeout: float = 600.0) -> float | None:
        """The moment `path` appears (None if the process ends first)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if path.exists():
                return time.time()
            if not self.alive():
                return time.time() if path.exists() else None
            time.sleep(step)
        raise TimeoutError(f"{path} did not appear in {timeout:.0f}s")

    def wait_for_phase(self, phase: str, update: int, step: float = 0.02) -> bool:
        while self.alive():
            seen = phases(self.log)
            if any(p == phase and u == update for _, p, u in seen):
                return True
            if any(u > update for _, _, u in seen):
                return False
            time.sleep(step)
        return False

    def kill(self) -> bool:
        """SIGKILL; whether it killed a live process (not one that had exited already)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        rc = self.wait()
        return rc == -signal.SIGKILL

    def wait(self) -> int:
        rc = self.proc.wait()
        if self.t_exit is None:
            self.t_exit = time.time()
        self.console.close()
        return rc


def timeline(launch: Launch) -> dict[str, object]:
    """A finished run's timing: wall, when its first checkpoint landed, seconds per phase."""
    seen = phases(launch.log)
    spent: Counter = Counter()
    for (t, p, _), nxt in zip(seen, seen[1:] + [(launch.t_exit, None, None)]):
        spent[p] += nxt[0] - t
    return {"wall_s": round(launch.t_exit - launch.t0, 2), "phase_s": {p: round(s, 2) for p, s in spent.items()},
            "startup_s": round(seen[0][0] - launch.t0, 2) if seen else None}


def resume(out: Path, i: int) -> dict[str, object]:
    said = ""
    for attempt in range(1, 4):
        r = subprocess.run([sys.executable, "-m", "agentrl", "train", "--resume", str(out)], capture_output=True,
                           text=True, env=ENV)
        said += r.stdout + r.stderr
        if r.returncode == 0:
            flat = " ".join(said.split())
            m = re.search(r"resumed from \S*update_(\d+) \(update", flat)
            return {"resumes": attempt, "resumed_from_update": int(m.group(1)) if m else 0,
                    "resume_said_interrupted_write": "a checkpoint write that was interrupted" in flat,
                    "resume_restored": "restoring update_" in flat}
    raise SystemExit(f"run {i}: resume failed:\n{said[-3000:]}")


def newest_checkpoint(root: Path) -> int:
    found = [int(p.name[7:]) for p in root.glob("update_*") if p.name[7:].isdigit()]
    return max(found, default=0)


class Timing:
    """The timing run's phases, to place a kill at the same point of another run's progress: a moment a
    fraction of the way through the rest (first checkpoint to exit) is a phase line k and a share w of that
    phase; in the cut run the kill comes w of the way through its own phase k, that phase's length taken
    from the timing run scaled by how fast the cut run has gone since its first checkpoint. So a run faster
    or slower than the timing run (the machine's load changes) is still killed alive, at the same place."""

    def __init__(self, launch: Launch, t_ck: float):
        self.lines, self.t_ck, self.t_exit = phases(launch.log), t_ck, launch.t_exit

    def place(self, fraction: float) -> tuple[int, float]:
        t = self.t_ck + fraction * (self.t_exit - self.t_ck)
        k = max(i for i, (tk, _, _) in enumerate(self.lines) if tk <= t)
        end = self.lines[k + 1][0] if k + 1 < len(self.lines) else self.t_exit
        return k, (t - self.lines[k][0]) / max(end - self.lines[k][0], 1e-9)

    def length(self, k: int) -> float:
        end = self.lines[k + 1][0] if k + 1 < len(self.lines) else self.t_exit
        return end - self.lines[k][0]

    def since_first_checkpoint(self, k: int) -> float:
        return self.lines[k][0] - self.t_ck


def cut_run(i: int, out: Path, a: argparse.Namespace, plan: dict, timing: Timing, rng: random.Random,
            serial: bool = True) -> dict[str, object]:
    """Start the run, kill it as `plan` says (after its first checkpoint), resume it; what happened."""
    first = out / "checkpoints" / f"update_{a.every:05d}"
    missed: list[dict[str, object]] = []  # the attempts that did not kill as planned, and why
    for attempt in range(1, 6):
        if out.exists():
            shutil.rmtree(out)
        launch = Launch(out, train_args(out, a, serial))
        t_ck = launch.wait_for(first)
        if t_ck is None:
            raise SystemExit(f"run {i}: the run ended before its first checkpoint:\n"
                             f"{(out.parent / (out.name + '.out')).read_text()[-2000:]}")
        entry: dict[str, object] = {"kind": plan["kind"], "attempts": attempt, "missed": missed}
        if plan["kind"] == "timed":
            k, w = timing.place(plan["fraction"])
            w = w / 2 ** (attempt - 1)  # a retry (the process had exited) comes earlier in the same phase
            while launch.alive() and len(phases(launch.log)) <= k:
                time.sleep(0.005)
            seen = phases(launch.log)
            if len(seen) <= k:
                launch.kill()
                missed.append({"why": "exited before the phase", "phase_line": k})
                continue
            tk = seen[k][0]
            ref = timing.since_first_checkpoint(k)
            scale = min(4.0, max(0.25, (tk - t_ck) / ref)) if ref > 1.0 else 1.0
            target = tk + w * timing.length(k) * scale
            time.sleep(max(0.0, target - time.time()))
            t_kill = time.time()
            live = launch.kill()
            if not live:
                missed.append({"why": "exited", "rc": launch.proc.returncode, "phase_line": k, "share": round(w, 4)})
                continue
            entry.update({"fraction_of_rest": round(plan["fraction"], 4), "planned_phase": seen[k][1],
                          "planned_share_of_phase": round(w, 4)})
        else:
            u = plan["update"]
            tmp = out / "checkpoints" / f".tmp-update_{u:05d}-{launch.proc.pid}"
            if not launch.wait_for_phase("update", u):
                launch.kill()
                missed.append({"why": f"update {u} not seen"})
                continue
            if launch.wait_for(tmp, step=0.0002) is None:
                launch.kill()
                missed.append({"why": "write not seen"})
                continue
            delay = rng.uniform(0.0, 0.02) if attempt == 1 else 0.0
            time.sleep(delay)
            t_kill = time.time()
            live = launch.kill()
            if not tmp.exists():  # the write had finished: not a kill during it
                missed.append({"why": "write finished first", "delay_s": round(delay, 4)})
                continue
            entry["delay_after_write_began_s"] = round(delay, 4)
            entry["write_files_at_kill"] = sorted(p.name for p in tmp.iterdir())
        break
    else:
        raise SystemExit(f"run {i}: no kill as planned ({plan}) in 5 attempts")
    ckroot = out / "checkpoints"
    last = (phases(launch.log) or [(0.0, "none", 0)])[-1]
    rows = len((out / "metrics.jsonl").read_text().splitlines()) if (out / "metrics.jsonl").exists() else 0
    entry.update({
        "kill_at_s": round(t_kill - launch.t0, 3), "kill_after_first_checkpoint_s": round(t_kill - t_ck, 3),
        "killed_running": live, "after_first_checkpoint": t_kill > t_ck and newest_checkpoint(ckroot) >= a.every,
        "phase": last[1], "phase_update": last[2], "rows_at_kill": rows,
        "checkpoint_at_kill": newest_checkpoint(ckroot),
        "during_checkpoint_write": any(ckroot.glob(".tmp-*")),
    })
    entry.update(resume(out, i))
    return entry


def stratified(n: int, rng: random.Random) -> list[float]:
    fractions = [(k + rng.random()) / n for k in range(n)]
    rng.shuffle(fractions)
    return fractions


def main() -> None:
    ap = parser(__doc__, quick="3 kills (1 during a write) of a 4-update run, no arrival")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--write-kills", type=int, default=4, help="of --kills, how many during a checkpoint write")
    ap.add_argument("--arrival", type=int, default=3, help="kills under the default workers and arrival schedule")
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--every", type=int, default=3, help="checkpoint.every")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", help="what code ran, for the JSON (default: this checkout's git HEAD)")
    a = ap.parse_args()
    if a.source is None:
        git = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True,
                             text=True)
        a.source = git.stdout.strip() or None
    if a.quick:
        a.kills, a.write_kills, a.arrival = 3, 1, 0
        a.updates, a.groups, a.group_size, a.eval_episodes, a.eval_every, a.every = 4, 2, 2, 4, 2, 2
    work = Path(tempfile.mkdtemp(prefix="kill_resume_"))
    rng = random.Random(a.seed)
    load_start = os.getloadavg()
    t_bench = time.time()
    try:
        # the warm start first (built once, then cached): every timed run loads it
        warm = train_args(work / "warm", a)
        warm[warm.index("--updates") + 1] = "0"
        subprocess.run(warm, capture_output=True, check=True, env=ENV)
        first = f"update_{a.every:05d}"
        ref = Launch(work / "ref", train_args(work / "ref", a))
        t_ck = ref.wait_for(work / "ref" / "checkpoints" / first)
        if ref.wait() != 0:
            raise SystemExit(f"the baseline run failed:\n{(work / 'ref.out').read_text()[-3000:]}")
        timing = ref
        if not a.quick:  # a second run left alone: it must equal the first, and it times the run the cuts repeat
            timing = Launch(work / "timing", train_args(work / "timing", a))
            t_ck = timing.wait_for(work / "timing" / "checkpoints" / first)
            timing.wait()
        rest_s = timing.t_exit - t_ck
        said = " ".join((work / "ref.out").read_text().split())
        m = re.search(r"checkpoints: (\d+) written, ([0-9.]+)s each", said)
        ckpt_n, ckpt_s = (int(m.group(1)), float(m.group(2))) if m else (0, float("nan"))
        left_alone = compare(work / "ref", timing.out, a.updates) if timing is not ref else {"match": None}
        print(f"two runs left alone: {'equal' if left_alone['match'] else json.dumps(left_alone)}; the run takes "
              f"{timing.t_exit - timing.t0:.1f}s, its first checkpoint lands at "
              f"{t_ck - timing.t0:.1f}s, {rest_s:.1f}s before it exits", flush=True)
        # the plan: write kills on the checkpoints after the first, timed kills stratified over the rest
        later = list(range(2 * a.every, a.updates + 1, a.every)) or [a.updates]
        plans = [{"kind": "write", "update": later[k % len(later)]} for k in range(a.write_kills)]
        plans += [{"kind": "timed", "fraction": f} for f in stratified(a.kills - a.write_kills, rng)]
        rng.shuffle(plans)
        runs: list[dict[str, object]] = []

        def result(complete: bool, arrival: dict | None = None) -> dict[str, object]:
            matching = sum(r["match"] for r in runs)
            out = {
                "benchmark": "kill_resume", "complete": complete, "quick": a.quick, "updates": a.updates,
                "batch": f"{a.groups}x{a.group_size}", "checkpoint_every": a.every, "eval_every": a.eval_every,
                "eval_episodes": a.eval_episodes, "env_workers": "serial", "seed": a.seed, "source": a.source,
                "baseline_wall_s": round(ref.t_exit - ref.t0, 2), "timing_run": timeline(timing),
                "first_checkpoint_at_s": round(t_ck - timing.t0, 2), "rest_after_first_checkpoint_s": round(rest_s, 2),
                "runs_left_alone_equal": left_alone["match"],
                "checkpoints": ckpt_n, "checkpoint_s": ckpt_s,
                "checkpoint_share": round(ckpt_n * ckpt_s / (ref.t_exit - ref.t0), 4) if ckpt_n else None,
                "runs_tried": len(runs), "runs_matching": matching, "ratio": matching / max(len(runs), 1),
                "kills_live": sum(bool(r["killed_running"]) for r in runs),
                "kills_after_first_checkpoint": sum(bool(r["after_first_checkpoint"]) for r in runs),
                "kills_during_checkpoint_write": sum(bool(r["during_checkpoint_write"]) for r in runs),
                "kills_by_phase": dict(Counter(r["phase"] for r in runs).most_common()),
                "resumed_from_update": dict(sorted(Counter(r["resumed_from_update"] for r in runs).items())),
                "load_average_start": [round(x, 2) for x in load_start],
                "load_average_end": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
                "benchmark_s": round(time.time() - t_bench),
                "runs": runs,
            }
            if arrival is not None:
                out["arrival"] = arrival
            return out

        for i, plan in enumerate(plans):
            out = work / f"run{i}"
            entry = cut_run(i, out, a, plan, Timing(timing, t_ck), rng)
            entry.update(compare(work / "ref", out, a.updates))
            runs.append(entry)
            save("kill_resume", result(False), a.quick)  # after every run: a long run's figures survive it
            print(f"run {i}: SIGKILL at {entry['kill_at_s']:.2f}s ({entry['kind']}, phase {entry['phase']} of update "
                  f"{entry['phase_update']}{', during the write' if entry['during_checkpoint_write'] else ''}), "
                  f"resumed from update {entry['resumed_from_update']}: "
                  f"{'match' if entry['match'] else 'DIFFERS ' + json.dumps(entry)}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
        arrival = None
        if a.arrival:
            save("kill_resume", result(True), a.quick)
            try:
                arrival = arrival_runs(work, a, rng)
            except Exception as e:  # noqa: BLE001 (the serial figures above stand; say why this part has none)
                arrival = {"error": f"{type(e).__name__}: {e}"}
                print(f"arrival: failed: {arrival['error']}", flush=True)
        matching = sum(r["match"] for r in runs)
        final = result(True, arrival)
        print(f"{matching}/{len(runs)} resumed runs match the uninterrupted one bit for bit; "
              f"{final['kills_live']} kills of a live process, {final['kills_after_first_checkpoint']} after the "
              f"first checkpoint, {final['kills_during_checkpoint_write']} during a checkpoint write; phases "
              f"{final['kills_by_phase']}; checkpoint {ckpt_s:.3f}s each, {ckpt_n} in a "
              f"{ref.t_exit - ref.t0:.0f}s run; load average {final['load_average_end'][1]:.1f}")
        report("kill_resume", final, a.quick,
               summary={k: v for k, v in final.items() if k not in ("runs", "arrival")}
               | ({"arrival": {k: v for k, v in arrival.items() if k != "runs"}} if arrival else {}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def arrival_runs(work: Path, a: argparse.Namespace, rng: random.Random) -> dict[str, object]:
    """The default workers (thread pool) and schedule (arrival): what a resumed run shares with one left alone,
    measured against what a second run left alone shares with the first."""
    ref = Launch(work / "aref", train_args(work / "aref", a, serial=False))
    ref.wait()
    other = Launch(work / "aother", train_args(work / "aother", a, serial=False))
    t_ck = other.wait_for(work / "aother" / "checkpoints" / f"update_{a.every:05d}")
    other.wait()

    def against_ref(run: Path) -> dict[str, object]:
        checks = compare(work / "aref", run, a.updates)
        return {**checks, **episodes_compared(work / "aref", run, a.updates)}

    left_alone = against_ref(work / "aother")
    print(f"arrival, two runs left alone: {json.dumps(left_alone)}", flush=True)
    runs = []
    for i, f in enumerate(stratified(a.arrival, rng)):
        out = work / f"arun{i}"
        entry = cut_run(i, out, a, {"kind": "timed", "fraction": f}, Timing(other, t_ck), rng, serial=False)
        entry.update(against_ref(out))
        runs.append(entry)
        print(f"arrival run {i}: SIGKILL at {entry['kill_at_s']:.2f}s (phase {entry['phase']} of update "
              f"{entry['phase_update']}), resumed from update {entry['resumed_from_update']}: weights max abs diff "
              f"{entry['weights_max_abs_diff']:.3g}, {entry['episodes_same_tokens']}/{entry['episodes']} episodes "
              f"with the same tokens, tasks {'equal' if entry['tasks_equal'] else 'DIFFER'}", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    return {"env_workers": "thread:64", "schedule": "arrival", "left_alone": left_alone,
            "resumed_weights_equal": sum(r["weights_max_abs_diff"] == 0.0 for r in runs), "resumed_tried": len(runs),
            "runs": runs}


if __name__ == "__main__":
    main()
