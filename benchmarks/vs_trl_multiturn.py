"""One multi-turn GRPO update end to end: agentrl's `Trainer` against TRL's `GRPOTrainer(environment_factory=...)`.

    pip install -e ".[bench]"                      # TRL (pinned, 1.16.0) and its datasets dependency
    python benchmarks/vs_trl_multiturn.py --model smollm2-135m-instruct   # the real model: SFT (cached), 1 + 3 updates
    python benchmarks/vs_trl_multiturn.py --quick  # the tiny policy, 2 x 4 episodes: a smoke run (< 5 min on 2 cores)

The task (`--task guess`, the default): find a secret number from 1 to 64 with one `guess` tool call a turn, answered
"higher", "lower" or "right"; the env never ends an episode early, so every episode runs its 6 turns on both sides as
long as the policy calls the tool each turn: the two loops generate the same number of turns, and the ratio is per
update and per turn alike (`equal_turns` in the JSON says whether they did, update by update). Each side runs its own
real multi-turn loop:

- agentrl: `agentrl.trainer.Trainer.train()`: the torch engine keeps every episode's KV cache across turns, feeds only
  each turn's new observation tokens, prefills a group's shared prompt once (`rollout.share_prefill`), and the
  training and reference forwards run that prompt once per group too (`optim.share_prefix`).
- TRL 1.16: `GRPOTrainer(environment_factory=GuessTools)`, its documented multi-turn loop (`_tool_call_loop`):
  `GuessTools` wraps the very same env (its `guess` method is TRL's tool, `reset` takes the dataset row's seed and
  returns the task text, `get_reward` is the env's verifier). After every turn TRL calls `model.generate()` again on
  each live episode's whole concatenated history (prompt + completion + tool results so far), so the history is
  prefilled again each turn, and every row of a group prefills its prompt.

The model (`--model`): the tiny 0.9M Llama (its BPE trained here) or a fetched real model (`smollm2-135m-instruct`,
SmolLM2-135M-Instruct). TRL 1.16 refuses either under its own template, measured each run (`trl_on_own_template`:
"The provided chat template does not support tool calling", `trl.chat_template_utils.supports_tool_calling`), and it
parses tool calls only for the templates it knows by their exact text. So both sides load one folder with TRL's copy
of Qwen2.5's template (`<tool_call>{json}</tool_call>`, tool results as a user turn in `<tool_response>`, tool JSON
schemas in the system prompt). TRL's loop ends an episode at the first completion without a parseable tool call, so
the folder is warm-started by SFT on the env's scripted expert (bisection with slips, laid out by this template;
cached under $AGENTRL_CACHE/vs_trl_multiturn): the policy then calls the tool every turn. The first prompt's tokens on
both sides are compared and recorded (`prompt_tokens`).

`--task vault` runs the earlier comparison (Vault with 8 locks, 17-turn budget), which is not like for like: the env
ends an episode once the vault is open, TRL's loop cannot, and a malformed call ends TRL's episode where agentrl
answers it with an error observation.

Timing is `benchmarks/vs_trl.py`'s: the two trainers run in two threads that take turns, one update each, so that
both see the same load; an update is timed from the moment its side gets the turn to the moment its update ends;
the first update of each side is a warm-up (agentrl's evaluation before training too). Seconds per update is the
median of the timed updates; `ratio` = TRL s/update / agentrl s/update; `phases_s` splits each side's update into its
rollout (agentrl: `time/rollout_s`, env steps and verifier included; TRL: its `_generate`, every turn's generate()
and tool calls) and the rest (reference log-probs, forward, backward, optimizer step); `ratio_if_rollout_free` is
the ratio agentrl would reach with a free rollout (TRL's update over agentrl's training phase): a what-if, not a
bound on what the hardware allows.

Same algorithm settings as `vs_trl.py`: G = group size, lr 2e-4, clip eps 0.2, token-mean loss (TRL `dapo`),
std-normalised group advantages, beta = kl_coef (both compute reference log-probs), max grad norm 1.0, one epoch,
one minibatch, fp32, no activation checkpointing on TRL, silent consoles. Both stop generating at the template's
stop tokens (written into `generation_config.json`, which TRL reads).

The last line printed is one JSON object with the figures (`ratio` among them); it is also written to
`benchmarks/results/vs_trl_multiturn[_smollm2][_quick].json` (or `--save`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
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
from benchlib import parser, report  # noqa: E402
from vs_trl import CLIP_EPS, LR, Turns, take_turns  # noqa: E402

from agentrl.chat.layout import ChatFormat  # noqa: E402
from agentrl.config import TinyModelConfig  # noqa: E402
from agentrl.core import AgentEnv  # noqa: E402
from agentrl.policy import TINY_CHAT_TEMPLATE, build_tiny_policy  # noqa: E402
from agentrl.registry import make  # noqa: E402
from agentrl.stages.sft import collect_demos, expert_texts, play_expert, sft  # noqa: E402

LOCKS = 8
GUESS_TURNS = 6
HIGHEST = 64
# vs_trl.py's model, with room for 17 turns after Qwen2.5's long tool preamble
MODEL = TinyModelConfig(hidden_size=128, intermediate_size=416, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=2048, vocab_size=1024)


class Guess(AgentEnv):
    """Find a secret number from 1 to 64: each turn one `guess`, answered "higher", "lower" or "right". The episode
    always runs its `max_turns` turns (the env never ends it: a number found stays found and later guesses are
    answered as before), so the turn count is fixed by the task and both loops generate the same number of turns as
    long as the policy calls the tool each turn. Reward 1 if found, else half the closeness of the best guess."""

    system_prompt = f"Find the secret number from 1 to {HIGHEST}. Call the guess tool once each turn."
    max_turns = GUESS_TURNS

    def guess(self, n: int) -> str:
        """Guess the secret number.

        Args:
            n: the guess
        """
        self.guesses.append(n)
        if n == self.secret:
            self.lo = self.hi = n
            return "right"
        if n < self.secret:
            self.lo = max(self.lo, n + 1)
            return "higher"
        self.hi = min(self.hi, n - 1)
        return "lower"

    tools = [guess]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(1, HIGHEST + 1))
        self.lo, self.hi, self.guesses = 1, HIGHEST, []
        return f"The secret number is from 1 to {HIGHEST}. You have {self.max_turns} guesses.", {}

    def verify(self) -> float:
        if self.secret in self.guesses:
            return 1.0
        return 0.5 * max((1 - abs(g - self.secret) / HIGHEST for g in self.guesses), default=0.0)

    def expert_action(self, noise: float = 0.0) -> str:
        """Bisection; with probability `noise` a guess anywhere in the range still open."""
        n = (self.lo + self.hi) // 2
        if noise > 0 and self.np_random.random() < noise and self.lo < self.hi:
            n = int(self.np_random.integers(self.lo, self.hi + 1))
        return f'<tool_call>\n{json.dumps({"name": "guess", "arguments": {"n": n}})}\n</tool_call>'


TASKS = {
    # a fixed number of turns: like for like with TRL's loop as long as the policy calls the tool each turn
    "guess": {"id": f"{Guess.__module__}:Guess", "kwargs": {}, "turns": GUESS_TURNS},
    # the env ends an episode when the vault is open (TRL's loop cannot): the earlier, not like-for-like task
    "vault": {"id": "agentrl/Vault-v0", "kwargs": {"locks": LOCKS}, "turns": 2 * LOCKS + 1},
}


def task_env(task: str) -> AgentEnv:
    return make(TASKS[task]["id"], **TASKS[task]["kwargs"])


def qwen_template() -> str:
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def _stop_at_template_ends(folder: Path, chat: ChatFormat) -> None:
    from transformers import GenerationConfig

    gen = GenerationConfig.from_pretrained(folder)
    gen.eos_token_id = list(chat.stop_ids)
    gen.pad_token_id = chat.pad_id
    gen.save_pretrained(folder)


def _tiny_under_qwen(folder: Path, args: argparse.Namespace) -> None:
    """The tiny policy, its tokenizer trained on expert conversations rendered by Qwen2.5's template."""
    from agentrl.policy import build_tokenizer

    env = task_env(args.task)
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


