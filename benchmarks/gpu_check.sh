#!/usr/bin/env bash
# The vLLM engine on a CUDA GPU, in under 5 minutes (sized for one H200, 16 cores):
#   (a) its GPU tests: log-probs against a full torch forward, weight sync;
#   (b) 3 GRPO updates on defaults with --engine torch, then with --engine vllm, and the rollout
#       throughput of each (median of the updates' rollout/tokens_per_s in metrics.jsonl);
#   (c) on a machine with 2+ GPUs, the same vllm run as 2 data-parallel ranks (accelerate launch
#       --num_processes 2, one vLLM per GPU, examples/accelerate/ddp.yaml): it must write each of the
#       3 steps once; skipped, saying so, on one GPU. About 2 more minutes.
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
print(json.dumps(result))
EOF
