"""One GRPO update end to end: agentrl's `Trainer` against TRL's `GRPOTrainer`, same task, same model.

    pip install -e ".[bench]"       # TRL (pinned) and its datasets dependency
    python benchmarks/vs_trl.py     # 1 warm-up + 5 timed updates per side; about 1 minute on 2 cores
    python benchmarks/vs_trl.py --updates 5 --prompts 8 --group-size 8 --max-new-tokens 32   # the defaults

What is measured: wall-clock seconds per RL update, each side running its own real trainer loop
(`agentrl.trainer.Trainer.train()`, `trl.GRPOTrainer.train()`) in one process with the same
`torch.set_num_threads`. An update is everything between two optimizer updates: sample `prompts x
group-size` completions of up to `max-new-tokens` tokens at temperature 1, score them, the
reference model's log-probs (both sides, since beta = kl_coef > 0), group-relative advantages, one
forward/backward over the whole batch and one optimizer step, plus each framework's own
bookkeeping (agentrl writes the rollout batch to Parquet and a metrics row; TRL logs its metrics).
The two trainers run in two threads that take turns, one update each (agentrl, TRL, agentrl, ...),
so that both see the same load on a shared machine; an update is timed from the moment its side
gets the turn to the moment its update ends (agentrl: its monitor receives the update's row; TRL:
`on_step_end`). The first update of each side is a warm-up and is not timed. Seconds per update is
the median of the timed updates (the fastest, the mean, and this process's CPU seconds, which
other processes disturb less, are recorded too); episodes/s = episodes per update / seconds per
update; `ratio` = TRL seconds per update / agentrl seconds per update (> 1: agentrl is faster).
For a breakdown the JSON also has each side's sampling time (agentrl: its rollout, env steps and
Parquet write included; TRL: its `model.generate()` call).

Why it is a fair comparison:
- Same model and tokenizer: one tiny Llama (hidden 128, intermediate 416, 4 layers, 4 heads, 2 KV
  heads, tied embeddings; 0.90M parameters with the 468-token BPE vocabulary trained on the task's
  text, which runs out of merges below the 1,024 asked for) is built once with
  `agentrl.policy.build_tiny_policy`, saved to a folder and loaded from that folder by both, in
  float32 on the CPU. It is left untrained on purpose: a random policy rarely samples one of the two
  stop tokens (about 1 in 230 per token), so both sides generate nearly the full completion length
  and do the same work; the mean completion length each side actually generated is printed and
  recorded.
- Same prompts, token for token: the task is `examples/custom_env.py`'s Arithmetic cut to one turn
  (compute a*b+c, answer with the `answer` tool). TRL gets the prompt as plain text rendered by the
  same chat template with the same tool schema; the script checks that TRL's tokenisation equals
  agentrl's prompt ids. Both stop at the same tokens (`<|im_end|>`, `</tool_call>`: written into
  the saved `generation_config.json`, which TRL reads; agentrl's stop ids come from the template).
- Same reward: TRL's reward function resets the very same environment with the row's seed and
  steps it with the decoded completion, as agentrl's rollout does. The verifier gives 1 for the
  right answer and otherwise format credit (0.1 x the share of the completion's characters that
  occur in the right tool call), so that a random policy's groups are not all-equal: with all-zero
  rewards agentrl skips the optimizer step (no signal) while TRL still runs forward/backward, which
  would flatter agentrl. The script counts agentrl's skipped updates and flags any (`fair`).
- Same algorithm settings: G = group size, lr, clip eps 0.2, token-mean loss (TRL `dapo` = agentrl
  `token-mean`), std-normalised group advantages, beta = kl_coef, max grad norm 1.0, one epoch, one
  minibatch (agentrl `optim.minibatches=1`; TRL `per_device_train_batch_size` = all episodes and
  `gradient_accumulation_steps=1`, so one generation per optimizer step and no old-log-prob pass).
  TRL's defaults that would change the work are set to match agentrl: `activation_checkpointing=False`
  (TRL turns gradient checkpointing on by default: an extra forward during backward), `bf16=False`
  (fp32 like agentrl). Neither side prints per-update rows (agentrl's console goes to a buffer, TRL's
  printer callback is removed).
- Not equal, by design of each framework: agentrl samples with its own KV-cached batched loop and
  uses the sampler's log-probs as the behaviour policy; TRL calls `model.generate()` and computes
  the logits of completion tokens only (`logits_to_keep`). These are what is being compared.

The last line printed is one JSON object with the figures (`ratio` among them), also written to
`benchmarks/results/vs_trl[_smollm2].json` (or `--save`).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `examples` lives at the top of the repository

import torch  # noqa: E402
from benchlib import parser, report  # noqa: E402

from agentrl.chat.layout import ChatFormat  # noqa: E402
from agentrl.config import TinyModelConfig  # noqa: E402
from agentrl.policy import build_tiny_policy  # noqa: E402
from agentrl.stages.sft import expert_texts  # noqa: E402
from examples.custom_env import Arithmetic, call  # noqa: E402

MODEL = TinyModelConfig(hidden_size=128, intermediate_size=416, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=1024, vocab_size=1024)
LR = 2e-4  # agentrl's default policy learning rate, used by both
CLIP_EPS = 0.2


class OneTurnArithmetic(Arithmetic):
    """Arithmetic in one turn: answer a*b+c with the `answer` tool. Reward 1 for the right answer;
    otherwise format credit, 0.1 x the share of the completion's characters that occur in the right
    tool call, so that random completions differ in reward (see the module docstring)."""

    system_prompt = "Answer with the answer tool."
    max_turns = 1
    tools = [Arithmetic.answer]

    def step(self, action: str):
        self.action = action
        return super().step(action)

    def verify(self) -> float:
        truth = self.a * self.b + self.c
        if self.submitted == truth:
            return 1.0
        allowed = set(call("answer", value=truth))
        text = getattr(self, "action", "")
        return 0.1 * sum(ch in allowed for ch in text) / max(len(text), 1)


ENV_ID = f"{OneTurnArithmetic.__module__}:OneTurnArithmetic"


def stop_at_template_ends(folder: Path) -> Path:
    """Tell the folder's generation config (which TRL reads) the chat template's stop tokens and pad id."""
    from transformers import AutoTokenizer, GenerationConfig

    chat = ChatFormat(AutoTokenizer.from_pretrained(folder))
    gen = GenerationConfig.from_pretrained(folder)
    gen.eos_token_id = list(chat.stop_ids)
    gen.pad_token_id = chat.pad_id
    gen.save_pretrained(folder)
    return folder


def build_model(folder: Path, seed: int) -> Path:
    """The tiny policy, untrained, with both stop tokens in its generation config (read by TRL)."""
    env = Arithmetic()
    build_tiny_policy(expert_texts(env, range(300), noise=0.3), folder, MODEL, seed=seed)
    return stop_at_template_ends(folder)


def real_model_folder(folder: Path, name: str) -> Path:
    """A fetched model (`agentrl models fetch NAME`) in a folder of its own: the weights linked, the rest copied,
    and its generation config told the template's stop tokens (which TRL reads); the cache is not touched."""
    import shutil

    from agentrl.models import resolve

    source = Path(resolve(name))
    folder.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        target = folder / f.name
        if target.exists() or target.is_symlink():
            target.unlink()
        if f.suffix == ".safetensors":
            target.symlink_to(f.resolve())
        else:
            shutil.copy(f, target)
    return stop_at_template_ends(folder)


