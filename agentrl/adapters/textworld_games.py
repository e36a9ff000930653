"""`agentrl/TextWorld-v0`: TextWorld's generated text adventures, quest length as the horizon knob
(``pip install agentrl[textworld]``).

Each game is made by TextWorld's own generator from a seed (``textworld.generator.make_game``, the
engine behind ``tw-make custom``), with ``quest_length`` actions in its quest, ``rooms`` rooms and
``objects`` objects, and compiled to a Z-machine file by TextWorld's Inform 7. Compiling takes seconds,
so each game is kept under the agentrl cache folder (``$AGENTRL_CACHE``, default ``~/.cache/agentrl``,
the warm starts' folder) in ``textworld/`` and made once per machine. The pool is ``games`` games; an
episode's seed picks one. Game ``i`` of pool ``pool_seed`` is made from generator seed ``1000 * pool_seed + i``
(at most 1000 games a pool, so pools never share a seed); ``split="eval"`` adds 2**31, so a held-out pool's seeds
are a range no training pool reaches. ``info["task_id"]`` names the game by its file (``q2-r3-o5-s1``).

The policy acts with one tool, ``command("open the chest")``; the observation is the game's own text.
The expert is the game's walkthrough from where the player stands (TextWorld's ``policy_commands``,
recomputed every turn, so it also recovers from a slip). ``verify()`` is 1.0 when TextWorld says the
game is won; with ``partial_credit=True`` it is the game's score over its maximum.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import gymnasium

from agentrl.core import AgentEnv

INSTALL_HINT = "TextWorld games need the textworld package: pip install 'agentrl[textworld]'"
# TextWorld parses a game's logic with one module-level parser whose state is not per call: two envs making or
# loading a game at once (the default thread pool) corrupt it. Both are serialised; steps run concurrently.
_LOADING = threading.Lock()
POOL_GAMES = 1000  # a pool's seeds are 1000 * pool_seed + 0..999
# The eval split's generator seeds start here, the training pools' stay below; TextWorld seeds its generator with
# numpy's RandomState, which takes seeds below 2**32, so both ranges fit.
EVAL_SEEDS = 2**31
MAX_POOL_SEED = EVAL_SEEDS // POOL_GAMES - 1


def cache_folder() -> Path:
    """Where generated games are kept: `$AGENTRL_CACHE/textworld`, made on first use."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl")) / "textworld"


def _textworld() -> Any:
    try:
        import textworld
        import textworld.generator
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return textworld


def game_name(quest_length: int, rooms: int, objects: int, seed: int) -> str:
    """A game's name: its cache file's stem and its ``task_id`` (``q2-r3-o5-s1``)."""
    return f"q{quest_length}-r{rooms}-o{objects}-s{seed}"


def make_game_file(quest_length: int, rooms: int, objects: int, seed: int) -> Path:
    """The compiled game for these settings, generated and compiled the first time only. A game is
    built in a private temporary folder and moved into the cache in one step, so two processes that
    make the same game at once never read a half-written file."""
    path = cache_folder() / f"{game_name(quest_length, rooms, objects, seed)}.z8"
    if path.exists() and path.with_suffix(".json").exists():
        return path
    tw = _textworld()
    path.parent.mkdir(parents=True, exist_ok=True)
    options = tw.GameOptions()
    options.seeds = seed
    options.quest_length, options.nb_rooms, options.nb_objects = quest_length, rooms, objects
    with _LOADING:  # the generator parses game logic too
        if path.exists() and path.with_suffix(".json").exists():  # made by another thread while this one waited
            return path
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            options.path = str(Path(tmp) / path.name)
            game = tw.generator.make_game(options)
            compiled = Path(tw.generator.compile_game(game, options))
            for suffix in (".json", ".z8"):  # the .z8 last: its presence says the pair is complete
                os.replace(compiled.with_suffix(suffix), path.with_suffix(suffix))
    return path


def _readable(text: str) -> str:
    """The game's text without TextWorld's ASCII-art banner (lines with no letter in them) and its
    prompt line ("> ... -= Studio =-0/1": the status bar, which repeats the room and the score)."""
    lines = [line.rstrip() for line in text.splitlines()
             if re.search(r"[A-Za-z]", line) and not line.lstrip().startswith(">")]
    return "\n".join(lines).strip()


