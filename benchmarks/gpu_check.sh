#!/usr/bin/env bash
# Kept for the commands already written down: the check is benchmarks/gpu_check.py (its --help says
# what it runs; --dry-run shows the plan on any machine). Arguments pass through.
exec python "$(dirname "$0")/gpu_check.py" "$@"
