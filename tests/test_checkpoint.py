"""Runs that survive (issue 15): checkpoints, exact resume on the CPU, refusals, SIGTERM.

The oracle for a resumed run is the same run left alone: with one seed, a run resumed from a
checkpoint must end with the same weights (max abs difference 0), the same metrics.jsonl (timing
fields aside), one store file per update, and the same summary.json (wall time and paths aside).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from agentrl import cli
from agentrl.checkpoint import checkpoints, latest, read, verify, write
from agentrl.config import TrainConfig, read_yaml
from agentrl.monitor import Monitor
from agentrl.run_folder import CHECKPOINTS
from agentrl.trainer import Trainer

TESTS = Path(__file__).parent


def run_config(out: Path, policy_dir: Path, updates: int = 3, **kw) -> TrainConfig:
    """Babble (rewards vary, so updates train) on the micro model, a checkpoint after every update."""
    data = {
        "env": {"id": "test_e2e:Babble"},
        "model": str(policy_dir),
        "updates": updates,
        "out": str(out),
        # serial env calls: with a thread pool the rows' join times, hence the batch's padding and the last bit of
        # the log-probs and hidden states, follow the tools' timing (two uninterrupted runs differ there too)
        "rollout": {"groups": 2, "group_size": 2, "sampling": {"max_new_tokens": 8}, "env_workers": "serial"},
        "optim": {"lr": 1e-2, "minibatches": 1},
        "eval": {"episodes": 2, "every": 2},
        "loss": {"kl_coef": 0.01, "entropy_coef": 0.01},
        "checkpoint": {"every": 1, "keep": 10},
    }
    for k, v in kw.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    return TrainConfig(**data)


def quiet_monitor(out: Path, cfg: TrainConfig) -> tuple[Monitor, io.StringIO]:
    buf = io.StringIO()
    out.mkdir(parents=True, exist_ok=True)
    return Monitor(out, total=cfg.updates, console=Console(file=buf, width=300)), buf


def timeless(path: Path) -> list[dict]:
    """metrics.jsonl without its timing fields (wall clock, seconds, throughput)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/") and "tokens_per_s" not in k}
            for r in rows]


def resumed_copy(src: Path, dst: Path, keep_through: int) -> None:
    """`src`'s run folder as a run killed after update `keep_through`'s checkpoint would leave it (the later
    checkpoints gone; the later rows, store files and summary still there, for the resume to cut away)."""
    shutil.copytree(src, dst)
    for folder in checkpoints(dst / CHECKPOINTS):
        if int(folder.name.split("_")[1]) > keep_through:
            shutil.rmtree(folder)


def assert_same_run(a: Path, b: Path, updates: int) -> None:
    wa, wb = load_file(a / "checkpoint" / "model.safetensors"), load_file(b / "checkpoint" / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) == 0.0
    assert timeless(a / "metrics.jsonl") == timeless(b / "metrics.jsonl")
    steps = [r["step"] for r in timeless(b / "metrics.jsonl") if not r.get("final")]
    assert steps == list(range(updates + 1))  # no step twice, none missing
    assert sorted(p.name for p in (b / "store").iterdir()) == [f"update_{u:05d}_0.parquet"
                                                               for u in range(1, updates + 1)]
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for s in (sa, sb):
        s.pop("wall_s")
        s.pop("checkpoint")  # the folder's path
    assert sa == sb


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, vault_policy_dir):
    """The uninterrupted grpo run every resume is compared with."""
    out = tmp_path_factory.mktemp("full") / "run"
    cfg = run_config(out, vault_policy_dir)
    Trainer(cfg, monitor=quiet_monitor(out, cfg)[0]).train()
    rows = timeless(out / "metrics.jsonl")
    assert sum(r.get("train/trained_episodes", 0) for r in rows) > 0  # updates did train: resuming has work to match
    return out


