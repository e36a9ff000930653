"""Stage one: supervised fine-tuning on demonstrations, loss on the action tokens only.

Demonstrations come from an environment's scripted expert, played through the same rollout code
as the policy (`ScriptedEngine`), so they are laid out token for token as the policy's own
episodes will be. The tiny policy's cached warm start, built from these, is
`agentrl.stages.warm_start`.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import agentrl.log as agentrl_log
from agentrl.chat.layout import ChatFormat
from agentrl.config import TinyModelConfig
from agentrl.context import ContextConfig, after_summary, get_policy
from agentrl.core import AgentEnv, Episode
from agentrl.engines.base import ScriptedEngine
from agentrl.log import duration
from agentrl.memory import MemoryWatch
from agentrl.policy import (
    MIN_SHARED_HEAD,
    Policy,
    adamw,
    build_tiny_policy,
    pass_tokens,
    render_corpus_text,
    token_stats,
)
from agentrl.rollout import rollout
from agentrl.store import make_batch, segment_batch

LOG = logging.getLogger(__name__)


class NoExpertError(ValueError):
    """The environment has no scripted expert, so the tiny policy has no demonstrations to learn from."""


def play_expert(env: AgentEnv, seed: int, noise: float) -> tuple[list[tuple[str, str]], float]:
    """One expert episode: the (role, text) messages from the task on, and the final reward."""
    obs, _ = env.reset(seed=seed)
    msgs = [("user", obs)]
    reward = 0.0
    while True:
        action = env.expert_action(noise)
        obs, reward, terminated, truncated, _ = env.step(action)
        msgs += [("assistant", action), ("tool", obs)]
        if terminated or truncated:
            return msgs, float(reward)


def expert_texts(env: AgentEnv, seeds: Sequence[int], noise: float) -> list[str]:
    """Whole expert conversations as text (what the tiny tokenizer is trained on)."""
    return [render_corpus_text(env.system_prompt, env.tool_schemas(), play_expert(env, seed, noise)[0])
            for seed in seeds]


def expert_pass_rate(env: AgentEnv, seeds: Sequence[int], noise: float) -> float:
    """The fraction of the expert's episodes at `noise` that pass (reward >= 1, as `Episode.passed`)."""
    return sum(play_expert(env, s, noise)[1] >= 1.0 for s in seeds) / len(seeds)


def expert_summary(env: AgentEnv, noise: float) -> str:
    """The expert's answer when rollout.context summarize asks for a summary (`expert_summary(noise)`, an env's
    optional hook beside `expert_action`)."""
    try:
        return env.expert_summary(noise)
    except NotImplementedError:
        raise NoExpertError(f"{env.name}: the rollout asked the expert for a summary (rollout.context summarize), and "
                            "this env's expert writes none: implement expert_summary(noise), or warm-start without "
                            "summarize") from None


def expert_summary_texts(env: AgentEnv, seeds: Sequence[int], noise: float, instruction: str) -> list[str]:
    """Expert conversations cut by a summary halfway, as text, two per seed: the conversation up to the
    instruction and the expert's summary, and the one that goes on from the task and the summary
    (`agentrl.context.after_summary`). The tiny tokenizer learns from them too when the demonstrations
    summarise, so that the instruction and a summary cost a few tokens, not one per character."""
    texts = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        msgs = [("user", obs)]
        for turn in range(env.max_turns):
            if turn == env.max_turns // 2:
                summary = expert_summary(env, noise)
                texts.append(render_corpus_text(env.system_prompt, env.tool_schemas(),
                                                msgs + [("user", instruction), ("assistant", summary)]))
                msgs = [("user", after_summary([{"role": "user", "content": msgs[0][1]}], summary)[-1]["content"])]
            action = env.expert_action(noise)
            obs, _, terminated, truncated, _ = env.step(action)
            msgs += [("assistant", action), ("tool", obs)]
            if terminated or truncated:
                break
        texts.append(render_corpus_text(env.system_prompt, env.tool_schemas(), msgs))
    return texts