def prompt_text(tokenizer: Any, seed: int) -> str:
    """The prompt as text, as agentrl lays it out (a template that ignores tools= gets them in the system prompt
    from agentrl's ChatFormat, so the text is decoded from agentrl's own prompt ids; the caller checks that TRL's
    tokenisation of it gives those ids back)."""
    env = OneTurnArithmetic()
    obs, _ = env.reset(seed=seed)
    ids = ChatFormat(tokenizer).prompt_ids(obs, env.tool_schemas(), env.system_prompt)
    return tokenizer.decode(ids, skip_special_tokens=False)


def _one_malloc_arena() -> None:
    """glibc gives each thread an arena of its own, and memory freed in one is not reused by the other: the two
    trainers' threads would each keep their own peak. One arena (set before the threads start) lets them share it."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, 1)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc
        pass


def _give_back_memory() -> None:
    """Return freed heap to the OS (glibc's malloc_trim), so that one side's peak does not stay resident."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Turns:
    """Two trainers in two threads take turns, one update each, so that both run under the same load
    (this machine is shared); each update is timed from the moment its side got the turn to the
    moment it finished, in wall seconds and in this process's CPU seconds (only one side computes at
    a time; the other waits on a condition, holding no CPU)."""

    def __init__(self, first: str, second: str):
        _one_malloc_arena()
        self.cond = threading.Condition()
        self.other = {first: second, second: first}
        self.turn = first
        self.done: set[str] = set()
        self.resumed: dict[str, tuple[float, float]] = {}
        self.wall: dict[str, list[float]] = {first: [], second: []}
        self.cpu: dict[str, list[float]] = {first: [], second: []}

    def _wait(self, me: str) -> None:
        self.cond.wait_for(lambda: self.turn == me or self.other[me] in self.done)
        self.resumed[me] = (time.perf_counter(), time.process_time())

    def start(self, me: str) -> None:
        with self.cond:
            self._wait(me)

    def update_done(self, me: str) -> None:
        """Record the update that just ended, hand the turn over and wait for it to come back."""
        wall, cpu = time.perf_counter(), time.process_time()
        _give_back_memory()  # between the two timed intervals: neither side pays for it
        with self.cond:
            self.wall[me].append(wall - self.resumed[me][0])
            self.cpu[me].append(cpu - self.resumed[me][1])
            self.turn = self.other[me]
            self.cond.notify_all()
            self._wait(me)

    def finish(self, me: str) -> None:
        with self.cond:
            self.done.add(me)
            self.turn = self.other[me]
            self.cond.notify_all()


# -- agentrl ------------------------------------------------------------------------------------


def agentrl_trainer(model_dir: Path, args: argparse.Namespace, out: Path,
                    turns: Turns) -> tuple[Any, list[dict[str, Any]]]:
    """agentrl's real Trainer; its monitor hands the turn over each time an update's row arrives."""
    from rich.console import Console

    from agentrl.config import TrainConfig
    from agentrl.monitor import Monitor
    from agentrl.trainer import Trainer

    rows: list[dict[str, Any]] = []

    class TurnMonitor(Monitor):
        def log(self, metrics: dict[str, Any]) -> None:
            if not metrics.get("final"):  # step 0 is the evaluation before training, then one row per update
                turns.update_done("agentrl")
                rows.append(metrics)
            super().log(metrics)

    cfg = TrainConfig(
        algo="grpo",
        env={"id": ENV_ID},
        model=str(model_dir),
        device="cpu",
        updates=1 + args.updates,
        seed=args.seed,
        out=str(out),
        loss={"kl_coef": args.kl_coef, "agg": "token-mean", "eps_low": CLIP_EPS, "eps_high": CLIP_EPS},
        optim={"lr": LR, "minibatches": 1, "ppo_epochs": 1, "max_grad_norm": 1.0},
        rollout={"groups": args.prompts, "group_size": args.group_size,
                 "sampling": {"max_new_tokens": args.max_new_tokens, "temperature": 1.0}},
        eval={"episodes": 1, "every": 0},
    )
    out.mkdir(parents=True, exist_ok=True)
    # silent, as TRL's below
    monitor = TurnMonitor(out, total=cfg.updates, console=Console(file=io.StringIO(), width=200))
    return Trainer(cfg, monitor=monitor), rows


# -- TRL ----------------------------------------------------------------------------------------


def trl_trainer(model_dir: Path, args: argparse.Namespace, out: Path, turns: Turns) -> tuple[Any, list[dict[str, Any]]]:
    """TRL's GRPOTrainer on the same prompts and reward; a callback hands the turn over after each step."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = ChatFormat(tokenizer)
    episodes = args.prompts * args.group_size
    seeds = list(range(1000, 1000 + args.prompts * (args.updates + 1) * 4))
    data = Dataset.from_dict({"prompt": [prompt_text(tokenizer, s) for s in seeds], "seed": seeds})

    # the prompt tokens TRL will generate from must be exactly agentrl's
    env = OneTurnArithmetic()
    obs, _ = env.reset(seed=seeds[0])
    agentrl_ids = chat.prompt_ids(obs, env.tool_schemas(), env.system_prompt)
    if tokenizer(text=[data[0]["prompt"]])["input_ids"][0] != agentrl_ids:
        raise RuntimeError("TRL's prompt tokens differ from agentrl's; the comparison would not be like for like")

    reward_s: list[float] = []

    def reward(prompts, completions, completion_ids, seed, **_):
        t0 = time.perf_counter()
        out = []
        for ids, s in zip(completion_ids, seed):
            env.reset(seed=s)
            _, r, *_ = env.step(chat.decode(list(ids)))  # decoded as agentrl's rollout decodes an action
            out.append(r)
        reward_s.append(time.perf_counter() - t0)
        return out

    step_logs: list[dict[str, Any]] = []

    class TurnCallback(TrainerCallback):
        def on_step_end(self, args_, state, control, **kw):
            turns.update_done("trl")

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                step_logs.append(dict(logs))

    config = GRPOConfig(
        output_dir=str(out),
        num_generations=args.group_size,
        per_device_train_batch_size=episodes,
        gradient_accumulation_steps=1,
        max_completion_length=args.max_new_tokens,
        num_iterations=1,
        temperature=1.0,
        beta=args.kl_coef,
        epsilon=CLIP_EPS,
        loss_type="dapo",  # token-mean, as agentrl's loss.agg above
        scale_rewards="group",
        learning_rate=LR,
        max_grad_norm=1.0,
        max_steps=1 + args.updates,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        # TRL defaults to on (its old name, gradient_checkpointing); agentrl never checkpoints
        activation_checkpointing=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward, args=config, train_dataset=data,
                          callbacks=[TurnCallback()])
    trainer.remove_callback(PrinterCallback)  # silent, as agentrl's console is here
    generate, generate_s = trainer._generate_single_turn, []

    def timed_generate(*a: Any, **k: Any) -> Any:  # for the breakdown only: how long model.generate() took
        t0 = time.perf_counter()
        out = generate(*a, **k)
        generate_s.append(time.perf_counter() - t0)
        return out

    trainer._generate_single_turn = timed_generate
    trainer.bench_generate_s = generate_s
    trainer.bench_reward_s = reward_s
    if sorted(trainer.eos_token_ids) != sorted(chat.stop_ids):
        raise RuntimeError(f"TRL stops at {trainer.eos_token_ids}, agentrl at {chat.stop_ids}")
    dtype = next(trainer.model.parameters()).dtype
    if dtype != torch.float32 or trainer.model.is_activation_checkpointing:
        raise RuntimeError(f"TRL's model is not as configured: {dtype}, checkpointing "
                           f"{trainer.model.is_activation_checkpointing}")
    return trainer, step_logs


def take_turns(a_trainer: Any, t_trainer: Any, a_rows: list[dict[str, Any]], turns: Turns,
               updates: int) -> dict[str, Any]:
    """Run both trainers in two threads that take turns, one update each; check that each ran all
    `1 + updates` updates (the warm-up and the timed ones). Returns each side's `train()` result."""
    errors: dict[str, BaseException] = {}
    results: dict[str, Any] = {}

    def run(name: str, train: Any) -> None:
        try:
            turns.start(name)
            results[name] = train()
        except BaseException as e:  # reported by the main thread
            errors[name] = e
        finally:
            turns.finish(name)

    threads = [threading.Thread(target=run, args=("agentrl", a_trainer.train)),
               threading.Thread(target=run, args=("trl", t_trainer.train))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for name, e in errors.items():
        raise RuntimeError(f"the {name} side failed: {type(e).__name__}: {e}") from e

    n = 1 + updates
    a_updates = [r for r in a_rows if r.get("step", 0) >= 1]
    if len(a_updates) != n or results["agentrl"]["stopped"]:
        raise RuntimeError(f"agentrl ran {len(a_updates)} of {n} updates (stopped: {results['agentrl']['stopped']})")
    if len(turns.wall["trl"]) != n:
        raise RuntimeError(f"TRL ran {len(turns.wall['trl'])} of {n} steps")
    return results


def run_both(model_dir: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Build both trainers, then run them in two threads taking turns: agentrl's evaluation before
    training, TRL's warm-up step, agentrl's warm-up update, then one timed update each, in turn."""
    turns = Turns("agentrl", "trl")
    a_trainer, a_rows = agentrl_trainer(model_dir, args, work / "agentrl", turns)
    t_trainer, t_logs = trl_trainer(model_dir, args, work / "trl", turns)
    results = take_turns(a_trainer, t_trainer, a_rows, turns, args.updates)
    a_updates = [r for r in a_rows if r.get("step", 0) >= 1]
    return {
        # agentrl's first interval is the evaluation before training, its second and TRL's first the warm-up
        "agentrl": {"wall": turns.wall["agentrl"][2:], "cpu": turns.cpu["agentrl"][2:],
                    "completion_len": statistics.mean(r["rollout/action_tokens_mean"] for r in a_updates[1:]),
                    "reward_mean": statistics.mean(r["rollout/reward_mean"] for r in a_updates[1:]),
                    "sampling_s": [r["time/rollout_s"] for r in a_updates[1:]],
                    "prefill_tokens": [r.get("rollout/prefill_tokens", 0.0) for r in a_updates[1:]],
                    "prefill_tokens_saved": [r.get("rollout/prefill_tokens_saved", 0.0) for r in a_updates[1:]],
                    "prompt_tokens_shared": [r.get("train/prompt_tokens_shared", 0.0) for r in a_updates[1:]],
                    "skipped": sum(1 for r in a_updates[1:] if not r.get("train/trained_episodes")),
                    "parameters": results["agentrl"]["parameters"]},
        "trl": {"wall": turns.wall["trl"][1:], "cpu": turns.cpu["trl"][1:],
                "completion_len": statistics.mean(r["completions/mean_length"] for r in t_logs[1:]),
                "reward_mean": statistics.mean(r["reward"] for r in t_logs[1:]),
                "sampling_s": t_trainer.bench_generate_s[1:],
                "scoring_s": t_trainer.bench_reward_s[1:],
                "parameters": sum(p.numel() for p in t_trainer.model.parameters())},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = parser(__doc__)
    ap.add_argument("--updates", type=int, default=5, help="timed updates per side, after one warm-up update")
    ap.add_argument("--prompts", type=int, default=8, help="prompts (groups) per update")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="completion length cap (L)")
    ap.add_argument("--kl-coef", type=float, default=0.04,
                    help="beta for both; > 0 so that both compute the reference log-probs (agentrl always does, TRL "
                    "only when beta > 0)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch.set_num_threads for both sides")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="tiny", help="tiny (the untrained 0.9M Llama above, built here) or a model "
                    "agentrl fetches, e.g. smollm2-135m-instruct (`agentrl models fetch`; its own template and "
                    "tokenizer, tools in the system prompt as agentrl writes them)")
    ap.add_argument("--out", default=None, help="work folder (model, runs); default: a fresh temporary folder")
    ap.add_argument("--save", default=None,
                    help="write the JSON here instead of benchmarks/results/vs_trl[_smollm2].json")
    args = ap.parse_args(argv)
    if args.group_size < 2:
        ap.error("--group-size must be >= 2 (TRL's GRPO needs two generations per prompt)")

    import trl
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    work = Path(args.out or tempfile.mkdtemp(prefix="agentrl-vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    real = args.model != "tiny"
    model_dir = real_model_folder(work / "model", args.model) if real else build_model(work / "model", args.seed)
    episodes = args.prompts * args.group_size

    load_before = os.getloadavg()[0]
    r = run_both(model_dir, args, work)
    load_after = os.getloadavg()[0]
    a, t = r["agentrl"], r["trl"]
    if a["parameters"] != t["parameters"]:
        raise RuntimeError(f"parameter counts differ: agentrl {a['parameters']}, TRL {t['parameters']}")

    def side(r: dict[str, Any]) -> dict[str, Any]:
        s = statistics.median(r["wall"])
        sampling, scoring = statistics.median(r["sampling_s"]), statistics.median(r.get("scoring_s") or [0.0])
        extra = {k: statistics.median(r[k]) for k in ("prefill_tokens", "prefill_tokens_saved", "prompt_tokens_shared")
                 if k in r}
        return {"s_per_update": round(s, 3), "episodes_per_s": round(episodes / s, 2),
                # the update's phases (medians): rollout, scoring where it is apart from it, and the rest
                "phases_s": {"rollout": round(sampling, 3), "scoring": round(scoring, 3),
                             "training": round(s - sampling - scoring, 3)},
                **{k: round(v, 1) for k, v in extra.items()},
                "s_per_update_mean": round(statistics.mean(r["wall"]), 3), "s_per_update_min": round(min(r["wall"]), 3),
                "updates_s": [round(x, 3) for x in r["wall"]],
                "cpu_s_per_update": round(statistics.median(r["cpu"]), 3),
                "sampling_s": round(statistics.median(r["sampling_s"]), 3),
                "mean_completion_tokens": round(r["completion_len"], 2), "reward_mean": round(r["reward_mean"], 4)}

    sa, st = side(a), side(t)
    # a what-if, not a bound: the ratio with agentrl's rollout free (its scoring is inside its rollout, so the rest is
    # training); what the hardware allows is a roofline, which this script does not measure
    if_free = st["s_per_update"] / max(sa["s_per_update"] - sa["phases_s"]["rollout"], 1e-9)
    ratio = st["s_per_update"] / sa["s_per_update"]
    result = {
        "benchmark": "vs_trl_grpo_update",
        "ratio": round(ratio, 3),
        "ratio_if_rollout_free": round(if_free, 3),
        "ratio_if_rollout_free_how": "TRL's s/update over agentrl's s/update less its rollout: the ratio if agentrl's "
        "rollout cost nothing and its training stayed as measured (a what-if, not a hardware bound)",
        "fraction_of_rollout_free_gain": round((ratio - 1) / (if_free - 1), 3) if if_free > 1 else None,
        "load": [round(load_before, 2), round(load_after, 2)],  # 1-minute load average before and after
        "ratio_min": round(st["s_per_update_min"] / sa["s_per_update_min"], 3),
        "ratio_cpu": round(st["cpu_s_per_update"] / sa["cpu_s_per_update"], 3),
        # an agentrl update with no reward variance skips its optimizer step while TRL's does not
        "fair": a["skipped"] == 0,
        "agentrl_skipped_updates": a["skipped"],
        "agentrl": sa,
        "trl": st,
        "episodes_per_update": episodes,
        "prompts": args.prompts,
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "timed_updates": args.updates,
        "kl_coef": args.kl_coef,
        "model": args.model if real else "tiny-untrained",
        "model_config": {**({} if real else {**MODEL.model_dump(), "trained": False}), "parameters": a["parameters"],
                         "vocab_tokens": len(AutoTokenizer.from_pretrained(model_dir))},
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "transformers_version": __import__("transformers").__version__,
        "machine": {"cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine(),
                    # other processes on the machine skew both sides; a load well above the cores says so
                    "loadavg_1min_before_after": [round(load_before, 2), round(load_after, 2)]},
        "command": "python "
        + " ".join(shlex.quote(x) for x in [os.path.relpath(sys.argv[0]), *(sys.argv[1:] if argv is None else argv)]),
        "work_dir": str(work),
    }
    what = args.model if real else "Llama (untrained)"
    print(f"\nOne GRPO update, {args.prompts} prompts x {args.group_size} = {episodes} episodes, up to "
          f"{args.max_new_tokens} tokens, {a['parameters'] / 1e6:.2f}M-parameter {what}, "
          f"{torch.get_num_threads()} threads, {args.updates} timed updates each, taking turns, after 1 warm-up; load "
          f"average {load_before:.1f} -> {load_after:.1f}")
    print(f"{'':10} {'s/update':>9} {'(min)':>7} {'episodes/s':>11} {'CPU s/update':>13} {'sampling s':>11} "
          f"{'mean completion':>16} {'reward':>8}")
    for name, s in (("agentrl", sa), (f"TRL {trl.__version__}", st)):
        print(f"{name:10} {s['s_per_update']:9.2f} {s['s_per_update_min']:7.2f} {s['episodes_per_s']:11.1f} "
              f"{s['cpu_s_per_update']:13.2f} {s['sampling_s']:11.2f} {s['mean_completion_tokens']:16.1f} "
              f"{s['reward_mean']:8.4f}")
    print("(sampling s: agentrl's rollout incl. env steps and the Parquet write; TRL's model.generate() call; medians)")
    print(f"ratio (TRL s/update / agentrl s/update, medians): {result['ratio']:.2f}x  (fastest updates: "
          f"{result['ratio_min']:.2f}x, CPU seconds: {result['ratio_cpu']:.2f}x)")
    for name, x in (("agentrl", sa), ("TRL", st)):
        print(f"  {name} phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in x["phases_s"].items())
              + (f"; prompt tokens prefilled {x['prefill_tokens']:.0f}, saved by sharing "
                 f"{x['prefill_tokens_saved']:.0f}, not run again in training {x['prompt_tokens_shared']:.0f}"
                 if "prefill_tokens" in x else ""))
    print(f"ratio if agentrl's rollout were free: {result['ratio_if_rollout_free']:.2f}x; fraction of that gain "
          f"reached: {result['fraction_of_rollout_free_gain']}")
    if a["skipped"]:
        print(f"NOT LIKE FOR LIKE: {a['skipped']} timed agentrl update(s) had no reward variance and skipped the "
              "optimizer step")
    name = "vs_trl" + (f"_{args.model.split('-')[0]}" if args.model != "tiny" else "")
    report(name, result, path=args.save)  # adds the rest of the machine
    return result


if __name__ == "__main__":
    main()
