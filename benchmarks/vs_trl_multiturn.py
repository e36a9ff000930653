"""One multi-turn GRPO update end to end: agentrl's `Trainer` against TRL's `GRPOTrainer(environment_factory=...)`.

    pip install -e ".[bench]"                      # TRL (pinned, 1.16.0) and its datasets dependency
    python benchmarks/vs_trl_multiturn.py          # SFT warm start (cached), then 1 warm-up + 5 timed updates each
    python benchmarks/vs_trl_multiturn.py --quick  # smaller SFT and group, 2 timed updates: a smoke run (< 5 min)

The task: `agentrl.make("agentrl/Vault-v0", locks=8)`: read lock k's clue, open it with the sum, eight times in
order; 2 x 8 + 1 = 17 turns of budget. Each side runs its own real multi-turn loop:

- agentrl: `agentrl.trainer.Trainer.train()` with `env.id = agentrl/Vault-v0, locks=8`: the torch engine keeps
  every episode's KV cache across turns and feeds only each turn's new observation tokens.
- TRL 1.16: `GRPOTrainer(environment_factory=VaultTools)`, its documented multi-turn loop (`_tool_call_loop`):
  `VaultTools` wraps the very same `VaultEnv` (its `clue` and `open` methods are TRL's tools, `reset` takes the
  dataset row's seed and returns the task text, `get_reward` is the env's verifier). After every turn TRL calls
  `model.generate()` again on each live episode's whole concatenated history (prompt + completion + tool results
  so far), so the history is prefilled again each turn.

What TRL 1.16 cannot do with this task's tiny model, measured in the same run (printed, and recorded in the JSON
as `trl_on_tiny_template`): the tiny policy's folder (`agentrl.policy.build_tiny_policy`) ships agentrl's compact
ChatML template, which lists each tool in one line and renders an assistant message as its text (the action text
is the `<tool_call>...</tool_call>` itself). TRL's `GRPOTrainer(environment_factory=...)` refuses it at
construction:

    ValueError: The provided chat template does not support tool calling. The template must be able to render a
    full tool-calling conversation (user -> assistant with tool_calls -> tool).

(`trl.chat_template_utils.supports_tool_calling` renders an assistant message with a structured `tool_calls` field
and the template drops it.) Even with that check passed, TRL parses tool calls only for the chat templates it
knows by their exact text (`add_response_schema`: "Unrecognized chat template, failed to add response schema").

So the comparison runs on the closest thing TRL can run: the same tiny Llama (the sizes below), a BPE vocabulary
trained the same way on the same expert conversations, under the one template TRL recognises whose tool-call
convention is the one the tiny template imitates: Qwen2.5's (TRL's own copy, `qwen2_5_chat_template`:
`<tool_call>{json}</tool_call>`, tool results as a user turn in `<tool_response>`, tool JSON schemas in the system
prompt). Both sides load that one folder. TRL's loop also ends an episode only when a completion carries no
parseable tool call (or at `max_tool_calling_iterations` / `max_completion_length`), so an untrained policy, which
never writes a valid call, would run one turn under TRL and all 17 under agentrl (whose env answers a malformed
call with an error observation and the episode goes on). The folder is therefore warm-started by SFT on the env's
scripted expert (`agentrl.stages.sft.collect_demos` + `sft`, laid out by this same template), so that the policy
calls the tools and both loops run many turns; the turns each side actually generated are measured and printed.

What TRL's loop could not do that agentrl's does (all visible in the figures): the environment cannot end an
episode (no `terminated`: once the vault is open TRL keeps going while the model keeps calling tools, up to
`max_tool_calling_iterations = 16`, i.e. the same 17-turn budget); a malformed tool call ends the episode instead of
being answered with an error the policy can learn from; tool results are fed back without the `<|im_end|>` that
the template writes after an assistant message when generation stopped at `</tool_call>` (TRL's suffix assumes
the completion ended with EOS); and every turn re-encodes the whole history.

Timing is `benchmarks/vs_trl.py`'s: the two trainers run in two threads that take turns, one update each, so that
both see the same load; an update is timed from the moment its side gets the turn to the moment its update ends;
the first update of each side is a warm-up (agentrl's evaluation before training too). Seconds per update is the
median of the timed updates; `ratio` = TRL s/update / agentrl s/update. Since the two sides' policies sample their
own turns, `ratio_per_turn` divides each side's seconds by the turns it generated (the like-for-like figure when
the turn counts differ).

Same algorithm settings as `vs_trl.py`: G = group size, lr 2e-4, clip eps 0.2, token-mean loss (TRL `dapo`),
std-normalised group advantages, beta = kl_coef (both compute reference log-probs), max grad norm 1.0, one epoch,
one minibatch, fp32, no activation checkpointing on TRL, silent consoles. Both stop generating at `<|im_end|>`
and `</tool_call>` (written into `generation_config.json`, which TRL reads).

The last line printed is one JSON object with the figures (`ratio` among them); it is also written to
`benchmarks/results/vs_trl_multiturn.json`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for p in (HERE.parent, HERE):  # the repository (for `examples`) and benchmarks/ (for vs_trl's turn-taking)
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental in TRL 1.16

import torch  # noqa: E402
from vs_trl import CLIP_EPS, LR, Turns, take_turns  # noqa: E402

from agentrl.policy import TINY_CHAT_TEMPLATE, ChatFormat, TinyModelConfig, build_tiny_policy  # noqa: E402
from agentrl.registry import make  # noqa: E402
from agentrl.stages.sft import collect_demos, expert_texts, play_expert, sft  # noqa: E402

ENV_ID = "agentrl/Vault-v0"
LOCKS = 8
# vs_trl.py's model, with room for 17 turns after Qwen2.5's long tool preamble
MODEL = TinyModelConfig(hidden_size=128, intermediate_size=416, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=2048, vocab_size=1024)
RESULT = HERE / "results" / "vs_trl_multiturn.json"


def vault():
    return make(ENV_ID, locks=LOCKS)


def qwen_template() -> str:
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def build_model(folder: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The tiny policy under Qwen2.5's template, its tokenizer trained on expert conversations rendered by that
    template, warm-started by SFT on the expert's demonstrations; both stop tokens in its generation config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from agentrl.policy import build_tokenizer

    env = vault()
    # a throwaway tokenizer only renders the conversations; the real one is trained on that text
    render = build_tokenizer(expert_texts(env, range(20), noise=0.3), 256)
    render.chat_template = qwen_template()
    corpus = []
    for seed in range(300):
        msgs = [{"role": "system", "content": env.system_prompt}]
        for role, text in play_expert(env, seed, noise=0.3)[0]:
            msgs.append({"role": role, "content": text})
        corpus.append(render.apply_chat_template(msgs, tools=env.tool_schemas(), tokenize=False))
    build_tiny_policy(corpus, folder, MODEL, seed=args.seed)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = qwen_template()
    tokenizer.save_pretrained(folder)
    chat = ChatFormat(tokenizer)

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    demos = collect_demos(vault, chat, range(10_000, 10_000 + args.demos), noise=args.sft_noise)
    t0 = time.perf_counter()
    stats = sft(model, demos, chat.pad_id, epochs=args.sft_epochs, lr=3e-3, batch_size=16, seed=args.seed)
    stats["sft/wall_s"] = time.perf_counter() - t0
    model.save_pretrained(folder)
    gen = GenerationConfig.from_pretrained(folder)
    gen.eos_token_id = list(chat.stop_ids)
    gen.pad_token_id = chat.pad_id
    gen.save_pretrained(folder)
    return folder, {k: round(float(v), 3) for k, v in stats.items()}


def cached_model(work: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """`build_model`, cached by what changes it (the SFT is the slow part), under $AGENTRL_CACHE."""
    import hashlib
    import shutil

    from agentrl.stages.warm_start import cache_root

    parts = {"model": MODEL.model_dump(), "locks": LOCKS, "demos": args.demos, "epochs": args.sft_epochs,
             "noise": args.sft_noise, "seed": args.seed,
             "template": hashlib.sha256(qwen_template().encode()).hexdigest()}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_root() / "vs_trl_multiturn" / key
    if (folder / "sft.json").exists():
        return folder, {**json.loads((folder / "sft.json").read_text()), "cached": True}
    built, stats = build_model(work / "model", args)
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built, folder, dirs_exist_ok=True)
    (folder / "sft.json").write_text(json.dumps(stats))  # written last: a folder without it is incomplete
    return folder, {**stats, "cached": False}


class VaultTools:
    """TRL's environment: the same `VaultEnv`, its tools exposed as methods (TRL reads their signatures and
    Google-style docstrings), `reset` taking the dataset row's seed, the env's verifier as `get_reward`."""

    def __init__(self):
        self.env = vault()
        self.tool_calls = 0

    def reset(self, seed: int, **_: Any) -> str:
        obs, _ = self.env.reset(seed=int(seed))
        self.tool_calls = 0
        return obs

    def clue(self, lock: int) -> str:
        """Read the clue of a lock.

        Args:
            lock: the lock
        """
        self.tool_calls += 1
        return self.env.clue(lock)

    def open(self, lock: int, code: int) -> str:
        """Open a lock with its code.

        Args:
            lock: the lock
            code: the code
        """
        self.tool_calls += 1
        return self.env.open(lock, code)

    def get_reward(self) -> float:
        return self.env.verify()


def trl_config(out: Path, args: argparse.Namespace, episodes: int, updates: int) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out), num_generations=args.group_size, per_device_train_batch_size=episodes,
        gradient_accumulation_steps=1,
        # the whole episode's budget (TRL counts tool results in it): 17 turns of an action and an observation
        max_completion_length=(2 * LOCKS + 1) * (args.max_new_tokens + 32),
        max_tool_calling_iterations=2 * LOCKS,  # 1 + 16 = the env's 17-turn budget
        num_iterations=1, temperature=1.0, beta=args.kl_coef, epsilon=CLIP_EPS, loss_type="dapo",
        scale_rewards="group", learning_rate=LR, max_grad_norm=1.0, max_steps=updates, logging_steps=1,
        report_to=[], use_cpu=True, bf16=False, activation_checkpointing=False, save_strategy="no",
        disable_tqdm=True, seed=args.seed, dataloader_num_workers=0,
    )


def trl_on_tiny_template(model_dir: Path, work: Path, args: argparse.Namespace) -> str:
    """Construct TRL's multi-turn trainer on the same weights under agentrl's own tiny template: the error it
    raises (measured, not quoted), or 'ok'."""
    import shutil

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    folder = work / "model-tiny-template"
    shutil.copytree(model_dir, folder, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * 4, "seed": list(range(4))})
    try:
        GRPOTrainer(model=str(folder), args=trl_config(work / "trl-tiny", args, 4, 1), train_dataset=data,
                    environment_factory=VaultTools)
    except Exception as e:  # the point of this probe: what TRL says
        return f"{type(e).__name__}: {e}"
    return "ok"


# -- agentrl ------------------------------------------------------------------------------------


def agentrl_trainer(model_dir: Path, args: argparse.Namespace, out: Path,
                    turns: Turns) -> tuple[Any, list[dict[str, Any]]]:
    from rich.console import Console

    from agentrl.config import TrainConfig
    from agentrl.monitor import Monitor
    from agentrl.trainer import Trainer

    rows: list[dict[str, Any]] = []

    class TurnMonitor(Monitor):
        def log(self, metrics: dict[str, Any]) -> None:
            if not metrics.get("final"):
                turns.update_done("agentrl")
                rows.append(metrics)
            super().log(metrics)

    cfg = TrainConfig(
        algo="grpo", env={"id": ENV_ID, "kwargs": {"locks": LOCKS}}, model=str(model_dir), device="cpu",
        updates=1 + args.updates, seed=args.seed, out=str(out),
        loss={"kl_coef": args.kl_coef, "agg": "token-mean", "eps_low": CLIP_EPS, "eps_high": CLIP_EPS},
        optim={"lr": LR, "minibatches": 1, "ppo_epochs": 1, "max_grad_norm": 1.0},
        rollout={"groups": args.prompts, "group_size": args.group_size,
                 "sampling": {"max_new_tokens": args.max_new_tokens, "temperature": 1.0}},
        eval={"episodes": 1, "every": 0},
    )
    out.mkdir(parents=True, exist_ok=True)
    monitor = TurnMonitor(out, total=cfg.updates, console=Console(file=io.StringIO(), width=200))
    return Trainer(cfg, monitor=monitor), rows


# -- TRL ----------------------------------------------------------------------------------------


def trl_trainer(model_dir: Path, args: argparse.Namespace, out: Path, turns: Turns) -> tuple[Any, dict[str, Any]]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    episodes = args.prompts * args.group_size
    env = vault()
    seeds = list(range(1000, 1000 + args.prompts * (args.updates + 1) * 4))
    # the system prompt and an empty user turn; TRL appends reset()'s task text to the user turn
    data = Dataset.from_dict({"prompt": [[{"role": "system", "content": env.system_prompt},
                                          {"role": "user", "content": ""}]] * len(seeds), "seed": seeds})
    logs: list[dict[str, Any]] = []
    stats: dict[str, Any] = {"logs": logs, "generate_rows": [], "generate_s": [], "tool_calls": []}
    rows_now: list[int] = []

    class TurnCallback(TrainerCallback):
        def on_step_end(self, args_, state, control, **kw):
            stats["generate_rows"].append(sum(rows_now))
            stats["tool_calls"].append(sum(e.tool_calls for e in trainer.environments or []))
            rows_now.clear()
            turns.update_done("trl")

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                stats["logs"].append(dict(logs))

    trainer = GRPOTrainer(model=str(model_dir), args=trl_config(out, args, episodes, 1 + args.updates),
                          train_dataset=data, environment_factory=VaultTools, callbacks=[TurnCallback()])
    trainer.remove_callback(PrinterCallback)
    generate = trainer._generate_single_turn

    def counted_generate(*a: Any, **k: Any) -> Any:  # every call is one turn of each row it is given
        t0 = time.perf_counter()
        out = generate(*a, **k)
        stats["generate_s"].append(time.perf_counter() - t0)
        rows_now.append(len(out[0]))
        return out

    trainer._generate_single_turn = counted_generate
    chat = ChatFormat(trainer.processing_class)
    if sorted(trainer.eos_token_ids) != sorted(chat.stop_ids):
        raise RuntimeError(f"TRL stops at {trainer.eos_token_ids}, agentrl at {chat.stop_ids}")
    if next(trainer.model.parameters()).dtype != torch.float32 or trainer.model.is_activation_checkpointing:
        raise RuntimeError("TRL's model is not fp32 without checkpointing, as configured")
    return trainer, stats


def run_both(model_dir: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    turns = Turns("agentrl", "trl")
    a_trainer, a_rows = agentrl_trainer(model_dir, args, work / "agentrl", turns)
    t_trainer, t_stats = trl_trainer(model_dir, args, work / "trl", turns)
    results = take_turns(a_trainer, t_trainer, a_rows, turns, args.updates)
    a_updates = [r for r in a_rows if r.get("step", 0) >= 1]
    episodes = args.prompts * args.group_size
    timed = a_updates[1:]
    logs = t_stats["logs"][1:]
    return {
        "agentrl": {"wall": turns.wall["agentrl"][2:], "cpu": turns.cpu["agentrl"][2:],
                    "turns": [r["rollout/turns_mean"] for r in timed],
                    "action_tokens": statistics.mean(r["rollout/action_tokens_mean"] for r in timed),
                    "reward_mean": statistics.mean(r["rollout/reward_mean"] for r in timed),
                    "malformed": statistics.mean(r["rollout/malformed_per_episode"] for r in timed),
                    "sampling_s": [r["time/rollout_s"] for r in timed],
                    "skipped": sum(1 for r in timed if not r.get("train/trained_episodes")),
                    "parameters": results["agentrl"]["parameters"]},
        "trl": {"wall": turns.wall["trl"][1:], "cpu": turns.cpu["trl"][1:],
                "turns": [rows / episodes for rows in t_stats["generate_rows"][1:]],
                "tool_calls": statistics.mean(c / episodes for c in t_stats["tool_calls"][1:]),
                "action_tokens": statistics.mean(r["completions/mean_length"] for r in logs),
                "reward_mean": statistics.mean(r["reward"] for r in logs),
                "generate_s": sum(t_stats["generate_s"]),
                "parameters": sum(p.numel() for p in t_trainer.model.parameters())},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 prompts x 4, 2 timed updates, a shorter SFT")
    ap.add_argument("--updates", type=int, default=5, help="timed updates per side, after one warm-up update")
    ap.add_argument("--prompts", type=int, default=8, help="prompts (groups) per update")
    ap.add_argument("--group-size", type=int, default=8, help="episodes per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens per turn (agentrl); TRL's episode budget "
                    "is 17 x (this + 32)")
    ap.add_argument("--demos", type=int, default=1024, help="expert demonstrations for the SFT warm start")
    ap.add_argument("--sft-epochs", type=int, default=4, help="passes over the demonstrations (batch 16, lr 3e-3); "
                    "the warm start is cached under $AGENTRL_CACHE/vs_trl_multiturn, so a second run skips it")
    ap.add_argument("--sft-noise", type=float, default=0.1, help="the expert's slip rate in the demonstrations")
    ap.add_argument("--kl-coef", type=float, default=0.04)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="work folder; default: a fresh temporary folder")
    args = ap.parse_args(argv)
    if args.quick:
        args.updates, args.prompts, args.group_size, args.demos, args.sft_epochs = 2, 4, 4, 256, 2
    if args.group_size < 2:
        ap.error("--group-size must be >= 2 (TRL's GRPO needs two generations per prompt)")

    import trl

    torch.set_num_threads(args.threads)
    work = Path(args.out or tempfile.mkdtemp(prefix="agentrl-vs-trl-multiturn-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir, sft_stats = cached_model(work, args)
    tiny_error = trl_on_tiny_template(model_dir, work, args)
    print(f"TRL {trl.__version__} GRPOTrainer(environment_factory=...) on the tiny policy's own template: {tiny_error}")
    print(f"warm start: SFT on {args.demos} expert demonstrations x {args.sft_epochs} epochs "
          f"({'cached' if sft_stats['cached'] else f'{time.perf_counter() - t0:.0f} s'}, loss "
          f"{sft_stats['sft/loss']:.3f}); both sides load {model_dir} (Qwen2.5 template)")

    episodes = args.prompts * args.group_size
    load_before = os.getloadavg()[0]
    r = run_both(model_dir, args, work)
    load_after = os.getloadavg()[0]
    a, t = r["agentrl"], r["trl"]
    if a["parameters"] != t["parameters"]:
        raise RuntimeError(f"parameter counts differ: agentrl {a['parameters']}, TRL {t['parameters']}")

    def side(r: dict[str, Any]) -> dict[str, Any]:
        s = statistics.median(r["wall"])
        turns = statistics.mean(r["turns"])
        return {"s_per_update": round(s, 3), "episodes_per_s": round(episodes / s, 2),
                "s_per_update_min": round(min(r["wall"]), 3), "updates_s": [round(x, 3) for x in r["wall"]],
                "cpu_s_per_update": round(statistics.median(r["cpu"]), 3),
                "turns_per_episode": round(turns, 2), "s_per_turn": round(s / (turns * episodes), 5),
                "action_tokens_per_episode": round(r["action_tokens"], 1), "reward_mean": round(r["reward_mean"], 4)}

    sa, st = side(a), side(t)
    sa["malformed_calls_per_episode"] = round(a["malformed"], 2)
    st["tool_calls_per_episode"] = round(t["tool_calls"], 2)
    result = {
        "benchmark": "vs_trl_multiturn_grpo_update",
        "ratio": round(st["s_per_update"] / sa["s_per_update"], 3),
        "ratio_per_turn": round(st["s_per_turn"] / sa["s_per_turn"], 3),
        "ratio_cpu": round(st["cpu_s_per_update"] / sa["cpu_s_per_update"], 3),
        # equal work: no skipped optimizer step, and TRL's loop ran as many turns as agentrl's (within 20%); a warm
        # start too weak to write valid calls ends TRL's episodes after one turn, and the ratio then means nothing
        "fair": a["skipped"] == 0 and st["turns_per_episode"] >= 0.8 * sa["turns_per_episode"],
        "agentrl_skipped_updates": a["skipped"],
        "agentrl": sa,
        "trl": st,
        "trl_on_tiny_template": tiny_error,
        "template": "qwen2_5 (TRL's copy); the tiny template is refused, see trl_on_tiny_template",
        "task": {"env": ENV_ID, "locks": LOCKS, "turn_budget": 2 * LOCKS + 1},
        "episodes_per_update": episodes, "prompts": args.prompts, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "timed_updates": args.updates, "kl_coef": args.kl_coef,
        "quick": args.quick,
        "warm_start": {"demos": args.demos, "epochs": args.sft_epochs, "noise": args.sft_noise, **sft_stats},
        "model": {**MODEL.model_dump(), "parameters": a["parameters"]},
        "trl_version": trl.__version__, "torch_version": torch.__version__,
        "transformers_version": __import__("transformers").__version__,
        "machine": {"cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "loadavg_1min_before_after": [round(load_before, 2), round(load_after, 2)]},
        "command": "python "
        + " ".join(shlex.quote(x) for x in [os.path.relpath(sys.argv[0]), *(sys.argv[1:] if argv is None else argv)]),
    }
    print(f"\nOne GRPO update on Vault ({LOCKS} locks, {2 * LOCKS + 1}-turn budget), {args.prompts} prompts x "
          f"{args.group_size} = {episodes} episodes, {a['parameters'] / 1e6:.2f}M-parameter Llama (SFT warm start), "
          f"{torch.get_num_threads()} threads, {args.updates} timed updates each, taking turns, after 1 warm-up; load "
          f"average {load_before:.1f} -> {load_after:.1f}")
    print(f"{'':10} {'s/update':>9} {'(min)':>7} {'CPU s':>7} {'turns/ep':>9} {'s/turn':>8} {'tokens/ep':>10} "
          f"{'reward':>7}")
    for name, s in (("agentrl", sa), (f"TRL {trl.__version__}", st)):
        print(f"{name:10} {s['s_per_update']:9.2f} {s['s_per_update_min']:7.2f} {s['cpu_s_per_update']:7.2f} "
              f"{s['turns_per_episode']:9.2f} {s['s_per_turn']:8.4f} {s['action_tokens_per_episode']:10.1f} "
              f"{s['reward_mean']:7.3f}")
    print(f"agentrl: {sa['malformed_calls_per_episode']} malformed calls per episode answered with an error "
          f"observation; TRL: {st['tool_calls_per_episode']} tool calls per episode, its loop ends at the first "
          "completion without a parseable call and cannot be ended by the env")
    print(f"ratio (TRL s/update / agentrl s/update, medians): {result['ratio']:.2f}x  (per turn generated: "
          f"{result['ratio_per_turn']:.2f}x, CPU seconds: {result['ratio_cpu']:.2f}x)")
    if a["skipped"]:
        print(f"NOT LIKE FOR LIKE: {a['skipped']} timed agentrl update(s) had no reward variance and skipped the "
              "optimizer step")
    if st["turns_per_episode"] < 0.8 * sa["turns_per_episode"]:
        print(f"NOT LIKE FOR LIKE: TRL's episodes ran {st['turns_per_episode']:.1f} turns, agentrl's "
              f"{sa['turns_per_episode']:.1f}: the warm start writes too few valid tool calls (more "
              "--demos/--sft-epochs)")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
