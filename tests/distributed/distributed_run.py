"""The runs of test_distributed.py: started by it under `accelerate launch --multi_gpu --num_processes 2`
(CPU, gloo) and called in-process with one process, on the same configs.

    python tests/distributed/distributed_run.py POLICY_DIR ROOT CASE [CASE ...]

Each CASE (see `CASES`) is one short run into ROOT/CASE: Babble on the micro policy, 2 groups x 4 episodes, so
under two processes each rank rolls out one group.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentrl.config import TrainConfig
from agentrl.trainer import Trainer

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# what makes each assigner train on its first update: critics steer from the start (no warm-up, no EV gate)
CREDIT = {"grpo": {}, "arpo": {"ev_gate": -1e9}, "steppo": {}, "turn-ppo": {"warmup_updates": 0},
          "gigpo": {}}
CASES = {f"{algo}.{agg}": (algo, agg, credit) for algo, credit in CREDIT.items() for agg in AGGREGATIONS}
# DAPO's dynamic sampling decides from the whole batch whether to roll out more: every rank must agree
CASES["grpo.resample"] = ("grpo", "token-mean", {"dynamic_sampling": "resample", "max_resample_batches": 2})
# micro-batches wide enough to hold a group: its rows run their common prompt once (optim.share_prefix), and
# under DDP the trainer then averages the gradients itself
CASES["grpo.shared-prompt"] = ("grpo", "token-mean", {})
MICRO_BATCH_TOKENS = {"grpo.shared-prompt": 4096}


def case_config(case: str, policy_dir: Path, root: Path, updates: int = 1) -> TrainConfig:
    algo, agg, credit = CASES[case]
    return TrainConfig(
        algo=algo,
        env={"id": "test_e2e:Babble"},
        model=str(policy_dir),
        updates=updates,
        out=str(root / case),
        credit=credit,
        # serial env calls: which rows share a forward then never follows the tools' timing
        rollout={"groups": 2, "group_size": 4, "sampling": {"max_new_tokens": 8}, "env_workers": "serial"},
        # two minibatches: each rank holds rows of both, and the ranks must draw the same ones
        optim={"lr": 1e-3, "minibatches": 2, "micro_batch_tokens": MICRO_BATCH_TOKENS.get(case, 64)},
        loss={"agg": agg, "kl_coef": 0.01, "entropy_coef": 0.01},
        eval={"episodes": 3},
        checkpoint={"every": 1},
    )


def run(policy_dir: Path, root: Path, cases: list[str]) -> None:
    for case in cases:
        Trainer(case_config(case, policy_dir, root)).train()


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
