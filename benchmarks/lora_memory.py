"""Memory of one RL update with LoRA adapters vs full fine-tuning, same model and the same work.

    python benchmarks/lora_memory.py                 # a ~25M-parameter Llama, 2 updates each
    python benchmarks/lora_memory.py --hidden 256 --layers 4   # smaller and quicker

Each mode builds `agentrl.trainer.Trainer` in its own process (so peaks do not mix), rolls out one
batch on Vault and runs `--updates` optimizer updates on it, and reports two figures:
- training state: bytes of the tensors training holds besides the policy's own weights: the KL
  reference (full: a frozen copy; LoRA: none, the base with adapters off), the adapters (LoRA),
  the gradients and AdamW's two moments, counted from the live tensors after the last update;
- peak resident memory of the process (VmHWM), which also counts activations, the KV cache of the
  rollouts and the Python runtime.
Baseline: full fine-tuning, measured in the same run. `ratio` is full / LoRA peak resident memory. Last line:
one JSON object, also written to benchmarks/results/lora_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parser, report  # noqa: E402


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _peak_rss_mb() -> float:
    from agentrl.memory import peak_rss_bytes  # VmHWM, as this benchmark always read

    return peak_rss_bytes() / 2**20


def worker(args: argparse.Namespace) -> None:
    """One mode, in this process: train, then count the training state."""
    import torch
    from rich.console import Console

    from agentrl.config import TrainConfig
    from agentrl.credit import Credit
    from agentrl.monitor import Monitor
    from agentrl.store import make_batch
    from agentrl.trainer import Trainer

    out = Path(args.out)
    cfg = TrainConfig(env={"kwargs": {"locks": 1}}, model=args.model, updates=args.updates,
                      out=str(out / f"lora{args.lora_r}"),
                      rollout={"groups": 4, "group_size": 4, "sampling": {"max_new_tokens": 24}},
                      eval={"episodes": 4, "every": 0}, optim={"lora": {"r": args.lora_r}, "minibatches": 1,
                                                               "micro_batch_tokens": args.micro_batch_tokens})
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, monitor=Monitor(Path(cfg.out), total=cfg.updates, console=Console(quiet=True)))
    # an untrained model fails every episode (no advantage, no update): the update here uses the
    # rollout batch with random advantages, which is the same work for the optimizer
    episodes, _ = trainer.collector.collect(1)
    batch = make_batch(episodes, trainer.policy.chat.pad_id)
    batch = batch.with_(ref_logp=trainer.learner.reference_logp(batch))
    gen = torch.Generator().manual_seed(0)
    credit = Credit(torch.randn(batch.action_mask.shape, generator=gen) * batch.action_mask, torch.ones(batch.size))
    for _ in range(args.updates):
        trainer.learner.optimize(batch, credit)
    model = trainer.policy.model
    inner = getattr(trainer.learner.optimizer, "optimizer", trainer.learner.optimizer)  # accelerate wraps it
    counted = {
        "weights": _bytes(p for n, p in model.named_parameters() if "lora_" not in n),
        "adapters": _bytes(p for n, p in model.named_parameters() if "lora_" in n),
        "reference": _bytes(trainer.learner.reference.parameters()) if trainer.learner.reference is not None else 0,
        "grads": _bytes(trainer.learner.trainable),  # freed after each step; the next backward needs them again
        "moments": _bytes(t for st in inner.state.values() for t in st.values() if isinstance(t, torch.Tensor)
                          and t.dim() > 0),
        "trained_params": sum(p.numel() for p in trainer.learner.trainable),
        "params": sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n),
    }
    mb = 1024 * 1024
    state = counted["adapters"] + counted["reference"] + counted["grads"] + counted["moments"]
    print(json.dumps({"lora_r": args.lora_r, "params": counted["params"], "trained_params": counted["trained_params"],
                      "weights_mb": counted["weights"] / mb, "training_state_mb": state / mb,
                      "reference_mb": counted["reference"] / mb, "optimizer_mb": counted["moments"] / mb,
                      "peak_rss_mb": _peak_rss_mb()}))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--updates", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=1024, help="padded tokens per forward (bounds the "
                    "activations)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--model", help=argparse.SUPPRESS)  # worker mode
    args = ap.parse_args()
    if args.model:
        return worker(args)

    from agentrl.config import TinyModelConfig
    from agentrl.policy import build_tiny_policy
    from agentrl.registry import make
    from agentrl.stages.sft import expert_texts

    out = Path(args.out or tempfile.mkdtemp(prefix="lora-memory-"))
    model_dir = out / "model"
    cfg = TinyModelConfig(hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.7),
                          num_hidden_layers=args.layers,
                          num_attention_heads=max(2, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 128))
    build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=1), range(200), noise=0.3), model_dir, cfg, seed=0)
    results = {}
    for r in (0, args.lora_r):
        cmd = [sys.executable, __file__, "--model", str(model_dir), "--lora-r", str(r), "--updates", str(args.updates),
               "--micro-batch-tokens", str(args.micro_batch_tokens), "--out", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
        if done.returncode:
            raise SystemExit(f"lora_memory: the {'LoRA' if r else 'full'} worker failed:\n{done.stderr[-3000:]}")
        results["lora" if r else "full"] = json.loads(done.stdout.strip().splitlines()[-1])
    full, lora = results["full"], results["lora"]
    print(f"model: {full['params'] / 1e6:.1f}M parameters ({full['weights_mb']:.0f} MB fp32); LoRA rank {args.lora_r}: "
          f"{lora['trained_params'] / 1e6:.2f}M trained")
    print(f"{'':18s}{'full':>10s}{'LoRA':>10s}")
    for key, label in [("training_state_mb", "training state"), ("reference_mb", "  reference"),
                       ("optimizer_mb", "  AdamW moments"),
                       ("peak_rss_mb", "peak resident")]:
        print(f"{label:18s}{full[key]:>8.0f}MB{lora[key]:>8.0f}MB")
    report("lora_memory", {"params": full["params"], "lora_r": args.lora_r,
                           "trained_params_lora": lora["trained_params"],
                           "training_state_mb_full": round(full["training_state_mb"], 1),
                           "training_state_mb_lora": round(lora["training_state_mb"], 1),
                           "peak_rss_mb_full": round(full["peak_rss_mb"]),
                           "peak_rss_mb_lora": round(lora["peak_rss_mb"]),
                           "state_ratio": round(full["training_state_mb"] / max(lora["training_state_mb"], 1e-9), 2),
                           "ratio": round(full["peak_rss_mb"] / lora["peak_rss_mb"], 3)})  # adds the machine


if __name__ == "__main__":
    main()
