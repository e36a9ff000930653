"""The recipe's stages in order, one call each. `train`: the tiny policy's SFT warm start where no model is
given, then the RL loop (what `agentrl train` runs). `run_pipeline`: SFT -> (distill) -> DPO/SimPO/IPO -> RL,
each stage in its own folder (what `agentrl pipeline` runs).

    out/sft/   the warm-started policy (HF folder) and its metrics
    out/distill/   with a distillation stage: the student after it (agentrl.stages.distill)
    out/dpo/   the preference-tuned policy, pairs statistics, dpo_metrics.jsonl
    out/rl/    the RL run (config.yaml, metrics.jsonl, store/, checkpoint/, summary.json)
    out/pipeline.json   held-out pass rate after every stage, and seconds per stage

Every stage is evaluated on the same held-out seeds, so the table compares like with like.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import agentrl.log as agentrl_log
from agentrl.config import DPOConfig, EnvConfig, TrainConfig
from agentrl.distributed import Ranks
from agentrl.monitor import Monitor
from agentrl.policy import Policy
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.stages.distill import DistillStage, run_stage
from agentrl.stages.dpo import pairs_from_episodes, train_preferences
from agentrl.stages.warm_start import KEY_FILE, warm_start, warm_start_from_data


def warm_start_record(folder: Path) -> dict[str, Any]:
    """What the warm start was built from and how (its key's parts and its SFT metrics), for summary.json."""
    record: dict[str, Any] = {"dir": str(folder)}
    for name, field in (("warm_start.json", "sft"), (KEY_FILE, "key_parts")):
        try:
            record[field] = json.loads((folder / name).read_text())
        except (OSError, json.JSONDecodeError):
            record[field] = None
    return record


def demo_context(cfg: TrainConfig) -> dict[str, Any]:
    """What of the run's rollout its warm start's demonstrations are played under: the context policy (a summarize
    run's warm start learns the expert's summaries) and the sampling's cap on new tokens, which sets where the
    policy compacts."""
    return {"context": cfg.rollout.context, "max_new_tokens": cfg.rollout.sampling.max_new_tokens}


def train(cfg: TrainConfig, monitor: Monitor | None = None, decisions: dict[str, Any] | None = None,
          resume: bool = False, overwrite: bool = False, runner: Any = None) -> dict[str, Any]:
    """Stage one where it is needed (the tiny policy's SFT warm start, cached), then the RL loop
    (`resume` / `overwrite`: see `agentrl.trainer.Trainer`). Returns the run's summary."""
    from agentrl.eval_sources import resolve_sources
    from agentrl.evaluation import heldout_env_kwargs, resolve_device
    from agentrl.trainer import Trainer

    resolve_sources(cfg)  # a bad evaluation source fails here, not after the warm start (the trainer resolves them)
    if cfg.agent is None:  # and so does a held-out split the env's arguments cannot hold (a BFCL subset of train ids)
        kwargs = heldout_env_kwargs(cfg)
        try:
            make(cfg.env.id, **kwargs).close()
        except Exception as e:
            raise ValueError(f"the held-out evaluation's env {cfg.env.id} ({kwargs}): {e}") from None
    start = None
    decisions = dict(decisions or {})
    if cfg.model is None:
        say = monitor.say if monitor is not None else None
        # several processes: the main one builds (or finds) the cached warm start, then the others find it
        with Ranks(cpu=resolve_device(cfg.device).type == "cpu").main_first():
            if cfg.agent is not None:  # the agent's own demonstrations, not an env's expert
                if cfg.agent.demos is None and not cfg.sft.warm_start:
                    raise ValueError("an agent with no model needs demonstrations to warm-start the tiny policy: "
                                     "give --agent.demos FILE.jsonl (its conversations in OpenAI's format), or a "
                                     "model (--model FOLDER, e.g. one `agentrl sft --data` saved)")
                start = warm_start_from_data(cfg.agent.demos or "", cfg.tiny, cfg.sft, cfg.seed, say=say)
            else:
                start = warm_start(cfg.env.id, cfg.env.kwargs, cfg.tiny, cfg.sft, cfg.seed,
                                   **({"say": say} if say else {}), **demo_context(cfg))
        decisions["warm_start"] = warm_start_record(Path(start))
    return Trainer(cfg, monitor=monitor, start=start, decisions=decisions, resume=resume, overwrite=overwrite,
                   runner=runner).train()


def run_sft(cfg: TrainConfig, out: str | Path, data: str | None = None, lora_r: int = 0,
            say: Callable[[str], None] | None = None, record: dict[str, Any] | None = None) -> tuple[Any, str | None]:
    """Stage one alone (`agentrl sft`): fine-tune on demonstrations and save an HF folder to `out`; returns the
    held-out result of what was saved and the warm start's advice (None when it leaves RL something to learn).

    Without `cfg.model` or `data`: the tiny policy's cached warm start (`agentrl.stages.warm_start`), copied to
    `out`. Otherwise the demonstrations come from `data` (agentrl's or TRL's conversational JSONL) or from the
    env's scripted expert, and `cfg.model` (with LoRA adapters of rank `lora_r`, merged before saving) or the
    tiny policy built from the data's own text is fine-tuned on them. A file that holds nothing usable, or a
    demonstration longer than the model's context, is a `DataError` naming where. `record` joins what
    warm_start.json says of the SFT (its settings, its metrics): the CLI's pretrained defaults."""
    import shutil

    from agentrl.evaluation import evaluate
    from agentrl.health.warm_start import warm_start_advice
    from agentrl.stages.data import DataError, load_conversations, to_episode
    from agentrl.stages.sft import collect_demos, progress_lines, sft, tiny_policy_from_conversations

    say = say or agentrl_log.say(__name__)
    out = Path(out)
    if cfg.model is None and data is None:
        folder = warm_start(cfg.env.id, cfg.env.kwargs, cfg.tiny, cfg.sft, cfg.seed, say=say, **demo_context(cfg))
        shutil.copytree(folder, out, dirs_exist_ok=True)
        policy = Policy.load(out)
    else:
        env = make(cfg.env.id, **cfg.env.kwargs)
        convs = load_conversations(data, env.system_prompt, env.tool_schemas()) if data else []
        if cfg.model is not None:
            policy = Policy.load(cfg.model, tool_format=cfg.tool_format)
        else:
            say(f"sft: building the tiny policy and its tokenizer from the {len(convs)} demonstrations in {data}")
            policy = tiny_policy_from_conversations([c for _, c in convs], out, cfg.tiny, seed=cfg.seed)
        if data:
            demos = [to_episode(c, policy.chat, group_id=n) for n, c in convs]
        else:
            noise = cfg.sft.noise
            if noise == "auto":
                noise = type(cfg.sft).model_fields["noise"].default
                say(f"sft: noise auto with --model -> {noise:g}: probing slip rates by repeated SFT is done for the "
                    "tiny policy only (a loaded model's SFT is too long to repeat); the held-out check after SFT says "
                    "whether this warm start leaves RL something to learn")
            demos = collect_demos(lambda: make(cfg.env.id, **cfg.env.kwargs), policy.chat,
                                  list(range(20_000_000, 20_000_000 + cfg.sft.episodes)), noise)
        context = getattr(policy.model.config, "max_position_embeddings", None)
        longest = max(range(len(demos)), key=lambda i: len(demos[i].token_ids()))
        if context is not None and len(demos[longest].token_ids()) > context:
            where = f"{data}:{convs[longest][0]}" if data else f"demonstration {longest}"
            raise DataError(f"{where}: {len(demos[longest].token_ids())} tokens, longer than the model's context "
                            f"({context})" + ("; raise --tiny.max-position-embeddings" if cfg.model is None else ""))
        model = policy.model
        if lora_r:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear",
                                                     lora_dropout=0.0))
        lr = cfg.sft.lr_for(pretrained=cfg.model is not None)
        tokens = sum(len(d.token_ids()) for d in demos)
        say(f"sft: {len(demos)} demonstrations ({tokens:,} tokens) x {cfg.sft.epochs} epochs, batch "
            f"{cfg.sft.batch_size}, lr {lr:g}" + (" (the tiny policy's, from scratch)" if cfg.model is None else ""))
        metrics = sft(model, demos, policy.chat.pad_id, epochs=cfg.sft.epochs, lr=lr, batch_size=cfg.sft.batch_size,
                      max_tokens=cfg.sft.max_batch_tokens, seed=cfg.seed, log=progress_lines(say))
        if lora_r:
            policy.model = model.merge_and_unload()  # an ordinary HF folder, loadable without peft
        policy.save(out)
        metrics.update({"demonstrations": len(demos), "demo_pass_rate": sum(d.passed for d in demos) / len(demos),
                        "data": data, "settings": {"epochs": cfg.sft.epochs, "batch_size": cfg.sft.batch_size,
                                                   "lr": lr, "lora_r": lora_r}, **(record or {})})
        (out / "warm_start.json").write_text(json.dumps(metrics, indent=2))
        say(f"sft: loss {metrics['sft/loss']:.4f} after {metrics['sft/steps']} steps in {metrics['sft/seconds']:.0f}s")
    result = evaluate(cfg, policy, None, getattr(policy.model.config, "max_position_embeddings", 2048), say=say)
    say(f"held-out pass rate on {cfg.env.id} {result.pass_rate:.3f} over {result.episodes} episodes; model saved to "
        f"{out}")
    record = json.loads((out / "warm_start.json").read_text()) if (out / "warm_start.json").is_file() else {}
    advice = warm_start_advice(result.pass_rate, result.episodes, record.get("demo_pass_rate"),
                               tuple(cfg.sft.useful_band))
    return result, advice


