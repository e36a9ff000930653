"""Write your own environment: subclass `AgentEnv`, declare typed tools, write a verifier.

    python examples/custom_env.py                 # check it, watch the expert, train briefly
    python examples/custom_env.py --updates 0     # just the checks and one expert episode
    agentrl train --env.id examples/custom_env.py:Arithmetic --sft.noise auto   # the same env from the CLI

The task: compute (a * b) + c. The policy has a calculator tool and an `answer` tool; the
verifier checks the submitted number. The scripted expert (used for the SFT warm start) sometimes
answers from memory instead of calculating, and is then usually wrong: the habit RL removes.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator

import agentrl
from agentrl.checker import check_env

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _arith(node: ast.AST) -> int:
    """Evaluate +, -, * over integers; anything else is refused (never `eval`)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_arith(node.left), _arith(node.right))
    raise ValueError("only integers with + - * are allowed")


class Arithmetic(agentrl.AgentEnv):
    """Compute (a * b) + c with a calculator, then answer."""

    system_prompt = "Solve the task with the tools."
    max_turns = 3

    def calc(self, expression: str) -> str:
        """Evaluate an integer expression with + - *."""
        try:
            return str(_arith(ast.parse(expression, mode="eval").body))
        except (SyntaxError, ValueError, RecursionError) as e:
            return f"calc error: {e}"  # the policy's mistake: an observation, not a crash

    def answer(self, value: int) -> str:
        """Submit the final answer."""
        self.submitted = value
        self.finish()
        return "submitted"

    tools = [calc, answer]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.a, self.b, self.c = (int(x) for x in self.np_random.integers(2, 10, size=3))
        self.submitted = None
        return f"Compute {self.a}*{self.b}+{self.c}.", {}

    def verify(self) -> float:
        return float(self.submitted == self.a * self.b + self.c)

    def state_key(self):
        return self.turn

    def expert_action(self, noise: float = 0.0) -> str:
        truth = self.a * self.b + self.c
        if self.turn == 0 and not (noise and self.np_random.random() < noise):
            return call("calc", expression=f"{self.a}*{self.b}+{self.c}")
        guess = truth if self.turn > 0 else int(self.np_random.integers(10, 90))
        return call("answer", value=guess)


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=20, help="RL updates after the warm start (0: skip training)")
    ap.add_argument("--demos", type=int, default=1500, help="expert demonstrations for the SFT warm start")
    ap.add_argument("--out", default="runs/example-arithmetic")
    args = ap.parse_args(argv)

    failed = [r for r in check_env(Arithmetic()) if not r.ok]
    print("check_env:", "all checks pass" if not failed else failed)
    env = Arithmetic()
    obs, _ = env.reset(seed=0)
    print("task:", obs)
    while True:
        action = env.expert_action()
        obs, reward, terminated, truncated, info = env.step(action)
        print(f"  {action}\n  -> {obs}")
        if terminated or truncated:
            print("reward:", reward)
            break
    if args.updates == 0:
        return None

    from agentrl.config import TrainConfig
    from agentrl.stages.pipeline import train

    cfg = TrainConfig(
        env={"id": "examples.custom_env:Arithmetic" if __name__ != "__main__" else "__main__:Arithmetic"},
        updates=args.updates,
        out=args.out,
        sft={"episodes": args.demos, "epochs": 3, "noise": 0.3},
        rollout={"groups": 8, "group_size": 8},
        eval={"episodes": 64, "every": 0},
    )
    return train(cfg)  # the SFT warm start (cached), then RL


if __name__ == "__main__":
    main()