def collect_demos(make_env: Callable[[], AgentEnv], chat: ChatFormat, seeds: Sequence[int], noise: float,
                  batch: int = 64, context: ContextConfig | None = None, max_context: int | None = None,
                  max_new_tokens: int = 0) -> list[Episode]:
    """Expert episodes, tokenised exactly as the policy's rollouts are. With a `context` policy (and the
    `max_context` and `max_new_tokens` the run will have), the demonstrations are compacted as the run's episodes
    will be; under summarize the expert answers each request for a summary with its own (`expert_summary`), so
    that the summary turns are demonstrations too."""
    demos: list[Episode] = []
    envs = [make_env() for _ in range(min(batch, len(seeds)))]
    asks = context is not None and get_policy(context.policy).asks_policy
    active: list[AgentEnv] = []

    def act(row: int) -> list[int]:
        # the instruction arrives as the text the row was last given: the expert summarises, else it acts
        if asks and context.instruction in chat.decode(engine.given(row)):
            return chat.action_ids(expert_summary(active[row], noise))
        # the expert writes Hermes calls; the demonstrations are in the model's own call format
        return chat.action_ids(chat.expert_text(active[row].expert_action(noise)))

    engine = ScriptedEngine(act, chat.eos_id)
    for start in range(0, len(seeds), len(envs)):
        chunk = list(seeds[start : start + len(envs)])
        active[:] = envs[: len(chunk)]
        episodes, _ = rollout(list(active), chunk, engine, chat, max_context=max_context,
                              max_new_tokens=max_new_tokens, context=context)
        errored = [e for e in episodes if e.error]
        if errored:
            raise RuntimeError(f"the expert's episode raised: {errored[0].error}")
        demos += episodes
    return demos


