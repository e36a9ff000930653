"""A plain gymnasium text game, trained through `gym:` without agentrl code in the env.

    python examples/gym_guess.py --demos demos.jsonl         # noisy binary-search demonstrations (TRL format)
    agentrl sft --env gym:examples.gym_guess:GuessNumber-v0 --data demos.jsonl --sft.epochs 12 --out runs/guess-sft
    agentrl train --env gym:examples.gym_guess:GuessNumber-v0 --model runs/guess-sft --algo grpo --updates 40

The game: guess a secret number from 1 to 16 in at most 4 guesses; each wrong guess is answered "too
low" or "too high". Binary search wins 15 of 16 games. The environment is an ordinary `gymnasium.Env`
whose spaces are `gymnasium.spaces.Text` and which knows nothing of agentrl (no tools):
`agentrl.make("gym:examples.gym_guess:GuessNumber-v0")` wraps it (`agentrl.adapters.gym_text`), and the
demonstrations are written here, from outside, by playing the wrapped env with a noisy binary search.
The env also offers that search as a plain method, `expert_action(noise)` (the action text), which the
wrapper passes on: `agentrl train --env gym:examples.gym_guess:GuessNumber-v0` without `--model` then
warm-starts the tiny policy on it, as for agentrl's own envs.
Run from the repository root (the id imports `examples.gym_guess`, which registers it).

The defaults are what lifted the tiny policy (README, "Environments from the ecosystem"): 2,000
demonstrations of a search that slips on half its guesses (it wins 0.71) and 12 epochs of SFT put the
warm start at 0.61; 4 epochs left it at 0.42, guessing nearly at random, and RL from there did not rise.
"""

from __future__ import annotations

import argparse
import json
import string

import gymnasium as gym
import numpy as np
from gymnasium import spaces

HIGHEST, GUESSES = 16, 4


class GuessNumber(gym.Env):
    """Guess the secret number: reward 1 for the right guess (which ends the episode), 0 otherwise."""

    observation_space = spaces.Text(max_length=120, charset=string.ascii_letters + string.digits + " .,;")
    action_space = spaces.Text(min_length=1, max_length=2, charset=string.digits)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(1, HIGHEST + 1))
        self.lo, self.hi = 1, HIGHEST  # what the answers so far leave possible
        return f"Guess my number from 1 to {HIGHEST}; you have {GUESSES} guesses.", {}

    def step(self, action):
        guess = int(action)
        if guess == self.secret:
            return "Right.", 1.0, True, False, {}
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
        else:
            self.hi = min(self.hi, guess - 1)
        return f"{guess} is too {'low' if guess < self.secret else 'high'}.", 0.0, False, False, {}

    def expert_action(self, noise: float = 0.0) -> str:
        """Binary search; with probability `noise` a slip: a random number still possible (it costs a guess)."""
        if noise > 0 and self.np_random.random() < noise:
            return str(int(self.np_random.integers(self.lo, self.hi + 1)))
        return str((self.lo + self.hi) // 2)


if "GuessNumber-v0" not in gym.registry:  # run as a script, the module is imported twice (__main__ and by its id)
    gym.register("GuessNumber-v0", entry_point="examples.gym_guess:GuessNumber", max_episode_steps=GUESSES)


def demonstrations(episodes: int, noise: float, seed: int = 0) -> tuple[list[dict], float]:
    """Conversations (TRL's conversational format, agentrl's tool calls) of a binary search that, with
    probability `noise` per guess, guesses a random number still possible instead; and their pass rate."""
    import agentrl

    env = agentrl.make("gym:examples.gym_guess:GuessNumber-v0")
    rng = np.random.default_rng(seed)
    rows, wins = [], 0
    for i in range(episodes):
        obs, _ = env.reset(seed=i)
        messages = [{"role": "user", "content": obs}]
        lo, hi = 1, HIGHEST
        while True:
            guess = int(rng.integers(lo, hi + 1)) if rng.random() < noise else (lo + hi) // 2
            call = json.dumps({"name": "act", "arguments": {"text": str(guess)}})
            messages.append({"role": "assistant", "content": f"<tool_call>{call}</tool_call>"})
            obs, reward, terminated, truncated, _ = env.step(messages[-1]["content"])
            if terminated or truncated:
                wins += reward >= 1
                break
            messages.append({"role": "tool", "content": obs})
            lo, hi = (guess + 1, hi) if "low" in obs else (lo, guess - 1)
        rows.append({"messages": messages, "reward": float(reward)})
    return rows, wins / episodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demos", required=True, help="JSONL file to write")
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--noise", type=float, default=0.5, help="chance per guess of a random possible number")
    args = ap.parse_args()
    rows, rate = demonstrations(args.episodes, args.noise)
    with open(args.demos, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {len(rows)} demonstrations to {args.demos}; the noisy expert passes {rate:.2f}")


if __name__ == "__main__":
    main()
