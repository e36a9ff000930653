#!/usr/bin/env bash
# The vLLM engine on a CUDA GPU, in under 5 minutes (sized for one H200, 16 cores):
#   (a) its GPU tests: log-probs against a full torch forward, weight sync;
#   (b) 3 GRPO updates on defaults with --engine torch, then with --engine vllm, and the rollout
#       throughput of each (median of the updates' rollout/tokens_per_s in metrics.jsonl).
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

python - "$OUT" "$tests" <<'EOF'
import json, pathlib, statistics, sys

out, tests = pathlib.Path(sys.argv[1]), int(sys.argv[2])

def tokens_per_s(engine):
    path = out / engine / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rates = [r["rollout/tokens_per_s"] for r in rows if "rollout/tokens_per_s" in r]
    return round(statistics.median(rates), 1) if rates else None

torch_tps, vllm_tps = tokens_per_s("torch"), tokens_per_s("vllm")
ratio = round(vllm_tps / torch_tps, 2) if torch_tps and vllm_tps else None
print(json.dumps({"tests_passed": tests == 0, "torch_tokens_per_s": torch_tps, "vllm_tokens_per_s": vllm_tps, "ratio": ratio}))
EOF
