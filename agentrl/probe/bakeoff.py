"""The bake-off: short training runs of the candidate assigners from the same start, on the same
seed and budget, with their learning curves (what `agentrl probe --bakeoff` adds to the report)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

import agentrl.log as agentrl_log


class BakeoffRun(BaseModel):
    """One assigner's short run."""

    algo: str
    curve: list[float] = Field(description="training pass rate per update")
    slope: float = Field(description="least-squares slope of the training pass rate, per update")
    warm_pass_rate: float
    final_pass_rate: float
    wall_s: float


def learning_slope(curve: Sequence[float]) -> float:
    """Least-squares slope of a curve against its index (0 with fewer than 2 points).

    >>> learning_slope([0.1, 0.2, 0.3])
    0.1
    """
    if len(curve) < 2:
        return 0.0
    return round(float(np.polyfit(np.arange(len(curve)), np.asarray(curve, dtype=float), 1)[0]), 12)


def bakeoff(
    train_config: Any,
    algos: Sequence[str] | None,
    updates: int,
    out: str | Path,
    eval_episodes: int = 32,
    say: Callable[[str], None] | None = None,
) -> list[BakeoffRun]:
    """Train each of `algos` (None: every registered assigner that needs no teacher) for `updates` updates from
    the same start (the config's model or warm start), on the same seed and budget, and record the learning
    curves."""
    say = say or agentrl_log.say(__name__)
    import json
    import time

    from agentrl.algorithms import teacherless_assigners
    from agentrl.config import TrainConfig
    from agentrl.evaluation import evaluate
    from agentrl.trainer import Trainer

    algos = teacherless_assigners() if algos is None else algos  # distill needs a teacher the probe has not

    runs = []
    warm = None
    for algo in algos:
        data = train_config.model_dump()
        data.update(algo=algo, credit={}, updates=updates, out=str(Path(out) / f"bakeoff-{algo}"))
        data["eval"] = {**data["eval"], "episodes": eval_episodes, "every": 0}
        cfg = TrainConfig(**data)
        t0 = time.perf_counter()
        trainer = Trainer(cfg)
        trainer.monitor.console.quiet = True
        if warm is None:  # every run starts from the same policy: evaluate it once
            warm = evaluate(cfg, trainer.policy, None, trainer.max_context)
        summary = trainer.train(warm=warm)
        rows = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
        curve = [r["rollout/pass_rate"] for r in rows if r.get("step", 0) >= 1 and "rollout/pass_rate" in r]
        runs.append(
            BakeoffRun(
                algo=algo,
                curve=curve,
                slope=learning_slope(curve),
                warm_pass_rate=summary["warm_start_pass_rate"],
                final_pass_rate=summary["final_pass_rate"],
                wall_s=time.perf_counter() - t0,
            )
        )
        say(
            f"bakeoff {algo}: {summary['warm_start_pass_rate']:.2f} -> {summary['final_pass_rate']:.2f}, slope "
            f"{runs[-1].slope:+.3f}/update"
        )
    return runs