class TextWorldEnv(AgentEnv):
    """A generated TextWorld game; `command` sends one text command to it."""

    system_prompt = "Play the text adventure with the command tool; do what the objective says."

    def __init__(self, quest_length: int = 2, rooms: int = 3, objects: int = 5, games: int = 4, pool_seed: int = 0,
                 slack: int = 4, partial_credit: bool = False, split: str = "train"):
        if not 1 <= quest_length <= 20:
            raise ValueError(f"TextWorld: quest_length must be between 1 and 20, got {quest_length}")
        if not 1 <= rooms <= 20 or not 0 <= objects <= 40:
            raise ValueError(f"TextWorld: rooms must be 1-20 and objects 0-40, got rooms={rooms} objects={objects}")
        if not 1 <= games <= POOL_GAMES or slack < 0:
            raise ValueError(f"TextWorld: games must be 1-{POOL_GAMES} and slack >= 0, got games={games} slack={slack}")
        if isinstance(pool_seed, bool) or not isinstance(pool_seed, int) or not 0 <= pool_seed <= MAX_POOL_SEED:
            raise ValueError(f"TextWorld: pool_seed must be an int in [0, {MAX_POOL_SEED}], got {pool_seed!r}")
        if split not in ("train", "eval"):
            raise ValueError(f"TextWorld: split must be 'train' or 'eval', got {split!r}")
        # the walkthrough of a generated quest is quest_length commands; slack leaves room for mistakes
        super().__init__(max_turns=quest_length + slack)
        self.quest_length, self.rooms, self.objects = quest_length, rooms, objects
        self.games, self.pool_seed, self.slack, self.partial_credit = games, pool_seed, slack, partial_credit
        self.split = split
        self.first_seed = POOL_GAMES * pool_seed + (EVAL_SEEDS if split == "eval" else 0)  # game i: first_seed + i
        self.tw = _textworld()
        self.infos = self.tw.EnvInfos(policy_commands=True, won=True, lost=True, score=True, max_score=True,
                                      facts=True, objective=True, location=True)
        self.game: Any = None
        self.game_file: Path | None = None
        self.state: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = int(self.np_random.integers(self.games))
        game_file = make_game_file(self.quest_length, self.rooms, self.objects, self.first_seed + index)
        with _LOADING:  # reset (re)loads the game file: the parse happens here, not in start
            if game_file != self.game_file:
                if self.game is not None:
                    self.game.close()
                with warnings.catch_warnings():  # jericho: "not fully supported, score disabled"; TextWorld's score
                    warnings.simplefilter("ignore")
                    self.game = self.tw.start(str(game_file), request_infos=self.infos)
                self.game_file = game_file
            self.state = self.game.reset()
        self._walkthrough_length = len(self.state["policy_commands"])
        return _readable(self.state.feedback), {"task_id": game_file.stem, "state_key": self.state_key()}

    def task_ids(self, limit: int | None = None) -> list[str]:
        """The games of this env's pool, named as ``info["task_id"]`` names them, in order; the first `limit`.
        Named from the settings alone: no game is made."""
        return [game_name(self.quest_length, self.rooms, self.objects, self.first_seed + i)
                for i in range(self.games)][:limit]

    def command(self, text: str) -> str:
        """Send one command to the game, e.g. "go east", "open chest", "take key", "look", "inventory"."""
        text = " ".join(text.split())[:200]
        if not text:
            return "the command is empty; write what to do, e.g. \"look\""
        before = self.state["score"]
        self.state, _score, done = self.game.step(text)
        if self.state["max_score"]:
            self.add_step_reward((self.state["score"] - before) / self.state["max_score"])
        if done:
            self.finish()
        return _readable(self.state.feedback) or "(the game says nothing)"

    tools = [command]

    def verify(self) -> float:
        if not self.partial_credit:
            return float(bool(self.state["won"]))
        return self.state["score"] / self.state["max_score"] if self.state["max_score"] else float(self.state["won"])

    def state_key(self) -> tuple[str, ...]:
        return tuple(sorted(str(f) for f in self.state["facts"]))

    def expert_action(self, noise: float = 0.0) -> str:
        """The next command of the game's own walkthrough from here. With probability `noise` a slip
        that costs a turn and nothing else ("look", "inventory"); with probability `noise / 5` a
        garbled call."""
        rng = self.np_random
        plan = list(self.state["policy_commands"])
        best = plan[0] if plan else "look"  # no walkthrough left: the game is over or lost
        if noise > 0 and rng.random() < noise / 5:
            garbled = ['<tool_call>{"name": "command", "arguments": {"text": ',
                       _call("command", cmd=best), _call("act", text=best)]
            return garbled[int(rng.integers(len(garbled)))]
        if noise > 0 and rng.random() < noise:
            best = ("look", "inventory")[int(rng.integers(2))]
        return _call("command", text=best)

    def __del__(self) -> None:
        game = self.__dict__.get("game")
        if game is not None:
            try:
                game.close()
            except Exception:  # the interpreter may be shutting down; there is nothing to save
                pass

    def __getstate__(self) -> dict[str, Any]:
        # the running game is an interpreter this process holds: a copy in another process starts its own
        state = super().__getstate__()
        state.update(game=None, game_file=None, state=None, tw=None)  # a copy resets before it steps
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.tw = _textworld()  # the module itself does not pickle


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


gymnasium.register(id="agentrl/TextWorld-v0", entry_point="agentrl.adapters.textworld_games:TextWorldEnv",
                   kwargs={"quest_length": 2}, disable_env_checker=True, order_enforce=False)
