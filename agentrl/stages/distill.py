"""Distillation from a stronger teacher: the stage the recipe prescribes for small policies, before (or
instead of) RL.

Two modes, over the same store, loss and checkpoints as RL:

- **rejection** (sequence level, `run_rejection`): the teacher is sampled `k` times on each of `tasks`
  training tasks (`rejection_sample`), the best episode of each task that the verifier passes is kept,
  and the student is fine-tuned on the kept episodes by the SFT stage (`sft_on_file`). They travel as text
  (`episode_conversation`, written as `agentrl sft --data` JSONL), so the teacher may use another
  tokenizer and another tool-call format.
- **on-policy** (token level): `agentrl train --algo distill --teacher MODEL`. The student samples, the
  trainer scores every action token under the teacher, and the credit rule `algorithms/distill.py` makes
  the per-token log-ratio the advantage. `on_policy_config` turns a train config into that run's.

    out/data.jsonl       the kept episodes as conversations (what `agentrl sft --data` reads)
    out/rejection.json   the counts (tasks, samples, passed, kept, dropped), the teacher's seconds, SFT's metrics
    out/                 the student after SFT (an HF folder)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import agentrl.log as agentrl_log
from agentrl.chat import convert
from agentrl.config import TINY_SFT_LR, RejectionConfig, TrainConfig
from agentrl.core import Episode
from agentrl.policy import Policy
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.teacher import load_teacher

REJECTION_SEEDS = 777_000  # the teacher's task stream starts here (below the held-out seeds, like every training task)


def best_of_k(episodes: Sequence[Episode], min_reward: float = 1.0) -> tuple[list[Episode], dict[str, int]]:
    """Per group (one task's k samples), the episode with the highest reward that reaches `min_reward`, the
    shorter one (fewer action tokens) on a tie; and the counts: tasks, samples, passed, kept, dropped
    (samples not kept), tasks_without_pass.

    >>> from agentrl.core import Turn
    >>> def ep(group, reward, n):
    ...     return Episode([0], [Turn(1, [5] * n, [0.0] * n, [])], reward=reward, group_id=group)
    >>> kept, counts = best_of_k([ep(0, 1.0, 4), ep(0, 1.0, 2), ep(0, 0.0, 1), ep(1, 0.0, 3)])
    >>> [(e.group_id, e.num_action_tokens) for e in kept], counts["kept"], counts["tasks_without_pass"]
    ([(0, 2)], 1, 1)
    """
    groups: dict[int, list[Episode]] = {}
    for e in episodes:
        groups.setdefault(e.group_id, []).append(e)
    kept = []
    for members in groups.values():
        passing = [e for e in members if e.reward >= min_reward and not e.error]
        if passing:
            kept.append(min(passing, key=lambda e: (-e.reward, e.num_action_tokens)))
    passed = sum(e.reward >= min_reward for e in episodes)
    counts = {"tasks": len(groups), "samples": len(episodes), "passed": int(passed), "kept": len(kept),
              "dropped": len(episodes) - len(kept), "tasks_without_pass": len(groups) - len(kept)}
    return kept, counts


def rejection_sample(cfg: TrainConfig, teacher: Policy, rej: RejectionConfig,
                     say: Callable[[str], None] | None = None) -> tuple[list[Episode], dict[str, int]]:
    """The teacher's best passing episode of each of `rej.tasks` training tasks (`best_of_k` over `rej.k`
    samples each) and the counts. Tasks come from a stream seeded by `cfg.seed`, below the held-out seeds."""
    from agentrl.evaluation import make_engine, progress

    rng = np.random.default_rng(cfg.seed + REJECTION_SEEDS)
    task_seeds = rng.integers(0, cfg.eval.seed_offset, size=rej.tasks).tolist()
    sampling = cfg.rollout.sampling.model_copy(update={"temperature": rej.temperature})
    engine = make_engine(cfg, teacher, sampling, seed=cfg.seed + REJECTION_SEEDS)
    max_ctx = cfg.rollout.max_context or getattr(teacher.model.config, "max_position_embeddings", 2048)
    per_chunk = max(1, 64 // rej.k)  # tasks rolled out together: a batch of about 64 rows, like an update's
    episodes: list[Episode] = []
    for start in range(0, len(task_seeds), per_chunk):
        chunk = task_seeds[start : start + per_chunk]
        seeds = [s for s in chunk for _ in range(rej.k)]
        gids = [start + i // rej.k for i in range(len(seeds))]
        envs = [make(cfg.env.id, **cfg.env.kwargs) for _ in seeds]
        got, _ = rollout(envs, seeds, engine, teacher.chat, group_ids=gids, max_context=max_ctx,
                         max_new_tokens=sampling.max_new_tokens, workers=cfg.rollout.env_workers,
                         on_episode=progress("teacher rollouts", say))
        errored = [e for e in got if e.error]
        if errored:
            raise RuntimeError(f"{len(errored)} teacher episode(s) errored; first: {errored[0].error}")
        episodes += got
    return best_of_k(episodes, rej.min_reward)


def episode_conversation(episode: Episode, task: str, teacher_format: str, student_format: str) -> dict[str, Any]:
    """A teacher's episode as a conversation (agentrl's JSONL layout, `agentrl.stages.data`): the task, then
    each action and the observation that answered it, ending with the last action. Calls are rewritten into
    the student's format where the teacher writes another; the system prompt and tools are left out, so the
    environment's own are used when the student's SFT reads them.

    >>> from agentrl.core import Turn
    >>> ep = Episode([0], [Turn(1, [], [], [], '<tool_call>{"name": "f", "arguments": {}}</tool_call>', "3"),
    ...                    Turn(2, [], [], [], "done", "")], reward=1.0)
    >>> [m["role"] for m in episode_conversation(ep, "Open it.", "hermes", "hermes")["messages"]]
    ['user', 'assistant', 'tool', 'assistant']
    """
    messages = [{"role": "user", "content": task}]
    for i, turn in enumerate(episode.turns):
        action = turn.action if teacher_format == student_format else convert(turn.action, teacher_format,
                                                                              student_format)
        messages.append({"role": "assistant", "content": action})
        if i < len(episode.turns) - 1:
            messages.append({"role": "tool", "content": turn.observation})
    return {"messages": messages, "reward": episode.reward}


def write_conversations(episodes: Sequence[Episode], path: Path, env_id: str, env_kwargs: dict[str, Any],
                        teacher_format: str, student_format: str) -> int:
    """Write `episodes` as JSONL conversations to `path` (each task's text read back from a fresh env reset with
    its seed); returns how many lines were written."""
    env = make(env_id, **env_kwargs)
    with open(path, "w") as f:
        for e in episodes:
            task, _ = env.reset(seed=e.seed)
            f.write(json.dumps(episode_conversation(e, task, teacher_format, student_format)) + "\n")
    return len(episodes)


def student_folder(cfg: TrainConfig, say: Callable[[str], None]) -> tuple[str, TrainConfig]:
    """The student to distil into (`cfg.model`, or the tiny policy's cached warm start), and the config its SFT
    runs with: the tiny policy, a small model still learning its task, keeps its own SFT rate unless one is given
    (a loaded model's default rate is for a pretrained model that must keep what it knew)."""
    if cfg.model is not None:
        return cfg.model, cfg
    from agentrl.stages.warm_start import warm_start

    folder = str(warm_start(cfg.env.id, cfg.env.kwargs, cfg.tiny, cfg.sft, cfg.seed, say=say))
    sft = cfg.sft if cfg.sft.lr is not None else cfg.sft.model_copy(update={"lr": TINY_SFT_LR})
    return folder, cfg.model_copy(update={"model": folder, "sft": sft})


def run_rejection(cfg: TrainConfig, rej: RejectionConfig, out: str | Path,
                  say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`agentrl distill --mode rejection`: sample the teacher (`cfg.teacher`), keep the best passing episode of
    each task, write them to `out/data.jsonl`, fine-tune the student on them (`sft_on_file`) into `out`, and return
    the record written to `out/rejection.json` (counts, seconds, held-out pass rate)."""
    from agentrl.evaluation import resolve_device

    say = say or agentrl_log.say(__name__)
    if cfg.teacher is None:
        raise ValueError("rejection sampling needs a teacher: give --teacher MODEL")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    student, sft_cfg = student_folder(cfg, say)
    t0 = time.perf_counter()
    teacher = load_teacher(cfg.teacher, device=resolve_device(cfg.device))
    kept, counts = rejection_sample(cfg, teacher, rej, say)
    teacher_seconds = time.perf_counter() - t0
    say(f"rejection sampling: {counts['kept']} episodes kept, {counts['dropped']} dropped ({counts['passed']} of "
        f"{counts['samples']} teacher samples passed; {counts['tasks_without_pass']} of {counts['tasks']} tasks "
        f"without a pass) in {teacher_seconds:.0f}s")
    if not kept:
        raise NothingToDistil(f"the teacher {cfg.teacher} passed none of its {counts['samples']} samples: nothing to "
                         "distil; check the teacher on this env (agentrl train --model TEACHER --updates 0) or raise "
                         "--rejection.k")
    student_format = Policy.load(student).chat.tool_format.name
    data = out / "data.jsonl"
    write_conversations(kept, data, cfg.env.id, cfg.env.kwargs, teacher.chat.tool_format.name, student_format)
    del teacher
    t1 = time.perf_counter()
    result, metrics = sft_on_file(sft_cfg.model_copy(update={"model": student}), data, out, say)
    record = {"teacher": cfg.teacher, "student": student, "counts": counts, "teacher_seconds": teacher_seconds,
              "sft_seconds": time.perf_counter() - t1, "held_out_pass_rate": result.pass_rate,
              "eval_episodes": result.episodes, "sft": metrics, "rejection": rej.model_dump()}
    (out / "rejection.json").write_text(json.dumps(record, indent=2))
    return record


def sft_on_file(cfg: TrainConfig, data: Path, out: Path, say: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """The SFT stage on the student `cfg.model`: its action tokens' cross-entropy on the conversations in `data`
    (laid out with the environment's system prompt and tools, as its rollouts are), `cfg.sft`'s epochs, rate
    and batch; the student saved to `out` and evaluated on the held-out seeds. Returns (held-out result, SFT's
    metrics)."""
    from agentrl.evaluation import evaluate
    from agentrl.stages.data import load_conversations, to_episode
    from agentrl.stages.sft import progress_lines, sft

    policy = Policy.load(cfg.model, tool_format=cfg.tool_format)
    env = make(cfg.env.id, **cfg.env.kwargs)
    demos = [to_episode(c, policy.chat, group_id=n) for n, c in load_conversations(data, env.system_prompt,
                                                                                   env.tool_schemas())]
    lr = cfg.sft.lr_for(pretrained=True)
    say(f"sft: {len(demos)} teacher episodes x {cfg.sft.epochs} epochs, batch {cfg.sft.batch_size}, lr {lr:g}")
    metrics = sft(policy.model, demos, policy.chat.pad_id, epochs=cfg.sft.epochs, lr=lr,
                  batch_size=cfg.sft.batch_size, max_tokens=cfg.sft.max_batch_tokens, seed=cfg.seed,
                  log=progress_lines(say))
    policy.save(out)
    result = evaluate(cfg, policy, None, getattr(policy.model.config, "max_position_embeddings", 2048), say=say)
    say(f"held-out pass rate on {cfg.env.id} {result.pass_rate:.3f} over {result.episodes} episodes; student saved "
        f"to {out}")
    return result, metrics


def on_policy_config(cfg: TrainConfig, **credit: Any) -> TrainConfig:
    """`cfg` as an on-policy distillation run: `--algo distill` with `credit` options (default: its defaults)."""
    return TrainConfig(**{**cfg.model_dump(exclude={"credit"}), "algo": "distill", "credit": credit})


class NothingToDistil(ValueError):
    """The teacher passed none of its samples: there is no episode to fine-tune the student on."""


@dataclass(frozen=True)
class DistillStage:
    """The pipeline's distillation stage (`agentrl pipeline --distill MODE`), between SFT and DPO."""

    mode: str  # "rejection" or "on-policy"
    updates: int = 20  # on-policy: RL updates with --algo distill
    rejection: RejectionConfig = field(default_factory=RejectionConfig)
    stop_after: bool = False  # end the pipeline after this stage (no DPO, no RL)

    @property
    def name(self) -> str:
        return f"distill ({self.mode})"

    def model_dir(self, folder: Path) -> Path:
        """Where the stage leaves the distilled student: the SFT output, or the on-policy run's checkpoint/."""
        return folder if self.mode == "rejection" else folder / "checkpoint"

    def record(self) -> dict[str, Any]:
        return {"mode": self.mode, "updates": self.updates, "rejection": self.rejection.model_dump(),
                "stop_after": self.stop_after}


def run_stage(cfg: TrainConfig, stage: DistillStage, start: Path, folder: Path, warm: Any,
              say: Callable[[str], None]) -> dict[str, Any]:
    """Distil `cfg.teacher` into the policy in `start` (the pipeline's tiny SFT policy), leaving the student in
    `stage.model_dir(folder)`; returns what the pipeline's table records of it."""
    from agentrl.trainer import Trainer

    student = cfg.model_copy(update={"model": str(start)})
    if stage.mode == "rejection":
        if cfg.sft.lr is None:  # the pipeline's student is the tiny policy: its own SFT rate (student_folder)
            student = student.model_copy(update={"sft": cfg.sft.model_copy(update={"lr": TINY_SFT_LR})})
        rec = run_rejection(student, stage.rejection, folder, say)
        return {"kept": rec["counts"]["kept"], "dropped": rec["counts"]["dropped"],
                "teacher_seconds": round(rec["teacher_seconds"], 1)}
    run = on_policy_config(student.model_copy(update={"out": str(folder), "updates": stage.updates}))
    summary = Trainer(run, overwrite=True).train(warm=warm)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    kl = [r["credit/teacher_kl"] for r in rows if "credit/teacher_kl" in r]
    seconds = sum(r.get("time/teacher_s", 0.0) for r in rows)
    return {"updates": summary["updates_done"], "teacher_kl_first": kl[0] if kl else None,
            "teacher_kl_last": kl[-1] if kl else None, "teacher_seconds": round(seconds, 1)}
