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
from agentrl.config import TrainConfig
from agentrl.monitor import Monitor
from agentrl.trainer import CHECKPOINTS, Trainer

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

    monkeypatch.setattr("agentrl.trainer.train", no_work)
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
    monkeypatch.setattr("agentrl.trainer.train", lambda *a, **k: pytest.fail("training started"))
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
    cfg = TrainConfig.model_validate(cli.read_yaml(run / "config.yaml"))
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
        start = dict(fresh.accelerator.unwrap_model(fresh.model).named_parameters())
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