def run_dpo(model: str | Path, out: str | Path, dpo: DPOConfig, pairs_file: str | None = None,
            env: EnvConfig | None = None, seed: int = 0, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Stage two alone (`agentrl dpo`): preference optimisation of `model` (also the frozen reference, except for
    SimPO, which has none) on pairs from `pairs_file` or, without one, from the policy's own rollouts on `env` (a
    passing against a failing episode of one task); saves the tuned model and dpo_metrics.jsonl to `out` and
    returns the last metrics. A file that holds no pairs, or rollouts that make none, is a `DataError`."""
    from agentrl.stages.data import DataError, load_pairs

    say = say or agentrl_log.say(__name__)
    policy = Policy.load(model)
    if pairs_file:
        pairs, counts = load_pairs(pairs_file, policy.chat)
    else:
        cfg = TrainConfig(env=env or EnvConfig(), seed=seed)
        pairs, counts = pairs_from_episodes(collect_groups(cfg, policy, dpo.groups, dpo.group_size, seed),
                                            dpo.max_pairs_per_group)
        if not pairs:
            raise DataError(f"no pairs: all {counts['groups']} groups were all-pass or all-fail; raise --dpo.groups "
                            "or start from a policy with a pass rate in (0, 1)")
    say(f"{len(pairs)} pairs ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    reference = copy.deepcopy(policy.model).eval().requires_grad_(False) if dpo.loss != "simpo" else None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "dpo_metrics.jsonl", "w") as log:
        metrics = train_preferences(policy.model, reference, pairs, policy.chat.pad_id, dpo, seed,
                                    log=lambda m: log.write(json.dumps(m) + "\n"))
    policy.save(out)
    say(f"{dpo.loss}: loss {metrics['dpo/loss']:.4f}, margin {metrics['dpo/margin']:.3f}, accuracy "
        f"{metrics['dpo/accuracy']:.2f}; saved to {out}")
    return metrics


def collect_groups(cfg: TrainConfig, policy: Policy, groups: int, group_size: int, seed: int) -> list:
    """Fresh training-range tasks, `group_size` episodes each, sampled from `policy`."""
    from agentrl.evaluation import make_engine

    rng = np.random.default_rng(seed + 777)
    task_seeds = rng.integers(0, cfg.eval.seed_offset, size=groups).tolist()
    seeds = [s for s in task_seeds for _ in range(group_size)]
    gids = [i // group_size for i in range(len(seeds))]
    envs = [make(cfg.env.id, **cfg.env.kwargs) for _ in seeds]
    engine = make_engine(cfg, policy, cfg.rollout.sampling, seed=seed + 99)
    max_ctx = getattr(policy.model.config, "max_position_embeddings", 2048)
    episodes, _ = rollout(envs, seeds, engine, policy.chat, group_ids=gids, max_context=max_ctx,
                          max_new_tokens=cfg.rollout.sampling.max_new_tokens)
    return episodes


def run_pipeline(cfg: TrainConfig, dpo: DPOConfig | None, out: str | Path,
                 say: Callable[[str], None] | None = None, resume: bool = False,
                 overwrite: bool = False, distill: DistillStage | None = None) -> dict[str, Any]:
    """SFT, then distillation from `cfg.teacher` (when `distill` is given; the pipeline ends there with its
    `stop_after`), then preference optimisation (skipped when `dpo` is None), then RL (skipped when
    cfg.updates == 0). Returns the per-stage table.

    The stages resume at their own boundaries: with `resume`, a stage that `pipeline.json` records as
    finished (its model saved in its folder) is not run again, and RL goes on from its newest checkpoint.
    A killed SFT goes on after its last finished epoch (the warm start keeps its state beside the cache);
    a killed DPO stage runs again from its start."""
    say = say or agentrl_log.say(__name__)
    from agentrl.evaluation import evaluate
    from agentrl.trainer import Trainer

    if cfg.model is not None:
        raise ValueError("the pipeline builds its own SFT policy; run `agentrl dpo` / `agentrl train --model` to start "
                         "from a model")
    out = Path(out)
    if overwrite and out.is_dir():
        for name in ("sft", "distill", "dpo", "rl"):
            shutil.rmtree(out / name, ignore_errors=True)
        for name in ("pipeline.json", "dpo_metrics.jsonl", "config.yaml"):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "pipeline.json"
    done: dict[str, Any] = json.loads(record_path.read_text()) if resume and record_path.is_file() else {}
    stage_two = dpo.model_dump() if dpo is not None else None
    if resume and done and done.get("dpo") != stage_two:
        raise ValueError(f"--resume {out}: stage two's options differ from the ones this pipeline ran with "
                         f"({done.get('dpo')}); a resumed pipeline keeps them")
    distilling = distill.record() if distill is not None else None
    if resume and done and done.get("distill") != distilling:
        raise ValueError(f"--resume {out}: the distillation stage's options differ from the ones this pipeline ran "
                         f"with ({done.get('distill')}); a resumed pipeline keeps them")
    if not resume:
        (out / "config.yaml").write_text(cfg.to_yaml())  # --resume reads it back, as for a train run
    stages: list[dict[str, Any]] = list(done.get("stages", []))
    finished = {s["stage"] for s in stages}
    max_ctx = cfg.tiny.max_position_embeddings

    def save_record() -> None:
        tmp = record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"dpo": stage_two, "distill": distilling, "stages": stages}, indent=2))
        tmp.replace(record_path)  # a kill leaves the old record or the new, never half of one

    def record(stage: str, policy: Policy, seconds: float, extra: dict[str, Any] | None = None) -> Any:
        res = evaluate(cfg, policy, None, max_ctx)
        stages.append({"stage": stage, "held_out_pass_rate": res.pass_rate, "reward_mean": res.reward_mean,
                       "turns_mean": res.turns_mean, "episodes": res.episodes, "seconds": round(seconds, 1),
                       **(extra or {})})
        say(f"[{stage}] held-out pass rate {res.pass_rate:.3f} ({seconds:.0f}s)")
        save_record()
        return res

    def recorded(stage: str) -> Any:
        from agentrl.evaluation import EvalResult

        row = next(s for s in stages if s["stage"] == stage)
        say(f"[{stage}] finished before (held-out pass rate {row['held_out_pass_rate']:.3f}): not run again")
        return EvalResult(row["held_out_pass_rate"], row.get("reward_mean", float("nan")),
                          row.get("turns_mean", float("nan")), row.get("episodes", cfg.eval.episodes))

    if "sft" in finished and (out / "sft" / "config.json").is_file():
        policy, last = Policy.load(out / "sft"), recorded("sft")
    else:
        t0 = time.perf_counter()
        folder = warm_start(cfg.env.id, cfg.env.kwargs, cfg.tiny, cfg.sft, cfg.seed, say=say, **demo_context(cfg))
        shutil.copytree(folder, out / "sft", dirs_exist_ok=True)
        policy = Policy.load(out / "sft")
        last = record("sft", policy, time.perf_counter() - t0)
    current = out / "sft"

    if distill is not None:  # a stronger teacher's knowledge first (agentrl.stages.distill)
        model_dir = distill.model_dir(out / "distill")
        if distill.name in finished and (model_dir / "config.json").is_file():
            policy, last = Policy.load(model_dir), recorded(distill.name)
        else:
            t0 = time.perf_counter()
            extra = run_stage(cfg, distill, current, out / "distill", last, say)
            policy = Policy.load(model_dir)
            last = record(distill.name, policy, time.perf_counter() - t0, extra)
        current = model_dir
        if distill.stop_after:
            say(f"[{distill.name}] the pipeline stops after distillation (--stop-after-distill)")
            return {"stages": stages, "out": str(out)}

    if dpo is not None and dpo.loss in finished and (out / "dpo" / "config.json").is_file():
        policy, last, current = Policy.load(out / "dpo"), recorded(dpo.loss), out / "dpo"
        dpo = None
    elif dpo is not None and f"{dpo.loss} (skipped: no pairs)" in finished:
        dpo = None
    if dpo is not None:
        t0 = time.perf_counter()
        episodes = collect_groups(cfg, policy, dpo.groups, dpo.group_size, cfg.seed)
        pairs, counts = pairs_from_episodes(episodes, dpo.max_pairs_per_group, cfg.seed)
        say(f"[{dpo.loss}] {len(pairs)} pairs from {counts['groups']} groups ({counts['groups_without_pair']} all-pass "
            "or all-fail)")
        if not pairs:  # nothing to prefer: say so in the table and go on with the SFT policy
            stages.append({"stage": f"{dpo.loss} (skipped: no pairs)", "held_out_pass_rate": last.pass_rate,
                           "seconds": round(time.perf_counter() - t0, 1), "pairs": 0})
            save_record()
            dpo = None
    if dpo is not None:
        reference = copy.deepcopy(policy.model).eval().requires_grad_(False) if dpo.loss != "simpo" else None
        log = open(out / "dpo_metrics.jsonl", "w")  # noqa: SIM115
        try:
            metrics = train_preferences(policy.model, reference, pairs, policy.chat.pad_id, dpo, cfg.seed,
                                        log=lambda m: log.write(json.dumps(m) + "\n"))
        finally:
            log.close()
        policy.save(out / "dpo")
        (out / "dpo" / "dpo.json").write_text(json.dumps({**metrics, **counts, "config": dpo.model_dump()}, indent=2))
        last = record(dpo.loss, policy, time.perf_counter() - t0, {"pairs": len(pairs)})
        current = out / "dpo"

    if cfg.updates > 0 and f"rl ({cfg.algo})" in finished:
        say(f"[rl ({cfg.algo})] finished before: not run again")
    elif cfg.updates > 0:
        t0 = time.perf_counter()
        rl_cfg = TrainConfig(**{**cfg.model_dump(), "model": str(current), "out": str(out / "rl")})
        rl_resume = resume and (out / "rl" / "checkpoints").is_dir()
        summary = Trainer(rl_cfg, resume=rl_resume, overwrite=not rl_resume).train(warm=last)
        stages.append({"stage": f"rl ({cfg.algo})", "held_out_pass_rate": summary["final_pass_rate"],
                       "seconds": round(time.perf_counter() - t0, 1)})
        save_record()
    return {"stages": stages, "out": str(out)}