def _real_under_qwen(folder: Path, name: str) -> None:
    """A fetched model (`agentrl models fetch NAME`) saved into `folder` with Qwen2.5's template: weights copied, never
    written through a link into the cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models import resolve

    source = resolve(name)
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)


def build_model(folder: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The policy under Qwen2.5's template (TRL's copy), warm-started by SFT on the task's expert so that it calls the
    tool each turn (TRL's loop ends an episode at the first completion without a parseable call); both stop tokens
    in its generation config, which TRL reads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    real = args.model != "tiny"
    _real_under_qwen(folder, args.model) if real else _tiny_under_qwen(folder, args)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = qwen_template()
    tokenizer.save_pretrained(folder)
    chat = ChatFormat(tokenizer)

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    demos = collect_demos(lambda: task_env(args.task), chat, range(10_000, 10_000 + args.demos), noise=args.sft_noise)
    t0 = time.perf_counter()
    stats = sft(model, demos, chat.pad_id, epochs=args.sft_epochs, lr=args.sft_lr, batch_size=8 if real else 16,
                seed=args.seed)
    stats["sft/wall_s"] = time.perf_counter() - t0
    model.save_pretrained(folder)
    _stop_at_template_ends(folder, chat)
    return folder, {k: round(float(v), 3) for k, v in stats.items()}


def cached_model(work: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """`build_model`, cached by what changes it (the SFT is the slow part), under $AGENTRL_CACHE."""
    import hashlib
    import shutil

    from agentrl.stages.warm_start import cache_root

    parts = {"model": MODEL.model_dump() if args.model == "tiny" else args.model, "task": TASKS[args.task],
             "demos": args.demos, "epochs": args.sft_epochs, "noise": args.sft_noise, "lr": args.sft_lr,
             "seed": args.seed, "template": hashlib.sha256(qwen_template().encode()).hexdigest()}
    if args.task == "vault" and args.model == "tiny":  # the key the earlier runs' warm starts were cached under
        parts = {"model": MODEL.model_dump(), "locks": LOCKS, "demos": args.demos, "epochs": args.sft_epochs,
                 "noise": args.sft_noise, "seed": args.seed, "template": parts["template"]}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_root() / "vs_trl_multiturn" / key
    if (folder / "sft.json").exists():
        return folder, {**json.loads((folder / "sft.json").read_text()), "cached": True}
    built, stats = build_model(work / "model", args)
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built, folder, dirs_exist_ok=True)
    (folder / "sft.json").write_text(json.dumps(stats))  # written last: a folder without it is incomplete
    return folder, {**stats, "cached": False}


class _Tools:
    """TRL's environment: the same env, its tools exposed as methods (TRL reads their signatures and Google-style
    docstrings), `reset` taking the dataset row's seed, the env's verifier as `get_reward`."""

    task = ""

    def __init__(self):
        self.env = task_env(self.task)
        self.tool_calls = 0

    def reset(self, seed: int, **_: Any) -> str:
        obs, _ = self.env.reset(seed=int(seed))
        self.tool_calls = 0
        return obs

    def get_reward(self) -> float:
        return self.env.verify()


class GuessTools(_Tools):
    task = "guess"

    def guess(self, n: int) -> str:
        """Guess the secret number.

        Args:
            n: the guess
        """
        self.tool_calls += 1
        return self.env.guess(int(n))


class VaultTools(_Tools):
    task = "vault"

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


TOOLS = {"guess": GuessTools, "vault": VaultTools}


def trl_config(out: Path, args: argparse.Namespace, episodes: int, updates: int) -> Any:
    from trl import GRPOConfig

    turns = TASKS[args.task]["turns"]
    return GRPOConfig(
        output_dir=str(out), num_generations=args.group_size, per_device_train_batch_size=episodes,
        gradient_accumulation_steps=1,
        # the whole episode's budget (TRL counts tool results in it): every turn's action and observation
        max_completion_length=turns * (args.max_new_tokens + 32),
        max_tool_calling_iterations=turns - 1,  # 1 + (turns - 1) generations: the env's turn budget
        num_iterations=1, temperature=1.0, beta=args.kl_coef, epsilon=CLIP_EPS, loss_type="dapo",
        scale_rewards="group", learning_rate=args.lr, max_grad_norm=1.0, max_steps=updates, logging_steps=1,
        report_to=[], use_cpu=True, bf16=False, activation_checkpointing=False, save_strategy="no",
        disable_tqdm=True, seed=args.seed, dataloader_num_workers=0,
    )


def trl_on_own_template(model_dir: Path, work: Path, args: argparse.Namespace) -> str:
    """Construct TRL's multi-turn trainer on the same weights under the model's own template (agentrl's tiny one, or
    the fetched model's): the error it raises (measured, not quoted), or 'ok'."""
    import shutil

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from agentrl.models import resolve

    own = TINY_CHAT_TEMPLATE if args.model == "tiny" else \
        AutoTokenizer.from_pretrained(resolve(args.model)).chat_template
    folder = work / "model-own-template"
    shutil.copytree(model_dir, folder, dirs_exist_ok=True, symlinks=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = own
    tokenizer.save_pretrained(folder)
    n = args.group_size
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * n, "seed": list(range(n))})
    try:
        GRPOTrainer(model=str(folder), args=trl_config(work / "trl-own", args, n, 1), train_dataset=data,
                    environment_factory=TOOLS[args.task])
    except Exception as e:  # the point of this probe: what TRL says
        return f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
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
        algo="grpo", env={"id": TASKS[args.task]["id"], "kwargs": TASKS[args.task]["kwargs"]}, model=str(model_dir),
        device="cpu",
        updates=1 + args.updates, seed=args.seed, out=str(out),
        loss={"kl_coef": args.kl_coef, "agg": "token-mean", "eps_low": CLIP_EPS, "eps_high": CLIP_EPS},
        optim={"lr": args.lr, "minibatches": 1, "ppo_epochs": 1, "max_grad_norm": 1.0},
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
    env = task_env(args.task)
    seeds = list(range(1000, 1000 + args.prompts * (args.updates + 1) * 4))
    # the system prompt and an empty user turn; TRL appends reset()'s task text to the user turn
    data = Dataset.from_dict({"prompt": [[{"role": "system", "content": env.system_prompt},
                                          {"role": "user", "content": ""}]] * len(seeds), "seed": seeds})
    logs: list[dict[str, Any]] = []
    stats: dict[str, Any] = {"logs": logs, "generate_rows": [], "generate_s": [], "tool_calls": [], "rollout_s": []}
    rows_now: list[int] = []
    rollout_now: list[float] = []

    class TurnCallback(TrainerCallback):
        def on_step_end(self, args_, state, control, **kw):
            stats["generate_rows"].append(sum(rows_now))
            stats["tool_calls"].append(sum(e.tool_calls for e in trainer.environments or []))
            stats["rollout_s"].append(sum(rollout_now))
            rows_now.clear()
            rollout_now.clear()
            turns.update_done("trl")

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                stats["logs"].append(dict(logs))

    trainer = GRPOTrainer(model=str(model_dir), args=trl_config(out, args, episodes, 1 + args.updates),
                          train_dataset=data, environment_factory=TOOLS[args.task], callbacks=[TurnCallback()])
    trainer.remove_callback(PrinterCallback)
    # TRL renders its tools' schemas from the wrapper's signatures and docstrings (transformers' get_json_schema),
    # agentrl from the env's tools: give TRL the env's own schemas, so that both prompts are the same tokens (checked
    # in `prompt_tokens`); the calls still dispatch to the wrapper's methods, by name
    schemas = env.tool_schemas()
    trainer.tools = schemas
    trainer._env_tools = {name: schemas for name in getattr(trainer, "_env_tools", {})}
    generate, whole = trainer._generate_single_turn, trainer._generate

    def timed_rollout(*a: Any, **k: Any) -> Any:  # the rollout phase: every turn's generate() and tool calls
        t0 = time.perf_counter()
        out = whole(*a, **k)
        rollout_now.append(time.perf_counter() - t0)
        return out

    def counted_generate(*a: Any, **k: Any) -> Any:  # every call is one turn of each row it is given
        t0 = time.perf_counter()
        out = generate(*a, **k)
        stats["generate_s"].append(time.perf_counter() - t0)
        rows_now.append(len(out[0]))
        return out

    trainer._generate_single_turn = counted_generate
    trainer._generate = timed_rollout
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
    prompts = prompt_tokens(t_trainer, args.task, 1000)
    if not prompts["same"]:
        raise RuntimeError(f"the two sides' prompts differ ({prompts}); the comparison would not be like for like")
    results = take_turns(a_trainer, t_trainer, a_rows, turns, args.updates)
    a_updates = [r for r in a_rows if r.get("step", 0) >= 1]
    episodes = args.prompts * args.group_size
    timed = a_updates[1:]
    logs = t_stats["logs"][1:]
    return {
        "prompt_tokens": prompts,
        "agentrl": {"wall": turns.wall["agentrl"][2:], "cpu": turns.cpu["agentrl"][2:],
                    "turns": [r["rollout/turns_mean"] for r in timed],
                    "action_tokens": statistics.mean(r["rollout/action_tokens_mean"] for r in timed),
                    "reward_mean": statistics.mean(r["rollout/reward_mean"] for r in timed),
                    "malformed": statistics.mean(r["rollout/malformed_per_episode"] for r in timed),
                    "sampling_s": [r["time/rollout_s"] for r in timed],
                    "prefill_tokens_saved": [r.get("rollout/prefill_tokens_saved", 0.0) for r in timed],
                    "prompt_tokens_shared": [r.get("train/prompt_tokens_shared", 0.0) for r in timed],
                    "skipped": sum(1 for r in timed if not r.get("train/trained_episodes")),
                    "parameters": results["agentrl"]["parameters"]},
        "trl": {"wall": turns.wall["trl"][1:], "cpu": turns.cpu["trl"][1:],
                "turns": [rows / episodes for rows in t_stats["generate_rows"][1:]],
                "tool_calls": statistics.mean(c / episodes for c in t_stats["tool_calls"][1:]),
                "action_tokens": statistics.mean(r["completions/mean_length"] for r in logs),
                "reward_mean": statistics.mean(r["reward"] for r in logs),
                "generate_s": sum(t_stats["generate_s"]),
                "sampling_s": t_stats["rollout_s"][1:],
                "parameters": sum(p.numel() for p in t_trainer.model.parameters())},
    }


