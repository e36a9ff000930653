"""The tiny policy's warm start: built by SFT on the expert's demonstrations once per configuration and
cached, so that a second `agentrl train` skips it; with `--sft.noise auto`, the slip rate of the
demonstrations chosen by the warm start's own held-out pass rate (`choose_noise`).

The cache key hashes every part the weights depend on (`warm_start_parts`); `KEY_FILE`, beside the
weights, keeps the parts, so that a rebuild says what changed (`why_rebuild`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import agentrl.log as agentrl_log
from agentrl.config import TinyModelConfig
from agentrl.context import ContextConfig, get_policy
from agentrl.core import AgentEnv
from agentrl.policy import Policy, build_tiny_policy
from agentrl.registry import make
from agentrl.stages.sft import (
    NoExpertError,
    collect_demos,
    expert_pass_rate,
    expert_summary_texts,
    expert_texts,
    play_expert,
    progress_lines,
    sft,
)

LOG = logging.getLogger(__name__)


CALIBRATION_SEEDS = 30_000_000  # expert episodes for calibration start here: no demonstration or held-out seed


def calibrate_noise(env: AgentEnv, target: float, episodes: int = 48, steps: int = 8) -> tuple[float, float]:
    """(noise, the expert's pass rate there): the slip rate at which the expert passes about `target`
    of `episodes` fixed seeds, by bisection over [0, 1].

    The same seeds at every step (common random numbers), so the rate moves only with the noise.
    The expert's pass rate need not fall strictly with noise (a slip can be recovered from), so the
    result is the probed noise whose rate came closest to `target`. If even the noise-free expert
    passes less than `target`, that is the answer: 0.0, and its rate says how far short it falls.
    """
    seeds = range(CALIBRATION_SEEDS, CALIBRATION_SEEDS + episodes)
    tried = {0.0: expert_pass_rate(env, seeds, 0.0)}
    if tried[0.0] <= target:
        return 0.0, tried[0.0]
    tried[1.0] = expert_pass_rate(env, seeds, 1.0)
    lo, hi = 0.0, 1.0
    if tried[1.0] < target:
        for _ in range(steps):
            mid = round((lo + hi) / 2, 4)
            tried[mid] = expert_pass_rate(env, seeds, mid)
            lo, hi = (mid, hi) if tried[mid] > target else (lo, mid)
    noise = min(tried, key=lambda x: (abs(tried[x] - target), x))
    return noise, tried[noise]


CALIBRATION_HELD_OUT = 50_000_000  # the warm start's own calibration episodes: neither demonstrations nor held-out


def choose_noise(measure: Callable[[float], float], start: float, band: tuple[float, float], probes: int = 3,
                 episodes: int | None = None) -> tuple[float, dict[float, float], str]:
    """(noise, {noise probed: the warm start's pass rate there}, why): the slip rate for the warm start,
    judged by the warm start's own pass rate (`measure(noise)`, a whole SFT and a held-out evaluation).

    It starts at `start` (the default noise) and keeps it when the warm start lands inside `band`, so
    inside the band auto is the default. Below the band it halves the distance to noise 0 for at most
    `probes` SFTs in all (cleaner demonstrations are easier to imitate), and stops at the first warm
    start inside the band. Above the band it keeps the noise: a warm start near the ceiling already does
    what the expert does, and more noise only teaches the policy its slips (where slips are recoverable
    the expert still passes at a high slip rate, and a warm start trained there learns random moves:
    a 6x6 grid world's at noise 0.95 passed 0.30 where the default's passed 0.76). Nothing probed lands
    inside: the probe nearest the band; on a tie the default (a cleaner warm start that passes no more
    often is no reason to leave it), then the smaller noise.

    With `episodes` (how many held-out episodes each pass rate is measured on), a probe replaces the default
    only when it passed more often by over two standard errors of the difference: a pass rate over 64
    episodes is uncertain by about 0.05, and a default measured a hair below the band (Vault at one seed:
    9 of 64, then 24 of 128 held out) is no evidence that cleaner demonstrations are better.

    >>> choose_noise({0.35: 0.14, 0.175: 0.25}.get, 0.35, (0.15, 0.85), episodes=64)[0]  # 1.6 standard errors
    0.35
    >>> choose_noise({0.35: 0.125, 0.175: 0.48}.get, 0.35, (0.15, 0.85), episodes=64)[0]  # 4.8
    0.175

    >>> noise, tried, why = choose_noise(lambda n: round(0.8 - 2 * n, 2), 0.35, (0.15, 0.85))  # fatal slips
    >>> noise, tried
    (0.175, {0.35: 0.1, 0.175: 0.45})
    >>> choose_noise(lambda n: 0.05, 0.35, (0.15, 0.85))[:2]  # the policy learns nothing whatever the noise
    (0.35, {0.35: 0.05, 0.175: 0.05, 0.0: 0.05})
    """
    lo, hi = band
    tried: dict[float, float] = {}
    noise = start
    for _ in range(probes):
        tried[noise] = measure(noise)
        if tried[noise] >= lo or noise == 0.0:
            break
        noise = 0.0 if len(tried) == probes - 1 else round(noise / 2, 4)
    choices = {n: r for n, r in tried.items() if n == start or _reliably_above(r, tried[start], episodes)}
    inside = [n for n, r in choices.items() if lo <= r <= hi]
    if inside:
        noise = min(inside)
    else:
        noise = min(choices, key=lambda n: (max(lo - choices[n], choices[n] - hi), n != start, n))
    rate = tried[noise]
    if noise == start and lo <= rate <= hi:
        why = f"inside the useful band {lo:g}-{hi:g}, so the default slip rate stays"
    elif rate > hi:
        why = (f"above the band {lo:g}-{hi:g}; the noise stays (more slips would teach the policy to slip; see "
               "the ceiling warning for what to try)")
    elif lo <= rate:
        why = (f"the default's warm start passed {tried[start]:.2f}, below the band {lo:g}-{hi:g}: cleaner "
               "demonstrations")
    elif len(choices) < len(tried) and noise == start:
        others = ", ".join(f"{n:g}: {r:.2f}" for n, r in tried.items() if n != start)
        why = (f"the default's warm start passed {tried[start]:.2f}, below the band {lo:g}-{hi:g}, and no cleaner "
               f"one ({others}) passed more often by over two standard errors of {episodes} episodes: the default "
               "stays")
    else:
        why = (f"below the band {lo:g}-{hi:g} at every noise tried: the tiny policy does not learn this expert "
               "(more --sft.episodes or --sft.epochs, or a larger --tiny model)")
    return noise, tried, why


def _reliably_above(rate: float, base: float, episodes: int | None) -> bool:
    """`rate` > `base` by over two standard errors of the difference of two pass rates over `episodes` each
    (without `episodes`, the rates are taken as exact)."""
    if episodes is None:
        return True
    se = math.sqrt((rate * (1 - rate) + base * (1 - base)) / episodes)
    return rate - base > 2 * se


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


KEY_FILE = "warm_start_key.json"  # the key's parts, beside the weights: what a rebuild is explained from
FINGERPRINT_SEEDS = (40_000_000, 40_000_001, 40_000_002)
# SFTConfig fields that choose or skip a warm start rather than shape one
_NOT_IN_KEY = {"warm_start", "rebuild", "max_batch_tokens"}  # the last: summation order only
# SFTConfig fields that only noise auto reads: a probe at a fixed noise has the key `--sft.noise N` has
_AUTO_ONLY = {"useful_band", "calibration_episodes", "calibration_probes"}
AUTO_RULE = 2  # choose_noise's version, in the auto key: a warm start chosen by an older rule is rebuilt


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def expert_fingerprint(env: AgentEnv, noise: float) -> str | None:
    """A hash of the expert's episodes (observations, actions, rewards) on a few fixed seeds, noise-free,
    at `noise` and at noise 1 (every decision a slip, so a change to the slips shows even where a few
    seeds at `noise` happen not to slip): it changes when the demonstrations would, and not when, say,
    a helper function is added to the env's module. None if two plays of the same seeds differ (the
    expert draws from something other than `self.np_random`): such a fingerprint would rebuild on
    every run."""
    plays = [[play_expert(env, seed, n) for seed in FINGERPRINT_SEEDS for n in (0.0, noise, 1.0)] for _ in range(2)]
    return _sha(plays[0]) if plays[0] == plays[1] else None


def warm_start_parts(env: AgentEnv, env_id: str, env_kwargs: dict[str, Any], tiny: TinyModelConfig, sft_cfg: Any,
                     seed: int, context: ContextConfig | None = None, max_new_tokens: int = 0) -> dict[str, Any]:
    """What the warm start depends on, part by part (the key hashes them; `KEY_FILE` keeps them).

    The expert's behaviour is its fingerprint on a few seeds, or, if the env class sets
    `warm_start_version`, that version: an explicit promise that the demonstrations changed only
    when it did. An expert that is not reproducible from the env's seed falls back to the env
    class's source. A context policy that compacts (`compacting`) lays the demonstrations out
    differently, so it is a part too, with the expert's summaries where it asks for them; under
    truncate the key is the one it always was.
    """
    import inspect

    from agentrl import __version__

    noise = sft_cfg.noise if sft_cfg.noise != "auto" else 0.5
    version = getattr(env, "warm_start_version", None)
    if version is not None:
        expert = f"warm_start_version {version}"
    else:
        fp = expert_fingerprint(env, noise)
        if fp is not None:
            expert = f"fingerprint {fp}"
        else:
            try:
                source = _sha(inspect.getsource(type(env)))
                expert = f"class source {source} (the expert is not reproducible from its seed)"
            except (OSError, TypeError):
                expert = f"class {type(env).__qualname__} (the expert is not reproducible from its seed)"
    return {
        "agentrl": __version__,
        "env": env_id,
        "env_kwargs": env_kwargs,
        "prompt_and_tools": _sha([env.system_prompt, env.tool_schemas()]),
        "expert": expert,
        "tiny": tiny.model_dump(),
        "sft": sft_cfg.model_dump(exclude=_NOT_IN_KEY | (_AUTO_ONLY if sft_cfg.noise != "auto" else set())),
        "seed": seed,
        **({"auto_rule": AUTO_RULE} if sft_cfg.noise == "auto" else {}),
        **({"context": {**context.model_dump(), "max_new_tokens": max_new_tokens,
                        **({"summaries": _sha(expert_summary_texts(env, FINGERPRINT_SEEDS, noise, context.instruction))}
                           if get_policy(context.policy).asks_policy else {})}}
           if compacting(context) else {}),
    }


def compacting(context: ContextConfig | None) -> bool:
    """Does `context` change the demonstrations (a policy that compacts: not truncate)?"""
    return context is not None and get_policy(context.policy).compacts


def key_of(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def warm_start_key(env_id: str, env_kwargs: dict[str, Any], tiny: TinyModelConfig, sft_cfg: Any, seed: int,
                   context: ContextConfig | None = None, max_new_tokens: int = 0) -> str:
    """The cache key: changes with what changes the demonstrations or their training (`warm_start_parts`)."""
    return key_of(warm_start_parts(make(env_id, **env_kwargs), env_id, env_kwargs, tiny, sft_cfg, seed, context,
                                   max_new_tokens))


def why_rebuild(root: Path, parts: dict[str, Any]) -> str:
    """Why no cached warm start fits: the parts that differ from the newest cached one of the same env."""
    same_env = []
    for f in root.glob(f"*/{KEY_FILE}"):
        try:
            old = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if old.get("env") == parts["env"] and (f.parent / "warm_start.json").is_file():
            same_env.append((f.stat().st_mtime, f.parent.name, old))
    if not same_env:
        return f"no warm start of {parts['env']} is cached yet"
    _, name, old = max(same_env, key=lambda t: t[0])
    changed = [f"{k}: {_brief(old.get(k))} -> {_brief(v)}" for k, v in parts.items() if old.get(k) != v]
    return f"the cached one ({name}) differs in " + "; ".join(changed)


def _brief(v: Any) -> str:
    if isinstance(v, dict):  # show only the fields that matter to a reader, not whole configs
        return json.dumps(v, sort_keys=True, default=str)[:160]
    return str(v)


def warm_start(
    env_id: str,
    env_kwargs: dict[str, Any],
    tiny: TinyModelConfig,
    sft_cfg: Any,
    seed: int,
    log: Callable[[dict[str, Any]], None] | None = None,
    say: Callable[[str], None] | None = None,
    context: ContextConfig | None = None,
    max_new_tokens: int = 0,
) -> Path:
    """Build the tiny policy for `env_id` and fine-tune it on noisy-expert demonstrations, once.

    The result is an ordinary HF folder under the cache (`$AGENTRL_CACHE`, default
    ~/.cache/agentrl/warm/<key>); a second call with the same key returns it at once, and a
    rebuild says which part of the key changed. `sft_cfg.warm_start` names a folder to use as is;
    `sft_cfg.rebuild` rebuilds even when the key is cached. Without `log`, progress (loss, ETA)
    is said in lines. With a `context` policy that compacts (the run's `rollout.context`, and its
    sampling's `max_new_tokens`), the demonstrations are played under it, so a summarize run's warm
    start has learnt the expert's summaries.
    """
    say = say or agentrl_log.say(__name__)
    if sft_cfg.warm_start:
        given = Path(sft_cfg.warm_start).expanduser()
        if not (given / "config.json").is_file():
            raise FileNotFoundError(f"sft.warm_start: {given} is not a model folder (no config.json)")
        say(f"warm start: using {given} as given (sft.warm_start), without checking its key")
        return given
    env = make(env_id, **env_kwargs)
    from agentrl.checker import NO_EXPERT, has_expert

    if not has_expert(env):
        raise NoExpertError(f"{env_id}: {NO_EXPERT}")
    if not compacting(context):
        context = None  # truncate lays demonstrations out as no policy does: one key for both
    parts = warm_start_parts(env, env_id, env_kwargs, tiny, sft_cfg, seed, context, max_new_tokens)
    root = cache_root() / "warm"
    folder = root / key_of(parts)
    if (folder / "warm_start.json").is_file() and not sft_cfg.rebuild:
        say(f"warm start: cached at {folder}")
        return folder
    why = "sft.rebuild is set" if sft_cfg.rebuild else why_rebuild(root, parts)
    if sft_cfg.noise == "auto":
        return _auto_warm_start(env_id, env_kwargs, tiny, sft_cfg, seed, folder, parts, why, log, say, context,
                                max_new_tokens)
    say(f"warm start: building the tiny policy for {env_id} ({sft_cfg.episodes} demonstrations, {sft_cfg.epochs} "
        f"epochs) because {why}")
    torch.manual_seed(seed)
    noise = float(sft_cfg.noise)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    # tokenizer corpus: demonstrations from seeds the SFT set does not use
    corpus = expert_texts(env, range(10_000_000, 10_000_000 + 400), noise=max(noise, 0.3))
    if context is not None and get_policy(context.policy).asks_policy:
        corpus += expert_summary_texts(env, range(10_000_400, 10_000_600), max(noise, 0.3), context.instruction)
    build_tiny_policy(corpus, tmp, tiny, seed=seed)
    policy = Policy.load(tmp)
    demos = collect_demos(lambda: make(env_id, **env_kwargs), policy.chat,
                          list(range(20_000_000, 20_000_000 + sft_cfg.episodes)), noise, context=context,
                          max_context=tiny.max_position_embeddings if context is not None else None,
                          max_new_tokens=max_new_tokens)
    demo_rate = sum(d.passed for d in demos) / len(demos)
    # what the expert passes is not what the warm start will: the warm start's own pass rate is checked
    # before RL (warm_start_advice), and it is what --sft.noise auto calibrates on
    say(f"warm start: the expert (noise {noise:g}) passes {demo_rate:.2f} of its {len(demos)} demonstrations")
    # a warm start killed midway goes on after its last finished epoch on the next run (same key)
    metrics = sft(policy.model, demos, policy.chat.pad_id, epochs=sft_cfg.epochs, lr=sft_cfg.lr_for(pretrained=False),
                  batch_size=sft_cfg.batch_size, max_tokens=sft_cfg.max_batch_tokens, seed=seed,
                  log=log or progress_lines(say), resume_file=folder.with_name(folder.name + ".sft-epoch.pt"))
    metrics["demo_pass_rate"] = demo_rate
    metrics["noise"] = noise
    metrics["parameters"] = policy.num_parameters
    metrics["built_because"] = why
    policy.save(tmp)
    (tmp / KEY_FILE).write_text(json.dumps(parts, indent=2, default=str))
    (tmp / "warm_start.json").write_text(json.dumps(metrics, indent=2))
    if folder.exists():  # another process finished first (or a rebuild): keep one copy
        import shutil

        if sft_cfg.rebuild:
            shutil.rmtree(folder, ignore_errors=True)
            tmp.replace(folder)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(folder)
    say(f"warm start: {metrics['parameters']:,} parameters, SFT loss {metrics['sft/loss']:.3f} in "
        f"{metrics['sft/seconds']:.0f}s, saved to {folder}")
    return folder


def warm_start_pass_rate(folder: Path, env_id: str, env_kwargs: dict[str, Any], tiny: TinyModelConfig, seed: int,
                         episodes: int, context: ContextConfig | None = None, max_new_tokens: int = 0) -> float:
    """The warm start's own pass rate on `episodes` calibration seeds (from `CALIBRATION_HELD_OUT`),
    sampled as the run's held-out evaluation is (under the run's context policy, where one compacts)."""
    from agentrl.config import TrainConfig
    from agentrl.evaluation import evaluate

    rollout = {"context": context.model_dump(), "sampling": {"max_new_tokens": max_new_tokens}} if context else {}
    cfg = TrainConfig(env={"id": env_id, "kwargs": env_kwargs}, tiny=tiny, seed=seed, rollout=rollout,
                      eval={"episodes": episodes, "seed_offset": CALIBRATION_HELD_OUT})
    return evaluate(cfg, Policy.load(folder), None, tiny.max_position_embeddings, say=lambda _: None).pass_rate


def _auto_warm_start(env_id: str, env_kwargs: dict[str, Any], tiny: TinyModelConfig, sft_cfg: Any, seed: int,
                     folder: Path, parts: dict[str, Any], why: str, log: Callable[[dict[str, Any]], None] | None,
                     say: Callable[[str], None], context: ContextConfig | None = None,
                     max_new_tokens: int = 0) -> Path:
    """--sft.noise auto: warm starts at the noises `choose_noise` probes (each cached as `--sft.noise N`
    would be), judged by their own pass rate; the chosen one is copied under the auto key."""
    import shutil

    start = type(sft_cfg).model_fields["noise"].default
    episodes, band = sft_cfg.calibration_episodes, tuple(sft_cfg.useful_band)
    say(f"warm start: noise auto for {env_id} because {why}: the warm start at noise {start:g}, judged by its own "
        f"pass rate over {episodes} calibration episodes (useful band {band[0]:g}-{band[1]:g})")
    built: dict[float, Path] = {}

    def measure(noise: float) -> float:
        built[noise] = warm_start(env_id, env_kwargs, tiny, sft_cfg.model_copy(update={"noise": noise}), seed,
                                  log=log, say=say, context=context, max_new_tokens=max_new_tokens)
        rate = warm_start_pass_rate(built[noise], env_id, env_kwargs, tiny, seed, episodes, context, max_new_tokens)
        say(f"warm start: noise {noise:g} -> the warm start passes {rate:.2f} of {episodes} calibration episodes")
        return rate

    t0 = time.perf_counter()
    noise, tried, reason = choose_noise(measure, start, band, sft_cfg.calibration_probes, episodes)
    probes = ", ".join(f"{n:g}: {r:.2f}" for n, r in tried.items())
    say(f"warm start: noise auto -> {noise:g}: its warm start passes {tried[noise]:.2f} of {episodes} calibration "
        f"episodes, {reason} (tried {probes}; {time.perf_counter() - t0:.0f}s)")
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(built[noise], tmp)
    metrics = json.loads((tmp / "warm_start.json").read_text())
    metrics["noise_auto"] = {"noise": noise, "calibration_pass_rate": tried[noise], "calibration_episodes": episodes,
                             "tried": {str(n): r for n, r in tried.items()}, "useful_band": list(band),
                             "why": reason}
    (tmp / "warm_start.json").write_text(json.dumps(metrics, indent=2))
    (tmp / KEY_FILE).write_text(json.dumps(parts, indent=2, default=str))
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    return folder


def warm_start_from_data(data: str | Path, tiny: TinyModelConfig, sft_cfg: Any, seed: int,
                         say: Callable[[str], None] | None = None) -> Path:
    """The tiny policy built from a file of demonstrations (OpenAI-format conversations, `agentrl.stages.data`) and
    fine-tuned on them, once: for an agent trained through the gateway, whose demonstrations are its own logged
    conversations rather than an env's scripted expert. Cached under a key of the file's bytes and the settings."""
    from agentrl.stages.data import load_conversations, to_episode
    from agentrl.stages.sft import tiny_policy_from_conversations

    say = say or agentrl_log.say(__name__)
    if sft_cfg.warm_start:
        return warm_start("", {}, tiny, sft_cfg, seed, say=say)
    path = Path(data)
    if not path.is_file():
        raise FileNotFoundError(f"agent.demos: no file {path}")
    parts = {"data_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "tiny": tiny.model_dump(),
             "epochs": sft_cfg.epochs, "lr": sft_cfg.lr_for(pretrained=False), "batch_size": sft_cfg.batch_size,
             "seed": seed}
    root = cache_root() / "warm"
    folder = root / key_of(parts)
    if (folder / "warm_start.json").is_file() and not sft_cfg.rebuild:
        say(f"warm start: cached at {folder}")
        return folder
    convs = [c for _, c in load_conversations(path)]
    say(f"warm start: building the tiny policy from the {len(convs)} demonstrations in {path} ({sft_cfg.epochs} "
        "epochs)")
    torch.manual_seed(seed)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    policy = tiny_policy_from_conversations(convs, tmp, tiny, seed=seed)
    demos = [to_episode(c, policy.chat, group_id=n) for n, c in enumerate(convs)]
    metrics = sft(policy.model, demos, policy.chat.pad_id, epochs=sft_cfg.epochs, lr=sft_cfg.lr_for(pretrained=False),
                  batch_size=sft_cfg.batch_size, max_tokens=sft_cfg.max_batch_tokens, seed=seed,
                  log=progress_lines(say))
    metrics.update({"demonstrations": len(demos), "demo_pass_rate": sum(d.passed for d in demos) / len(demos),
                    "data": str(path), "parameters": policy.num_parameters})
    policy.save(tmp)
    (tmp / KEY_FILE).write_text(json.dumps(parts, indent=2, default=str))
    (tmp / "warm_start.json").write_text(json.dumps(metrics, indent=2))
    if folder.exists():
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    say(f"warm start: {policy.num_parameters:,} parameters, SFT loss {metrics['sft/loss']:.3f} in "
        f"{metrics['sft/seconds']:.0f}s, saved to {folder}")
    return folder
