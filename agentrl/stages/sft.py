"""Stage one: supervised fine-tuning on demonstrations, loss on the action tokens only.

Demonstrations come from an environment's scripted expert, played through the same rollout code
as the policy (`ScriptedEngine`), so they are laid out token for token as the policy's own
episodes will be. `warm_start` builds the tiny policy and fine-tunes it once per configuration,
caching the result, so that a second `agentrl train` skips it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.core import AgentEnv, Episode, make
from agentrl.engines.base import ScriptedEngine
from agentrl.policy import (
    ChatFormat,
    Policy,
    TinyModelConfig,
    build_tiny_policy,
    position_ids_from_mask,
    render_corpus_text,
)
from agentrl.rollout import rollout
from agentrl.store import make_batch


def expert_texts(env: AgentEnv, seeds: Sequence[int], noise: float) -> list[str]:
    """Whole expert conversations as text (what the tiny tokenizer is trained on)."""
    texts = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        msgs = [("user", obs)]
        while True:
            action = env.expert_action(noise)
            obs, _, terminated, truncated, _ = env.step(action)
            msgs += [("assistant", action), ("tool", obs)]
            if terminated or truncated:
                break
        texts.append(render_corpus_text(env.system_prompt, env.tool_schemas(), msgs))
    return texts


def collect_demos(make_env: Callable[[], AgentEnv], chat: ChatFormat, seeds: Sequence[int], noise: float, batch: int = 64) -> list[Episode]:
    """Expert episodes, tokenised exactly as the policy's rollouts are."""
    demos: list[Episode] = []
    envs = [make_env() for _ in range(min(batch, len(seeds)))]
    for start in range(0, len(seeds), len(envs)):
        chunk = list(seeds[start : start + len(envs)])
        active = envs[: len(chunk)]
        engine = ScriptedEngine(lambda row, envs=active: chat.action_ids(envs[row].expert_action(noise)), chat.eos_id)
        episodes, _ = rollout(active, chunk, engine, chat)
        errored = [e for e in episodes if e.error]
        if errored:
            raise RuntimeError(f"the expert's episode raised: {errored[0].error}")
        demos += episodes
    return demos


def sft_loss(logits: torch.Tensor, input_ids: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy of the action tokens; prompt and observation tokens are not targets."""
    logits = logits[:, :-1].float()  # (B, T-1, V): position t predicts token t+1
    mask = action_mask[:, 1:]  # (B, T-1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1), reduction="none")
    return (ce * mask.reshape(-1)).sum() / mask.sum().clamp(min=1)


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
) -> dict[str, float]:
    """Cross-entropy on action tokens (observation and prompt tokens masked), AdamW, linear decay."""
    if not demos:
        raise ValueError("sft: no demonstrations")
    model.train()
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    steps = epochs * math.ceil(len(demos) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / steps))
    rng = random.Random(seed)
    order = list(range(len(demos)))
    step, t0, tokens = 0, time.perf_counter(), 0
    loss_ema = None
    for epoch in range(epochs):
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            b = make_batch([demos[j] for j in order[i : i + batch_size]], pad_id).to(device)
            out = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=position_ids_from_mask(b.attention_mask), use_cache=False)
            loss = sft_loss(out.logits, b.input_ids, b.action_mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            tokens += int(b.attention_mask.sum())
            loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
            if log is not None:
                log({"sft/step": step, "sft/steps": steps, "sft/epoch": epoch, "sft/loss": loss_ema})
    model.eval()
    secs = time.perf_counter() - t0
    return {"sft/loss": float(loss_ema or 0.0), "sft/steps": step, "sft/seconds": secs, "sft/tokens_per_s": tokens / secs}


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def warm_start_key(env_id: str, env_kwargs: dict[str, Any], tiny: TinyModelConfig, sft_cfg: Any, seed: int) -> str:
    """Changes with anything that changes the warm start: configs, agentrl, the env's own code."""
    import inspect

    from agentrl import __version__

    env_cls = type(make(env_id, **env_kwargs))
    try:
        env_src = hashlib.sha256(inspect.getsource(inspect.getmodule(env_cls)).encode()).hexdigest()
    except (OSError, TypeError):
        env_src = env_cls.__qualname__
    blob = json.dumps(
        {"v": __version__, "env": env_id, "kw": env_kwargs, "src": env_src, "tiny": tiny.model_dump(), "sft": sft_cfg.model_dump(), "seed": seed},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warm_start(
    env_id: str,
    env_kwargs: dict[str, Any],
    tiny: TinyModelConfig,
    sft_cfg: Any,
    seed: int,
    log: Callable[[dict[str, Any]], None] | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """Build the tiny policy for `env_id` and fine-tune it on noisy-expert demonstrations, once.

    The result is an ordinary HF folder under the cache (`$AGENTRL_CACHE`, default
    ~/.cache/agentrl/warm/<key>); a second call with the same configuration returns it at once.
    """
    folder = cache_root() / "warm" / warm_start_key(env_id, env_kwargs, tiny, sft_cfg, seed)
    if (folder / "warm_start.json").is_file():
        say(f"warm start: cached at {folder}")
        return folder
    torch.manual_seed(seed)
    env = make(env_id, **env_kwargs)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    say(f"warm start: building the tiny policy for {env_id} ({sft_cfg.episodes} demonstrations, {sft_cfg.epochs} epochs)")
    # tokenizer corpus: demonstrations from seeds the SFT set does not use
    corpus = expert_texts(env, range(10_000_000, 10_000_000 + 400), noise=max(sft_cfg.noise, 0.3))
    build_tiny_policy(corpus, tmp, tiny, seed=seed)
    policy = Policy.load(tmp)
    demos = collect_demos(lambda: make(env_id, **env_kwargs), policy.chat, list(range(20_000_000, 20_000_000 + sft_cfg.episodes)), sft_cfg.noise)
    metrics = sft(policy.model, demos, policy.chat.pad_id, epochs=sft_cfg.epochs, lr=sft_cfg.lr_for(pretrained=False),
                  batch_size=sft_cfg.batch_size, seed=seed, log=log)
    metrics["demo_pass_rate"] = sum(d.passed for d in demos) / len(demos)
    metrics["parameters"] = policy.num_parameters
    policy.save(tmp)
    (tmp / "warm_start.json").write_text(json.dumps(metrics, indent=2))
    if folder.exists():  # another process finished first; keep its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(folder)
    say(f"warm start: {metrics['parameters']:,} parameters, SFT loss {metrics['sft/loss']:.3f} in {metrics['sft/seconds']:.0f}s, saved to {folder}")
    return folder
