"""Demonstrations for calc_agent.py in OpenAI's message format: what an agent's logged conversations look like.

A scripted expert that slips: with probability `noise` the final answer is off by one, so the warm start that
imitates it leaves reinforcement learning something to fix. Tasks come from seeds calc_agent never trains on.

    python examples/agent/write_demos.py --out demos.jsonl [--n 2000] [--noise 0.3]
"""

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from calc_agent import TOOLS, tasks  # noqa: E402


def demonstration(seed: int, noise: float) -> dict:
    task, rng = tasks(seed), random.Random(seed)
    a, b = (int(x) for x in task["question"].removeprefix("What is ").removesuffix("?").split(" + "))
    answer = task["answer"] + (rng.choice([-1, 1]) if rng.random() < noise else 0)
    call = {"id": f"call_{seed}", "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}
    return {"tools": TOOLS, "reward": float(answer == task["answer"]), "messages": [
        {"role": "user", "content": task["question"]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": str(a + b)},
        {"role": "assistant", "content": str(answer)}]}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="demos.jsonl")
    p.add_argument("--n", type=int, default=2000, help="conversations to write")
    p.add_argument("--noise", type=float, default=0.3, help="how often the expert's final answer slips by one")
    args = p.parse_args()
    with open(args.out, "w") as f:
        for seed in range(50_000_000, 50_000_000 + args.n):
            f.write(json.dumps(demonstration(seed, args.noise)) + "\n")
    print(f"wrote {args.n} demonstrations to {args.out}")