def test_resumed_run_ends_bit_identical_to_the_uninterrupted_one(tmp_path, full_run, vault_policy_dir):
    run = tmp_path / "run"
    resumed_copy(full_run, run, keep_through=1)
    cfg = run_config(run, vault_policy_dir)
    trainer = Trainer(cfg, monitor=quiet_monitor(run, cfg)[0], resume=True)
    assert trainer.resumed_from == run / CHECKPOINTS / "update_00001"
    trainer.train()
    assert_same_run(full_run, run, cfg.updates)


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path, full_run, vault_policy_dir):
    run = tmp_path / "run"
    resumed_copy(full_run, run, keep_through=3)
    newest = run / CHECKPOINTS / "update_00003"
    data = bytearray((newest / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / "model.pt").write_bytes(bytes(data))
    (run / CHECKPOINTS / ".tmp-update_00004-1").mkdir()  # a write that was killed half-way
    cfg = run_config(run, vault_policy_dir)
    monitor, console = quiet_monitor(run, cfg)
    trainer = Trainer(cfg, monitor=monitor, resume=True)
    said = console.getvalue()
    assert "update_00003" in said and "checksum" in said and ".tmp-update_00004-1" in said
    assert trainer.resumed_from == run / CHECKPOINTS / "update_00002"
    trainer.train()
    assert_same_run(full_run, run, cfg.updates)


def test_checkpoint_write_is_atomic_and_keeps_the_newest(tmp_path):
    for u in range(1, 5):
        write(tmp_path, u, {"state.json": {"u": u}, "t.pt": {"x": torch.tensor([float(u)])}}, keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == ["update_00003", "update_00004"]
    assert not list(tmp_path.glob(".tmp-*"))
    assert read(tmp_path / "update_00004", "t.pt")["x"].item() == 4.0
    (tmp_path / "update_00004" / "manifest.json").unlink()  # as if killed before the manifest landed
    warnings: list[str] = []
    folder, manifest = latest(tmp_path, warn=warnings.append)
    assert folder.name == "update_00003" and manifest["update"] == 3
    assert len(warnings) == 1 and "update_00004" in warnings[0] and "manifest.json" in warnings[0]
    with pytest.raises(ValueError, match="update_00004"):
        verify(tmp_path / "update_00004")


def test_conflicting_config_on_resume_fails_before_any_work_naming_the_field(tmp_path, full_run, vault_policy_dir,
                                                                            monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    other = tmp_path / "other.yaml"
    other.write_text(run_config(run, vault_policy_dir, rollout={"group_size": 3}).to_yaml())
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}

    def no_work(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr("agentrl.stages.pipeline.train", no_work)
    assert cli.main(["train", "--resume", str(run), "--config", str(other)]) == 2
    err = capsys.readouterr().err
    assert "rollout.group_size" in err and "3" in err and "2" in err
    assert cli.main(["train", "--resume", str(run), "--seed", "7"]) == 2
    assert "seed is 7" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before


def test_new_run_into_a_non_empty_folder_is_refused_naming_it(tmp_path, vault_policy_dir, monkeypatch, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr("agentrl.stages.pipeline.train", lambda *a, **k: pytest.fail("training started"))
    assert cli.main(["train", "--env", "test_e2e:Babble", "--model", str(vault_policy_dir), "--out", str(out)]) == 2
    assert f"--out {out} is not empty" in capsys.readouterr().err
    # the library refuses a folder that holds a run too; --overwrite removes the run's files, not the user's
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    cfg = run_config(out, vault_policy_dir, updates=0)
    with pytest.raises(FileExistsError, match=str(out)):
        Trainer(cfg)
    Trainer(cfg, monitor=None, overwrite=True).monitor.close()
    assert (out / "notes.txt").read_text() == "mine" and (out / "metrics.jsonl").read_text() == ""


def test_sigterm_mid_update_leaves_a_resumable_checkpoint(tmp_path, vault_policy_dir):
    run = tmp_path / "run"
    updates = 5
    cmd = [sys.executable, "-m", "agentrl", "train", "--env", "test_e2e:Babble", "--model", str(vault_policy_dir),
           "--out", str(run), "--updates", str(updates), "--rollout.groups", "2", "--rollout.group-size", "2",
           "--rollout.sampling.max-new-tokens", "8", "--eval.episodes", "2", "--checkpoint.every", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # the warm start's row is there: update 1 is under way
        if metrics.exists() and metrics.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert f"agentrl train --resume {run}" in " ".join(out.split())  # the console may wrap the line
    folder, manifest = latest(run / CHECKPOINTS)
    done = manifest["update"]
    assert 1 <= done < updates  # the update under way was finished, then saved (every=0: only the signal saves)
    steps = [r["step"] for r in timeless(metrics)]
    assert steps == list(range(done + 1))
    cfg = TrainConfig.model_validate(read_yaml(run / "config.yaml"))
    Trainer(cfg, monitor=quiet_monitor(run, cfg)[0], resume=True).train()
    steps = [r["step"] for r in timeless(metrics) if not r.get("final")]
    assert steps == list(range(updates + 1))


@pytest.mark.parametrize("case", ["turn-ppo", "arpo", "steppo-learned", "lora"])
def test_resume_restores_assigner_heads_and_adapters(tmp_path, vault_policy_dir, case):
    """The next update after a resume computes the uninterrupted run's advantages (credit/ metrics equal) from
    heads restored to their trained state, not rebuilt fresh (two updates before the checkpoint: at least one of
    them trains on this seed)."""
    kw = {"turn-ppo": {"algo": "turn-ppo", "credit": {"warmup_updates": 1}},
          "arpo": {"algo": "arpo", "credit": {"ev_gate": -1e9}},
          "steppo-learned": {"algo": "steppo", "credit": {"prm": "learned"}},
          "lora": {"optim": {"lora": {"r": 2}}}}[case]
    full, run = tmp_path / "full", tmp_path / "run"
    cfg = run_config(full, vault_policy_dir, updates=3, **kw)
    Trainer(cfg, monitor=quiet_monitor(full, cfg)[0]).train()
    saved = read(full / CHECKPOINTS / "update_00002", "assigner.pt")
    fresh = Trainer(run_config(tmp_path / "fresh", vault_policy_dir, updates=3, **kw), monitor=None)
    fresh.monitor.close()
    if case == "lora":  # the adapters trained away from their initial values, and only they are saved
        weights = read(full / CHECKPOINTS / "update_00002", "model.pt")
        assert weights and all("lora" in k for k in weights)
        start = dict(fresh.accelerator.unwrap_model(fresh.learner.model).named_parameters())
        assert any(not torch.equal(w, start[k].detach()) for k, w in weights.items())
    else:  # the head after update 1 differs from a freshly built one: restoring it is what the test checks
        head = fresh.assigner.state_dict()
        a, b = (s.get("critic", s.get("head"))["net"] for s in (saved, head))
        assert any(not torch.equal(a[k], b[k]) for k in a)
    resumed_copy(full, run, keep_through=2)
    cfg = run_config(run, vault_policy_dir, updates=3, **kw)
    Trainer(cfg, monitor=quiet_monitor(run, cfg)[0], resume=True).train()
    assert_same_run(full, run, 3)
    a2, b2 = (read(d / CHECKPOINTS / "update_00003", "assigner.pt") for d in (full, run))
    assert json.dumps(_tolist(a2)) == json.dumps(_tolist(b2))


def _tolist(x):
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): _tolist(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_tolist(v) for v in x]
    return x


class _Crash(BaseException):
    """A kill -9 at one point of a save (BaseException: nothing in write() may catch it)."""


def _crashing_write(monkeypatch, at: int | None, partial_rmtree: bool) -> list[str]:
    """Patch the file-system steps of agentrl.checkpoint.write so that step number `at` (0-based) "kills" the
    process: it raises before doing anything, or with `partial_rmtree` a folder removal deletes one file first.
    Returns the list the steps are recorded in (with at=None nothing crashes: a dry run that counts them)."""
    import agentrl.checkpoint as ck

    steps: list[str] = []
    real = {"rename": Path.rename, "mkdir": Path.mkdir, "write_text": Path.write_text, "save": torch.save,
            "fsync": ck._fsync, "rmtree": shutil.rmtree}

    def step(name, fn):
        def run(*a, **k):
            if at is not None and len(steps) == at:
                steps.append(name)
                if name == "rmtree" and partial_rmtree:  # killed half-way through removing a folder
                    first = next((f for f in Path(a[0]).rglob("*") if f.is_file()), None)
                    if first is not None:
                        first.unlink()
                raise _Crash(name)
            steps.append(name)
            return fn(*a, **k)
        return run

    monkeypatch.setattr(Path, "rename", step("rename", real["rename"]))
    monkeypatch.setattr(Path, "mkdir", step("mkdir", real["mkdir"]))
    monkeypatch.setattr(Path, "write_text", step("write_text", real["write_text"]))
    monkeypatch.setattr(ck.torch, "save", step("save", real["save"]))
    monkeypatch.setattr(ck, "_fsync", step("fsync", real["fsync"]))
    monkeypatch.setattr(ck.shutil, "rmtree", step("rmtree", real["rmtree"]))
    return steps


def _payload(tag: str) -> dict:
    return {"state.json": {"tag": tag}, "model.pt": {"w": torch.full((4,), float(len(tag)))}}


@pytest.mark.parametrize("scenario", ["first-save", "re-save", "re-save-over-corrupt"])
def test_a_kill_at_any_point_of_a_save_leaves_a_loadable_checkpoint(tmp_path, monkeypatch, scenario):
    """Every step of `write` is a place a kill -9 can land (before it, or half-way through a folder removal):
    after each, `latest` finds a checkpoint that verifies and reads, and never one older than before the save.
    The re-save's kill between its two renames used to leave only `.old-*` and `.tmp-*`, both removed."""

    def setup(root: Path) -> None:
        if scenario == "first-save":
            write(root, 1, _payload("one"), keep=1)
        else:
            write(root, 2, _payload("old"), keep=3)
            if scenario == "re-save-over-corrupt":
                (root / "update_00002" / "model.pt").write_bytes(b"lost writes")

    # what each outcome may be: (update, tag) pairs; None: no checkpoint at all
    allowed = {"first-save": {(1, "one"), (2, "new")}, "re-save": {(2, "old"), (2, "new")},
               "re-save-over-corrupt": {None, (2, "new")}}[scenario]
    dry = tmp_path / "dry"
    setup(dry)
    with monkeypatch.context() as m:
        counted = _crashing_write(m, None, False)
        write(dry, 2, _payload("new"), keep=1)
        n = len(counted)
    assert n >= 10 and (read(latest(dry)[0], "state.json")["tag"]) == "new"
    for at in range(n):
        for partial in (False, True):
            root = tmp_path / f"at{at}-{partial}"
            setup(root)
            with monkeypatch.context() as m:
                steps = _crashing_write(m, at, partial)
                with pytest.raises(_Crash):
                    write(root, 2, _payload("new"), keep=1)
            warnings: list[str] = []
            found = latest(root, warn=warnings.append)
            got = None if found is None else (found[1]["update"], read(found[0], "state.json")["tag"])
            assert got in allowed, f"killed at step {at} ({steps[-1]}, partial {partial}): {got}; {warnings}"
            if found is not None:
                assert read(found[0], "model.pt")["w"].shape == (4,)
            assert not [p.name for p in root.iterdir() if p.name.startswith(".")], "leftovers kept"
            # and the run goes on: the next save from there works
            write(root, 3, _payload("three"), keep=1)
            assert latest(root)[1]["update"] == 3


def _sharded_accelerator(kind):
    from accelerate import Accelerator

    class Sharded(Accelerator):  # the real accelerator on the CPU, reporting the sharded type a launch would give
        @property
        def distributed_type(self):
            return kind

    return Sharded


def _rewrite_state(folder: Path, **changes) -> None:
    """Change a checkpoint's state.json and its manifest's checksum with it (a checkpoint written so)."""
    import agentrl.checkpoint as ck

    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, **changes}))
    manifest = json.loads((folder / ck.MANIFEST).read_text())
    manifest["files"]["state.json"] = ck.sha256(folder / "state.json")
    (folder / ck.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("kind", ["FSDP", "DEEPSPEED"])
def test_resume_under_fsdp_or_deepspeed_is_refused_before_any_work(tmp_path, full_run, vault_policy_dir, monkeypatch,
                                                                   capsys, kind):
    """A checkpoint holds only the main rank's optimizer state, which FSDP and ZeRO shard: resuming under them is
    refused by accelerate's distributed type, before the policy loads or the run folder changes; and a checkpoint
    saved under them is refused by a resume under DDP too."""
    from accelerate.utils import DistributedType

    import agentrl.trainer as tr
    from agentrl.run_folder import ResumeUnsupported

    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    with monkeypatch.context() as m:
        m.setattr("accelerate.Accelerator", _sharded_accelerator(DistributedType(kind)))
        m.setattr(tr.Policy, "load", lambda *a, **k: pytest.fail("the policy was loaded"))
        with pytest.raises(ResumeUnsupported, match=f"under {kind}"):
            Trainer(run_config(run, vault_policy_dir), resume=True)
        assert cli.main(["train", "--resume", str(run)]) == 2  # the command line: a usage error, no traceback
        err = capsys.readouterr().err
        assert f"agentrl: error: --resume {run}" in err and "not supported" in err and "Traceback" not in err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before
    newest = checkpoints(run / CHECKPOINTS)[-1]
    _rewrite_state(newest, distributed_type=kind)
    with pytest.raises(ResumeUnsupported, match=f"{newest.name} was saved under {kind}"):
        Trainer(run_config(run, vault_policy_dir), monitor=quiet_monitor(run, run_config(run, vault_policy_dir))[0],
                resume=True)
    saved = json.loads((checkpoints(full_run / CHECKPOINTS)[-1] / "state.json").read_text())
    assert saved["distributed_type"] == "NO"  # what a one-process CPU run records


def test_algo_auto_pick_survives_a_resume_before_the_first_checkpoint(tmp_path, vault_policy_dir, monkeypatch):
    """--algo auto's decision is written into the run folder when the run starts (decisions.json), so a run killed
    before its first checkpoint and resumed still says in summary.json what picked its assigner and why."""
    from agentrl.run_folder import DECISIONS

    run = tmp_path / "run"
    picked = {"algo": "gigpo", "rule": "R2", "reason": "states repeat across episodes", "advice": None,
              "statistics": {"turns_mean": 2.0, "zero_adv_frac": 0.25}, "thresholds": "test", "budget_episodes": 8,
              "family": None}

    def probe(cfg):
        return TrainConfig(**{**cfg.model_dump(exclude={"credit"}), "algo": "gigpo"}), {"algo_auto": picked}

    class Killed(BaseException):
        pass

    def killed_at_start(self, warm=None):
        raise Killed  # a kill -9 during the warm-start evaluation: no checkpoint yet

    argv = ["train", "--env", "test_e2e:Babble", "--model", str(vault_policy_dir), "--out", str(run), "--updates", "2",
            "--rollout.groups", "2", "--rollout.group-size", "2", "--rollout.sampling.max-new-tokens", "8",
            "--rollout.env-workers", "serial", "--eval.episodes", "2"]
    with monkeypatch.context() as m:
        m.setattr("agentrl.cli.training._probe_for_auto", probe)
        m.setattr(Trainer, "train", killed_at_start)
        with pytest.raises(Killed):
            cli.main([*argv, "--algo", "auto"])
    assert not (run / CHECKPOINTS).exists()
    assert json.loads((run / DECISIONS).read_text())["algo_auto"] == picked
    assert cli.main(["train", "--resume", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == "gigpo" and summary["decisions"]["algo_auto"] == picked


def _rows(steps, tag: float) -> list[dict]:
    return [{"step": s, "rollout/pass_rate": tag + s / 100, "train/kl": tag} for s in steps]


def _log_killed_and_resumed(out: Path, **loggers) -> tuple[list[dict], list[dict]]:
    """A run that logged steps 0-5 and a final row at 5 (then was killed), resumed from the checkpoint after step 3:
    the rewound monitor logs steps 4-6 and the final row again, with other values. Returns both runs' rows."""
    console = Console(file=io.StringIO(), width=200)
    out.mkdir(parents=True, exist_ok=True)
    first = Monitor(out, total=6, console=console, **loggers)
    killed = _rows(range(6), 0.0)
    at_checkpoint = None
    for r in killed:
        first.log(r)
        if r["step"] == 3:
            at_checkpoint = first.position()
    first.log({"step": 5, "eval/pass_rate": 0.5, "final": True})
    first.close()  # (a kill leaves the files as they are; closing only flushes what was logged)
    second = Monitor(out, total=6, console=console, **loggers)
    second.rewind(at_checkpoint)
    resumed = _rows(range(4, 7), 1.0)
    for r in resumed:
        second.log(r)
    second.log({"step": 6, "eval/pass_rate": 0.75, "final": True})
    second.close()
    return killed, resumed


def test_tensorboard_of_a_resumed_run_holds_one_value_per_step_the_resumed_ones(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    killed, resumed = _log_killed_and_resumed(tmp_path / "run", tensorboard=True)
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    want = {r["step"]: r for r in killed if r["step"] <= 3} | {r["step"]: r for r in resumed}
    for tag in ("rollout/pass_rate", "train/kl"):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == list(range(7)), tag  # once each: no second value from the killed process
        assert [e.value for e in events] == pytest.approx([want[s][tag] for s in range(7)])
    finals = acc.Scalars("final/eval/pass_rate")  # the killed process's final row (at step 5) is purged too
    assert [(e.step, e.value) for e in finals] == [(6, 0.75)]


def test_wandb_of_a_resumed_run_continues_its_run_rewound_to_the_checkpoint(tmp_path, monkeypatch):
    """No W&B server here: a stand-in `wandb` module records what the logger asks of the SDK."""
    import types

    calls: list[dict] = []

    class FakeRun:
        def __init__(self, kwargs):
            self.kwargs, self.logged, self.summary = kwargs, [], {}
            calls.append(self.kwargs)

        def log(self, data, step):
            self.logged.append((step, dict(data)))

        def finish(self):
            pass

    runs: list[FakeRun] = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(FakeRun(kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    _log_killed_and_resumed(tmp_path / "run", wandb=True, wandb_project="p")
    first, second = runs
    run_id = first.kwargs["id"]
    assert first.kwargs["mode"] == "offline" and "resume_from" not in first.kwargs
    assert second.kwargs["id"] == run_id and second.kwargs["resume_from"] == f"{run_id}?_step=3"
    assert [s for s, _ in first.logged] == [0, 1, 2, 3, 4, 5]
    assert [s for s, _ in second.logged] == [3, 4, 5, 6]  # the checkpoint's row again, then the resumed ones
    assert second.logged[0][1]["train/kl"] == 0.0 and second.logged[1][1]["train/kl"] == 1.0
    assert second.summary == {"final/eval/pass_rate": 0.75}
    # a run started afresh in the folder (--overwrite removes wandb/) gets a W&B run of its own
    from agentrl.checkpoint import clear_run

    clear_run(tmp_path / "run")
    Monitor(tmp_path / "run", total=1, console=Console(file=io.StringIO()), wandb=True).log({"step": 0, "x": 1.0})
    assert runs[-1].kwargs["id"] != run_id and "resume_from" not in runs[-1].kwargs


def test_resume_with_a_thread_pool_under_lockstep_is_bit_identical(tmp_path, vault_policy_dir):
    """What `--seed`'s help and the README promise for the thread pool: under `schedule lockstep` a resumed run ends
    as the run left alone did, bit for bit (under the default arrival schedule the rows sharing a forward follow
    the tools' timing, so only the tasks and the sampling draws are promised: benchmarks/kill_resume.py)."""
    pooled = {"rollout": {"env_workers": "thread:4", "schedule": "lockstep"}}
    full, run = tmp_path / "full", tmp_path / "run"
    cfg = run_config(full, vault_policy_dir, **pooled)
    Trainer(cfg, monitor=quiet_monitor(full, cfg)[0]).train()
    resumed_copy(full, run, keep_through=1)
    cfg = run_config(run, vault_policy_dir, **pooled)
    Trainer(cfg, monitor=quiet_monitor(run, cfg)[0], resume=True).train()
    assert_same_run(full, run, cfg.updates)