def prompt_tokens(trainer: Any, task: str, seed: int) -> dict[str, Any]:
    """Each side's first prompt, token for token: agentrl's (ChatFormat, the env's tool schemas) and TRL's (the same
    messages through the template with the tools TRL renders)."""
    tokenizer = trainer.processing_class
    env = task_env(task)
    obs, _ = env.reset(seed=seed)
    ours = ChatFormat(tokenizer).prompt_ids(obs, env.tool_schemas(), env.system_prompt)
    msgs = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}]
    theirs = tokenizer.apply_chat_template(msgs, tools=trainer.tools, add_generation_prompt=True, tokenize=True)
    theirs = list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
    return {"same": list(ours) == theirs, "agentrl": len(ours), "trl": len(theirs)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = parser(__doc__, quick="a smoke run: the tiny policy, 2 prompts x 4, 2 timed updates, a short SFT (under 5 "
                "minutes on 2 cores)")
    ap.add_argument("--model", default="tiny", help="tiny (the 0.9M Llama, its tokenizer trained here) or a model "
                    "agentrl fetches, e.g. smollm2-135m-instruct; either way under Qwen2.5's template, which TRL knows")
    ap.add_argument("--task", default="guess", choices=sorted(TASKS),
                    help="guess: a fixed number of turns, so both loops run the same turns (like for like); vault: "
                    "the env ends episodes early, which TRL's loop cannot (the earlier, not like-for-like figures)")
    ap.add_argument("--updates", type=int, default=3, help="timed updates per side, after one warm-up update")
    ap.add_argument("--prompts", type=int, default=2, help="prompts (groups) per update")
    ap.add_argument("--group-size", type=int, default=4, help="episodes per prompt (G); 2 x 8 SmolLM2 episodes of 6 "
                    "turns need more than 24 GB with both trainers in one process")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn (agentrl); TRL's episode budget "
                    "is turns x (this + 32)")
    ap.add_argument("--demos", type=int, default=None, help="expert demonstrations for the SFT warm start (default: "
                    "128 for a fetched model, 512 for the tiny one; SmolLM2 warm-started on 64 wrote garbage after a "
                    "guess of 2 or 3 in about 1 call of 8 at temperature 1, which ends TRL's episode early)")
    ap.add_argument("--sft-epochs", type=int, default=None, help="passes over the demonstrations (default 2 for a "
                    "fetched model, 4 for the tiny one); the warm start is cached under "
                    "$AGENTRL_CACHE/vs_trl_multiturn")
    ap.add_argument("--sft-lr", type=float, default=None, help="SFT learning rate (default 1e-4 for a fetched model, "
                    "3e-3 for the tiny one, which starts from scratch)")
    ap.add_argument("--sft-noise", type=float, default=0.3, help="the expert's slip rate in the demonstrations")
    ap.add_argument("--lr", type=float, default=None, help="the RL learning rate of both sides (default: 2e-4 for the "
                    "tiny policy; 1e-6 for a fetched model, whose warm start 2e-4 broke within one update: 5 malformed "
                    "calls an episode, and TRL's episodes ended after 1.3 turns)")
    ap.add_argument("--kl-coef", type=float, default=0.04)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="work folder; default: a fresh temporary folder")
    ap.add_argument("--save", default=None, help="write the JSON here too (default: benchmarks/results/"
                    "vs_trl_multiturn[_MODEL][_quick].json)")
    args = ap.parse_args(argv)
    real = args.model != "tiny"
    if args.quick:
        args.model, real, args.updates, args.prompts, args.group_size = "tiny", False, 2, 2, 4
    args.demos = args.demos or (128 if real else 512)
    args.sft_epochs = args.sft_epochs or (2 if real else 4)
    args.sft_lr = args.sft_lr or (1e-4 if real else 3e-3)
    args.lr = args.lr or (1e-6 if real else LR)
    if args.group_size < 2:
        ap.error("--group-size must be >= 2 (TRL's GRPO needs two generations per prompt)")

    import trl

    torch.set_num_threads(args.threads)
    work = Path(args.out or tempfile.mkdtemp(prefix="agentrl-vs-trl-multiturn-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir, sft_stats = cached_model(work, args)
    own_error = trl_on_own_template(model_dir, work, args)
    print(f"TRL {trl.__version__} GRPOTrainer(environment_factory=...) on the model's own template: {own_error}")
    print(f"warm start: SFT on {args.demos} expert demonstrations x {args.sft_epochs} epochs "
          f"({'cached' if sft_stats['cached'] else f'{time.perf_counter() - t0:.0f} s'}, loss "
          f"{sft_stats['sft/loss']:.3f}); both sides load {model_dir} (Qwen2.5 template)")

    episodes = args.prompts * args.group_size
    load_before = os.getloadavg()[0]
    r = run_both(model_dir, args, work)
    load_after = os.getloadavg()[0]
    a, t, prompts = r["agentrl"], r["trl"], r["prompt_tokens"]
    if a["parameters"] != t["parameters"]:
        raise RuntimeError(f"parameter counts differ: agentrl {a['parameters']}, TRL {t['parameters']}")

    def side(r: dict[str, Any]) -> dict[str, Any]:
        s = statistics.median(r["wall"])
        turns = statistics.mean(r["turns"])
        rollout = statistics.median(r["sampling_s"])
        return {"s_per_update": round(s, 3), "episodes_per_s": round(episodes / s, 2),
                "s_per_update_min": round(min(r["wall"]), 3), "updates_s": [round(x, 3) for x in r["wall"]],
                "cpu_s_per_update": round(statistics.median(r["cpu"]), 3),
                # agentrl's rollout includes the env's verifier; TRL's get_reward is a lookup after it
                "phases_s": {"rollout": round(rollout, 3), "training": round(s - rollout, 3)},
                "turns_per_episode": round(turns, 3), "turns_each_update": [round(x, 3) for x in r["turns"]],
                "s_per_turn": round(s / (turns * episodes), 5),
                "action_tokens_per_episode": round(r["action_tokens"], 1), "reward_mean": round(r["reward_mean"], 4)}

    sa, st = side(a), side(t)
    sa["malformed_calls_per_episode"] = round(a["malformed"], 2)
    sa["prefill_tokens_saved"] = statistics.median(a["prefill_tokens_saved"])
    sa["prompt_tokens_shared"] = statistics.median(a["prompt_tokens_shared"])
    st["tool_calls_per_episode"] = round(t["tool_calls"], 2)
    ratio = st["s_per_update"] / sa["s_per_update"]
    if_free = st["s_per_update"] / max(sa["phases_s"]["training"], 1e-9)
    budget = TASKS[args.task]["turns"]
    equal_turns = a["turns"] == t["turns"] == [float(budget)] * len(a["turns"])
    result = {
        "benchmark": "vs_trl_multiturn_grpo_update",
        "ratio": round(ratio, 3),
        "ratio_per_turn": round(st["s_per_turn"] / sa["s_per_turn"], 3),
        "ratio_cpu": round(st["cpu_s_per_update"] / sa["cpu_s_per_update"], 3),
        "ratio_if_rollout_free": round(if_free, 3),
        "ratio_if_rollout_free_how": "TRL's s/update over agentrl's s/update less its rollout: the ratio if agentrl's "
        "rollout cost nothing and its training stayed as measured (a what-if, not a hardware bound)",
        "fraction_of_rollout_free_gain": round((ratio - 1) / (if_free - 1), 3) if if_free > 1 else None,
        # both loops ran every episode for the task's whole turn budget in every timed update
        "equal_turns": equal_turns,
        "turns": {"agentrl": sa["turns_per_episode"], "trl": st["turns_per_episode"], "budget": budget},
        # equal work: no skipped optimizer step, and the same turns on both sides
        "fair": a["skipped"] == 0 and equal_turns,
        "agentrl_skipped_updates": a["skipped"],
        "agentrl": sa,
        "trl": st,
        "prompt_tokens": prompts,
        "load": [round(load_before, 2), round(load_after, 2)],
        "model": args.model if real else "tiny",
        "trl_on_own_template": own_error,
        "template": "qwen2_5 (TRL's copy); the model's own is refused, see trl_on_own_template",
        "task": {"name": args.task, **TASKS[args.task]},
        "episodes_per_update": episodes, "prompts": args.prompts, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "timed_updates": args.updates, "kl_coef": args.kl_coef, "lr": args.lr,
        "quick": args.quick,
        "warm_start": {"demos": args.demos, "epochs": args.sft_epochs, "lr": args.sft_lr, "noise": args.sft_noise,
                       **sft_stats},
        "model_config": {**(MODEL.model_dump() if not real else {}), "parameters": a["parameters"]},
        "trl_version": trl.__version__, "torch_version": torch.__version__,
        "transformers_version": __import__("transformers").__version__,
        "machine": {"cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "loadavg_1min_before_after": [round(load_before, 2), round(load_after, 2)],
                    # both trainers live in this process: 2 x 8 episodes of SmolLM2 ran out of 24 GB (TRL scores
                    # every completion position, tool results included, over the whole vocabulary)
                    "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)},
        "command": "python "
        + " ".join(shlex.quote(x) for x in [os.path.relpath(sys.argv[0]), *(sys.argv[1:] if argv is None else argv)]),
    }
    print(f"\nOne GRPO update on {args.task} ({budget}-turn budget), {args.prompts} prompts x {args.group_size} = "
          f"{episodes} episodes, {a['parameters'] / 1e6:.2f}M-parameter {result['model']} (SFT warm start), "
          f"{torch.get_num_threads()} threads, {args.updates} timed updates each, taking turns, after 1 warm-up; load "
          f"average {load_before:.1f} -> {load_after:.1f}")
    print(f"first prompt: agentrl {prompts['agentrl']} tokens, TRL {prompts['trl']} tokens, "
          f"{'the same tokens' if prompts['same'] else 'NOT the same tokens'}")
    print(f"{'':10} {'s/update':>9} {'(min)':>7} {'CPU s':>7} {'rollout s':>10} {'turns/ep':>9} {'s/turn':>8} "
          f"{'tokens/ep':>10} {'reward':>7}")
    for name, x in (("agentrl", sa), (f"TRL {trl.__version__}", st)):
        print(f"{name:10} {x['s_per_update']:9.2f} {x['s_per_update_min']:7.2f} {x['cpu_s_per_update']:7.2f} "
              f"{x['phases_s']['rollout']:10.2f} {x['turns_per_episode']:9.2f} {x['s_per_turn']:8.4f} "
              f"{x['action_tokens_per_episode']:10.1f} {x['reward_mean']:7.3f}")
    print(f"agentrl: {sa['malformed_calls_per_episode']} malformed calls per episode, prompt tokens not prefilled "
          f"again {sa['prefill_tokens_saved']:.0f}, not run again in training {sa['prompt_tokens_shared']:.0f}; TRL: "
          f"{st['tool_calls_per_episode']} tool calls per episode")
    print(f"ratio (TRL s/update / agentrl s/update, medians): {result['ratio']:.2f}x  (per turn generated: "
          f"{result['ratio_per_turn']:.2f}x, CPU seconds: {result['ratio_cpu']:.2f}x); with agentrl's rollout free "
          f"{result['ratio_if_rollout_free']:.2f}x, fraction of that gain reached "
          f"{result['fraction_of_rollout_free_gain']}")
    if a["skipped"]:
        print(f"NOT LIKE FOR LIKE: {a['skipped']} timed agentrl update(s) had no reward variance and skipped the "
              "optimizer step")
    if not equal_turns:
        print(f"NOT LIKE FOR LIKE: turns per episode agentrl {a['turns']}, TRL {t['turns']} (budget {budget}): "
              "TRL's loop ends an episode at the first completion without a parseable call (a longer SFT: "
              "--demos/--sft-epochs)")
    name = "vs_trl_multiturn" + (f"_{args.model.split('-')[0]}" if real else "")
    report(name, result, args.quick, path=args.save)  # adds the rest of the machine
    return result


if __name__ == "__main__":
    main()