def sft_loss(logp: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Token-mean negative log-likelihood of the action tokens (`logp[:, t]` scores token t, as `token_stats`
    gives it); prompt and observation tokens are not targets."""
    return -(logp * action_mask).sum() / action_mask.sum().clamp(min=1)


def sft(
    model: torch.nn.Module,
    demos: Sequence[Episode],
    pad_id: int,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int = 0,
    log: Callable[[dict[str, Any]], None] | None = None,
    resume_file: str | Path | None = None,
    max_tokens: int | None = None,
) -> dict[str, float]:
    """Cross-entropy on action tokens (observation and prompt tokens masked), AdamW, linear decay.

    A batch runs as micro-batches of similar-length rows of at most `max_tokens` padded tokens each (None:
    `pass_tokens(model)`, what fits a fixed activation budget; `sft.max_batch_tokens`), their gradients summed into
    the batch's: the same step, with memory bounded by the micro-batch. Without it, eight 2,400-token BFCL
    demonstrations held ~24 GB of SmolLM2's activations at once.

    With `resume_file`, the state after every epoch (weights, optimizer, schedule, the shuffle's RNG)
    is written there atomically, and a run that finds one goes on after its epoch: a killed SFT loses
    at most the epoch under way and ends with the weights of one left alone (CPU). The file is removed
    when SFT ends."""
    if not demos:
        raise ValueError("sft: no demonstrations")
    max_tokens = max_tokens or pass_tokens(model)
    model.train()
    device = next(model.parameters()).device
    opt = adamw(model.parameters(), lr=lr)
    steps = epochs * math.ceil(len(demos) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / steps))
    rng = random.Random(seed)
    order = list(range(len(demos)))
    step, t0, tokens = 0, time.perf_counter(), 0
    loss_ema = None
    first = 0
    resume_path = Path(resume_file) if resume_file is not None else None
    if resume_path is not None and resume_path.is_file():
        state = torch.load(resume_path, map_location=device, weights_only=False)  # our own file, beside the cache
        if state["epochs"] == epochs and state["demos"] == len(demos):
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            rng.setstate(state["rng"])
            order, first, step, loss_ema, tokens = state["order"], state["epoch"] + 1, state["step"], state["loss"], 0
            LOG.info("sft: resuming after epoch %d of %d (%s)", first, epochs, resume_path)
    skipped = step  # steps a resumed run does not run again: its rate and ETA count only the ones it runs
    memory = MemoryWatch("sft.max_batch_tokens", say=LOG.warning)
    for epoch in range(first, epochs):
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            # one row per segment where a chat template rewrote the history (agentrl.store.segment_batch)
            b = segment_batch(make_batch([demos[j] for j in order[i : i + batch_size]], pad_id))
            targets = b.action_mask.sum().clamp(min=1)  # the batch's token mean, whatever its micro-batches
            opt.zero_grad(set_to_none=True)
            loss = 0.0
            for rows in b.micro_batches(max_tokens, by_prompt=True):
                m = b.select(rows).trim().to(device)
                # the output layer only where an action token is predicted, and demos that begin with the same
                # prompt (an env's system prompt and tools) run it once: on SmolLM2, most of the step's logits and
                # a third of its layers' tokens
                ts = token_stats(model, m.input_ids, m.attention_mask, only=m.action_mask, share_heads=MIN_SHARED_HEAD)
                part = -(ts.logp * m.action_mask).sum() / targets  # this part's share of the batch's mean
                part.backward()
                loss += part.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            tokens += int(b.attention_mask.sum())
            loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
            memory()
            if log is not None:
                elapsed = time.perf_counter() - t0
                log({"sft/step": step, "sft/steps": steps, "sft/epoch": epoch, "sft/loss": loss_ema,
                     "sft/elapsed_s": elapsed, "sft/steps_per_s": (step - skipped) / max(elapsed, 1e-9),
                     "sft/eta_s": elapsed / (step - skipped) * (steps - step)})
        if resume_path is not None and epoch + 1 < epochs:
            tmp = resume_path.with_name(resume_path.name + f".tmp{os.getpid()}")
            torch.save({"epochs": epochs, "demos": len(demos), "epoch": epoch, "step": step, "loss": loss_ema,
                        "model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "rng": rng.getstate(), "order": list(order)}, tmp)
            os.replace(tmp, resume_path)  # the old epoch's state or the new one, never half of either
    if resume_path is not None:
        resume_path.unlink(missing_ok=True)
    model.eval()
    secs = time.perf_counter() - t0
    return {"sft/loss": float(loss_ema or 0.0), "sft/steps": step, "sft/seconds": secs,
            "sft/tokens_per_s": tokens / secs}


def progress_lines(say: Callable[[str], None] | None = None, every: float = 0.1) -> Callable[[dict[str, Any]], None]:
    """An `sft(log=...)` callback that says the loss, the rate and the ETA about every `every` of the run; its
    first line (the first step, or a resumed SFT's first) says the ETA is an estimate from that step's time."""
    say = say or agentrl_log.say(__name__)
    first: list[int | None] = [None]  # a resumed SFT's first step is said too, wherever it falls

    def log(m: dict[str, Any]) -> None:
        step, steps = m["sft/step"], m["sft/steps"]
        stride = max(1, round(steps * every))
        if step == 1 or step % stride == 0 or step == steps or first[0] is None:
            estimate = " (an estimate from this step's time)" if first[0] is None and step < steps else ""
            first[0] = step if first[0] is None else first[0]
            say(f"  sft step {step}/{steps}  loss {m['sft/loss']:.4f}  {m['sft/steps_per_s']:.1f} "
                f"steps/s  ETA {duration(m['sft/eta_s'])}{estimate}")

    return log


def tiny_policy_from_conversations(convs: Sequence[Any], out: str | Path, tiny: TinyModelConfig,
                                   seed: int = 0) -> Policy:
    """The tiny policy with a tokenizer trained on these conversations (`agentrl.stages.data.Conversation`),
    for demonstrations of an env without a scripted expert: the same build the warm start does, on
    the demonstrations' own text."""
    corpus = [render_corpus_text(c.system, c.tools or [], [(m.role, m.content) for m in c.messages]) for c in convs]
    build_tiny_policy(corpus, out, tiny, seed=seed)
    return Policy.load(out)
