"""Data-parallel training (issue 16) on this CPU: 2 processes through accelerate's launcher (gloo).

The oracle is one process on the same batch: the two ranks' episodes together must be the episodes one
process rolls out, and one update on them must give the one-process parameters (and assigner state) to
1e-5, for every assigner and each loss aggregation. The run folder of a two-process run must look like a
one-process run's: one metrics.jsonl with each step once, one summary, one checkpoint, and a store whose
shards hold every episode once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.checkpoint import checkpoints, read
from agentrl.config import TrainConfig, read_yaml
from agentrl.distributed import launch_command
from agentrl.run_folder import CHECKPOINTS
from agentrl.store import TrajectoryStore
from agentrl.trainer import Trainer

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
from distributed_run import CASES, run  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process runs are tested on Linux")


def _env() -> dict[str, str]:
    # the ranks import test_e2e:Babble (in tests/); one thread each, as on the 2-core machine the launcher is meant for
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


def _launch(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory, vault_policy_dir):
    """Every case run once by one process (in this one) and once by two (accelerate launch)."""
    root = tmp_path_factory.mktemp("dp")
    run(vault_policy_dir, root / "one", list(CASES))
    cmd = launch_command(2, [])
    # the launcher and its options, then the script in place of the trailing `-m agentrl` (the command starts
    # with `python -m accelerate.commands.launch`: the first -m is the launcher's own)
    script = len(cmd) - 1 - cmd[::-1].index("-m")
    assert cmd[script:] == ["-m", "agentrl"], cmd
    _launch([*cmd[:script], str(TESTS / "distributed_run.py"), str(vault_policy_dir), str(root / "two"), *CASES])
    return root


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "checkpoint" / "model.safetensors")


def _episodes(folder: Path) -> list[tuple]:
    return [(e.group_id, e.seed, tuple(e.token_ids()), e.reward) for e in TrajectoryStore.load(folder / "store")]


@pytest.mark.parametrize("case", list(CASES))
def test_one_update_on_two_processes_gives_the_one_process_parameters(runs, case, vault_policy_dir):
    one, two = runs / "one" / case, runs / "two" / case
    assert {p.name.split(".")[1] for p in (two / "store").iterdir()} == {"rank0", "rank1"}  # two ranks ran it
    assert _episodes(two) == _episodes(one)  # the ranks' shards together: the one-process episodes, in order
    start, w1, w2 = load_file(vault_policy_dir / "model.safetensors"), _weights(one), _weights(two)
    moved = max(float((w1[k] - start[k]).abs().max()) for k in w1)
    assert moved > 1e-4, f"{case}: the update did not move the policy ({moved:.2e}): the comparison would be empty"
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert diff <= 1e-5, f"{case}: two processes differ from one by {diff:.2e} (the update moved {moved:.2e})"
    # the assigner's own fitted state (critic, PRM heads, counters): every rank fits on the whole batch
    a1 = read(checkpoints(one / CHECKPOINTS)[-1], "assigner.pt")
    a2 = read(checkpoints(two / CHECKPOINTS)[-1], "assigner.pt")
    flat1, flat2 = _flatten(a1), _flatten(a2)
    assert flat1.keys() == flat2.keys()
    for k in flat1:
        if isinstance(flat1[k], torch.Tensor):
            assert torch.allclose(flat1[k].float(), flat2[k].float(), atol=1e-5), f"{case}: assigner {k} differs"
        else:
            assert flat1[k] == pytest.approx(flat2[k], abs=1e-5), f"{case}: assigner {k} differs"
    m1, m2 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()], \
        [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    # the gradient's scale too (Adam's step hides it, clipping and the logged norm do not): DDP's mean undone; and
    # the engine gap measured on the same tokens (the first minibatch's forwards, the ranks' rows put together)
    for k in ("rollout/pass_rate", "credit/zero_adv_groups", "credit/adv_abs_mean", "train/loss", "train/pg_loss",
              "train/kl", "train/ratio_mean", "train/entropy", "train/grad_norm", "mismatch/tokens"):
        if k in m1[1]:
            assert m2[1][k] == pytest.approx(m1[1][k], abs=1e-5), f"{case}: {k} is reduced differently"
    # a group's prompt ran through the layers once in the training forwards of both (DDP then trains the unwrapped
    # module and averages the gradients itself), and the parameters above are still one process's. Not the same
    # count: one process also shares the prefix two groups' prompts have in common, when a micro-batch holds both
    if case == "grpo.shared-prompt":
        assert m1[1].get("train/prompt_tokens_shared", 0) > 0, "one process shared no prompt: nothing compared"
        assert m2[1].get("train/prompt_tokens_shared", 0) > 0, "two processes ran every row's prompt in training"


def _flatten(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        return {k2: v2 for k, v in obj.items() for k2, v2 in _flatten(v, f"{prefix}{k}.").items()}
    if isinstance(obj, (list, tuple)):
        return {k2: v2 for i, v in enumerate(obj) for k2, v2 in _flatten(v, f"{prefix}{i}.").items()}
    return {prefix: obj}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, vault_policy_dir):
    """`agentrl train --num-processes 2`: two updates, a checkpoint after each."""
    out = tmp_path_factory.mktemp("cli") / "run"
    done = _launch([sys.executable, "-m", "agentrl", "train", "--num-processes", "2", "--env", "test_e2e:Babble",
                    "--model", str(vault_policy_dir), "--updates", "2", "--out", str(out), "--rollout.groups", "2",
                    "--rollout.group-size", "4", "--rollout.env-workers", "serial", "--eval.episodes", "3",
                    "--checkpoint.every", "1"])
    assert "starting 2 processes" in done.stderr
    return out


def test_two_process_run_writes_one_run_folder_and_a_shard_per_rank(cli_run):
    rows = [json.loads(x) for x in (cli_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if not r.get("final")] == [0, 1, 2]  # each step once, by the main process
    assert sum(bool(r.get("final")) for r in rows) == 1
    summary = json.loads((cli_run / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["updates_done"] == 2
    assert [c.name for c in checkpoints(cli_run / CHECKPOINTS)] == ["update_00001", "update_00002"]
    shards = sorted(p.name for p in (cli_run / "store").iterdir())
    assert shards == [f"update_0000{u}_0.rank{r}.parquet" for u in (1, 2) for r in (0, 1)]
    for u in (1, 2):
        parts = [TrajectoryStore.load(cli_run / "store" / f"update_0000{u}_0.rank{r}.parquet") for r in (0, 1)]
        assert [len(p) for p in parts] == [4, 4]  # one group of 4 each
        groups = [{e.group_id for e in p} for p in parts]
        assert not groups[0] & groups[1]  # whole groups on one rank, no episode twice
        seeds = [e.seed for p in parts for e in p]
        assert len(set(seeds[:4]) | set(seeds[4:])) == len(set(seeds))  # the ranks drew the stream's seeds
    assert not list(cli_run.glob("*.rank*"))  # nothing else written per rank


def _cut_to(src: Path, dst: Path, update: int) -> None:
    """`src` as a run killed after update `update`'s checkpoint leaves it."""
    shutil.copytree(src, dst)
    for folder in checkpoints(dst / CHECKPOINTS):
        if int(folder.name.split("_")[1]) > update:
            shutil.rmtree(folder)


def test_resumed_two_process_run_ends_where_the_uninterrupted_one_did(cli_run, tmp_path):
    """Resumed by two processes (the launcher) and by one: the state is the same whatever the number of ranks."""
    two, one = tmp_path / "two", tmp_path / "one"
    _cut_to(cli_run, two, 1)
    _cut_to(cli_run, one, 1)
    _launch([sys.executable, "-m", "agentrl", "train", "--num-processes", "2", "--resume", str(two)])
    cfg = TrainConfig.model_validate(read_yaml(one / "config.yaml"))
    Trainer(cfg.model_copy(update={"out": str(one)}), resume=True).train()
    want = _weights(cli_run)
    for got in (_weights(two), _weights(one)):
        assert max(float((want[k] - got[k]).abs().max()) for k in want) <= 1e-5
    rows = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if not r.get("final")] == [0, 1, 2]  # the resumed update written once
