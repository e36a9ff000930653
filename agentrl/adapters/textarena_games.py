"""TextArena single-player games as agentrl environments, each with a size knob that sets the horizon.

=============================  ==========  ==================================================================
id                             knob        horizon (an optimal episode) / expert
=============================  ==========  ==================================================================
``agentrl/TA-TowerOfHanoi-v0``  ``disks``   exactly ``2**disks - 1`` moves / the recursive solution from any state
``agentrl/TA-FrozenLake-v0``    ``size``    exactly ``2 * (size - 1)`` moves / breadth-first search on the board
``agentrl/TA-Sokoban-v0``       ``size``    1 to ``3 * size`` moves (redrawn above) / breadth-first search over pushes
=============================  ==========  ==================================================================

The game itself is TextArena's (``pip install agentrl[textarena]``): its board generation, its move
rules, its messages and its reward. What the adapter changes, and why:

- the policy moves through a tool (``move(source, target)`` or ``move(direction)``), so its tool-call
  syntax is the one it uses everywhere else; the tool writes the game's bracket action (``[A C]``);
- the turn budget is agentrl's ``max_turns`` (optimal length + ``slack``): the game's own turn limit is
  set past it, so running out is ``truncated`` here, never a game-over the verifier cannot tell apart;
- by default an illegal move (a disk onto a smaller one, a wall) is the game's warning and costs a
  turn, instead of TextArena's rule that a second illegal move in a row loses (``error_allowance=1``
  restores it): the policy learns from the message, as from Vault's wrong code;
- ``verify()`` is 1.0 exactly when the game declared the win; with ``partial_credit=True`` it is the
  game's own reward instead (its completion fraction on a loss, on truncation the fraction the game
  would report at its turn limit). ``info["step_reward"]`` is the change of that completion fraction.

TextArena draws its boards from Python's global ``random`` (it calls ``random.seed``). Every call into
a game runs under a lock with the global state swapped for the game's own, so an episode is
reproducible from agentrl's seed and other code's ``random`` is left as it was.

>>> env = HanoiEnv(disks=2)
>>> obs, _ = env.reset(seed=0)
>>> moves = 0
>>> while True:
...     obs, reward, terminated, truncated, info = env.step(env.expert_action())
...     moves += 1
...     if terminated or truncated:
...         break
>>> reward, terminated, moves
(1.0, True, 3)
"""

import json
import random
import threading
from collections import deque
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import gymnasium

from agentrl.core import AgentEnv

INSTALL_HINT = "TextArena games need the textarena package: pip install 'agentrl[textarena]'"
_GLOBAL_RANDOM = threading.Lock()  # TextArena's games read and seed the process-wide `random`


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return textarena


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class TextArenaEnv(AgentEnv):
    """One TextArena single-player game behind a tool. A subclass builds the game (`_new_game`), names
    its tool, and says how to read the board (`state_key`, `expert_action`)."""

    def __init__(self, optimal_turns: int, slack: int, partial_credit: bool, error_allowance: int | None):
        if slack < 0:
            raise ValueError(f"{type(self).__name__}: slack must be >= 0, got {slack}")
        if error_allowance is not None and error_allowance < 0:
            raise ValueError(f"{type(self).__name__}: error_allowance must be >= 0 or None, got {error_allowance}")
        super().__init__(max_turns=optimal_turns + slack)
        self.slack, self.partial_credit, self.error_allowance = slack, partial_credit, error_allowance
        self.ta = _textarena()
        self.game: Any = None
        self._game_random: Any = None  # the global `random` state as the game left it
        self._won = False
        self._outcome: float | None = None  # the game's reward when it ended the episode itself

    # -- the game, under its own random state ----------------------------------------------------

    @contextmanager
    def _in_game(self) -> Iterator[None]:
        with _GLOBAL_RANDOM:
            outside = random.getstate()
            if self._game_random is not None:
                random.setstate(self._game_random)
            try:
                yield
            finally:
                self._game_random = random.getstate()
                random.setstate(outside)

    def _new_game(self, game_seed: int) -> Any:
        """Build and reset the TextArena game for this episode (called under `_in_game`)."""
        raise NotImplementedError

    def _intro(self) -> str:
        raise NotImplementedError

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        game_seed = int(self.np_random.integers(2**31 - 1))
        self._game_random = None
        with self._in_game():
            self.game = self._new_game(game_seed)
        state = self.game.state
        # agentrl's turn budget binds first: the game's limit counts only legal moves, so one past ours is never hit
        state.max_turns = self.max_turns + 1
        if hasattr(self.game, "max_turns"):
            self.game.max_turns = self.max_turns + 1
        state.error_allowance = self.max_turns + 1 if self.error_allowance is None else self.error_allowance
        self._won, self._outcome = False, None
        return self._intro() + "\n" + self._messages(), {"state_key": self.state_key(), "game_seed": game_seed}

    def _messages(self) -> str:
        """What the game said since the last call: its descriptions and board, not its echo of our
        action nor its prompt (which asks for bracket text, while here moves go through the tool)."""
        kinds = self.ta.ObservationType
        _, messages = self.game.get_observation()
        return "\n".join(m.strip() for _, m, kind in messages if kind not in (kinds.PLAYER_ACTION, kinds.PROMPT))

    def _play(self, action: str) -> str:
        """Send one bracket action to the game; the game's answer is the observation."""
        before = self._completion()
        with self._in_game():
            done, _ = self.game.step(action)
        self.add_step_reward(self._completion() - before)
        text = self._messages()
        if done:
            self._outcome = float(self.game.state.rewards[0])
            self._won = self._outcome >= 1.0
            reason = self.game.state.game_info[0].get("reason", "")
            text = f"{text}\n{reason}".strip()
            self.finish()
        return text

    def _completion(self) -> float:
        """The game's own progress measure (its reward at its turn limit)."""
        return float(self.game._get_percentage_completion())

    def verify(self) -> float:
        if not self.partial_credit:
            return float(self._won)
        return self._outcome if self._outcome is not None else self._completion()


# ---------------------------------------------------------------------------------------------
# Tower of Hanoi

PEGS = ("A", "B", "C")


def hanoi_next_move(peg_of: dict[int, str], disk: int, target: str) -> tuple[str, str] | None:
    """The optimal next move that brings disks 1..`disk` (1 the smallest) onto `target`, from any legal
    position; None when they are there already. To move disk k, the disks above it must first gather
    on the third peg, so the first move of that sub-task comes first.

    >>> hanoi_next_move({1: "A", 2: "A"}, 2, "C"), hanoi_next_move({1: "B", 2: "A"}, 2, "C")
    (('A', 'B'), ('A', 'C'))
    """
    while disk >= 1 and peg_of[disk] == target:
        disk -= 1
    if disk == 0:
        return None
    spare = next(p for p in PEGS if p not in (peg_of[disk], target))
    return hanoi_next_move(peg_of, disk - 1, spare) or (peg_of[disk], target)


def random_hanoi_position(disks: int, rng: random.Random) -> dict[str, list[int]]:
    """A legal Tower of Hanoi position other than the solved one, uniform over the 3**disks - 1 others: each
    disk on any tower, each tower's disks largest first (bottom to top, as TextArena lists them).

    >>> t = random_hanoi_position(3, random.Random(0))
    >>> sorted(d for p in t.values() for d in p), all(p == sorted(p, reverse=True) for p in t.values())
    ([1, 2, 3], True)
    """
    while True:
        towers: dict[str, list[int]] = {p: [] for p in PEGS}
        for disk in range(disks, 0, -1):
            towers[PEGS[rng.randrange(3)]].append(disk)
        if len(towers["C"]) < disks:
            return towers


class HanoiEnv(TextArenaEnv):
    """TextArena's Tower of Hanoi: move `disks` disks onto tower C; from TextArena's start (every disk on A,
    `start="tower"`) optimal is 2**disks - 1 moves. With `start="random"` every episode begins from a legal
    position drawn uniformly from the episode's seed (each disk on any tower, larger below smaller; never the
    solved one), so a held-out episode is a new puzzle; no position is further than 2**disks - 1 moves from
    the goal, so the turn budget is the same."""

    system_prompt = "Solve the Tower of Hanoi with the move tool."

    def __init__(self, disks: int = 3, slack: int = 2, partial_credit: bool = False,
                 error_allowance: int | None = None, start: Literal["tower", "random"] = "tower"):
        if not 1 <= disks <= 9:
            raise ValueError(f"TA-TowerOfHanoi: disks must be between 1 and 9 (2**9 - 1 = 511 moves), got {disks}")
        if start not in ("tower", "random"):
            raise ValueError(f"TA-TowerOfHanoi: start must be 'tower' (all disks on A) or 'random', got {start!r}")
        self.disks, self.start = disks, start
        super().__init__(2**disks - 1, slack, partial_credit, error_allowance)

    def _new_game(self, game_seed: int) -> Any:
        from textarena.envs.TowerOfHanoi.env import TowerOfHanoiEnv

        game = TowerOfHanoiEnv(num_disks=self.disks)
        game.reset(num_players=1, seed=game_seed)
        if self.start == "random":
            towers = random_hanoi_position(self.disks, random.Random(game_seed))
            game.get_observation()  # drop the board TextArena drew for its own start
            game.state.game_state["towers"] = towers
            game.state.add_observation(message=f"Current Board: \n{game._render_board()}.",
                                       observation_type=self.ta.ObservationType.GAME_BOARD)
        return game

    def _intro(self) -> str:
        where = "from tower A " if self.start == "tower" else "from where they stand "
        return (f"Tower of Hanoi with {self.disks} disks (1 is the smallest): move them all {where}to tower C, "
                "one top disk per move(source, target); a disk may only go onto an empty tower or a larger disk.")

    def move(self, source: Literal["A", "B", "C"], target: Literal["A", "B", "C"]) -> str:
        """Move the top disk of tower `source` onto tower `target`."""
        return self._play(f"[{source} {target}]")

    tools = [move]

    def _towers(self) -> dict[str, list[int]]:
        return self.game.state.game_state["towers"]

    def state_key(self) -> Hashable:
        return tuple(tuple(self._towers()[p]) for p in PEGS)

    def _legal_moves(self) -> list[tuple[str, str]]:
        t = self._towers()
        return [(s, d) for s in PEGS for d in PEGS if s != d and t[s] and (not t[d] or t[d][-1] > t[s][-1])]

    def expert_action(self, noise: float = 0.0) -> str:
        """The optimal move from wherever the disks are. With probability `noise` a slip: another legal
        move (it costs the turns needed to undo it); with probability `noise / 5` an illegal move or a
        garbled call, so that demonstrations show the game's warning and a recovery from it."""
        rng = self.np_random
        peg_of = {d: p for p in PEGS for d in self._towers()[p]}
        best = hanoi_next_move(peg_of, self.disks, "C")
        assert best is not None, "the expert was asked to move in a solved position"
        if noise > 0 and rng.random() < noise / 5:
            t = self._towers()
            illegal = [(s, d) for s in PEGS for d in PEGS if t[s] and t[d] and t[d][-1] < t[s][-1]]
            garbled = [_call("move", source=best[0]), _call("move", source=best[0], target="D")]
            if illegal:
                garbled.append(_call("move", source=illegal[0][0], target=illegal[0][1]))
            return garbled[int(rng.integers(len(garbled)))]
        others = [m for m in self._legal_moves() if m != best]
        if noise > 0 and others and rng.random() < noise:
            best = others[int(rng.integers(len(others)))]
        return _call("move", source=best[0], target=best[1])


# ---------------------------------------------------------------------------------------------
# Grid games: FrozenLake and Sokoban

DIRECTIONS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
Direction = Literal["up", "down", "left", "right"]


def _bfs(start: Hashable, is_goal: Any, successors: Any, limit: int = 200_000) -> list[str] | None:
    """The shortest list of directions from `start` to a goal state; None if there is none (or the
    search passed `limit` states). `successors(state)` yields (direction, next_state)."""
    parent: dict[Hashable, tuple[Hashable, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if is_goal(state):
            path = []
            while parent[state] is not None:
                state, step = parent[state]
                path.append(step)
            return path[::-1]
        for step, nxt in successors(state):
            if nxt not in parent:
                if len(parent) >= limit:
                    return None
                parent[nxt] = (state, step)
                queue.append(nxt)
    return None


class _GridGame(TextArenaEnv):
    def move(self, direction: Direction) -> str:
        """Move one cell up, down, left or right."""
        return self._play(f"[{direction}]")

    tools = [move]

    def _plan(self) -> list[str]:
        raise NotImplementedError

    def _safe_directions(self) -> list[str]:
        return list(DIRECTIONS)

    def expert_action(self, noise: float = 0.0) -> str:
        """The first step of a shortest solution from here. With probability `noise` a slip: another
        direction that does not lose the game outright (a detour, or a wall: the game's warning); with
        probability `noise / 5` a garbled call."""
        rng = self.np_random
        plan = self._plan()
        best = plan[0] if plan else "up"  # lost already (a policy's move, never the expert's): nothing better to do
        if noise > 0 and rng.random() < noise / 5:
            garbled = [_call("move", direction="north"), _call("move", dir=best), _call("move", direction=best)[:-12]]
            return garbled[int(rng.integers(len(garbled)))]
        others = [d for d in self._safe_directions() if d != best]
        if noise > 0 and others and rng.random() < noise:
            best = others[int(rng.integers(len(others)))]
        return _call("move", direction=best)


class FrozenLakeEnv(_GridGame):
    """TextArena's FrozenLake on a `size` x `size` board: walk from the top-left corner to the goal at the
    bottom-right without stepping into a hole. Boards whose shortest safe path is longer than the corner-
    to-corner distance are redrawn, so every episode's horizon is exactly 2 * (size - 1) moves."""

    system_prompt = "Cross the frozen lake with the move tool."

    def __init__(self, size: int = 4, holes: int | None = None, slack: int = 2, partial_credit: bool = False,
                 error_allowance: int | None = None):
        if not 2 <= size <= 12:
            raise ValueError(f"TA-FrozenLake: size must be between 2 and 12, got {size}")
        holes = size * size // 5 if holes is None else holes  # TextArena's own boards: 3 holes on 4x4
        if not 0 <= holes <= size * size - 2 * size + 1:
            # a monotone path of 2*size - 1 cells must stay free
            raise ValueError(f"TA-FrozenLake: holes must be between 0 and {size * size - 2 * size + 1} on a "
                             f"{size}x{size} board, got {holes}")
        self.size, self.holes = size, holes
        super().__init__(2 * (size - 1), slack, partial_credit, error_allowance)

    def _new_game(self, game_seed: int) -> Any:
        from textarena.envs.FrozenLake.env import FrozenLakeEnv as Game

        game = Game(size=self.size, num_holes=self.holes)
        for attempt in range(1000):
            game.reset(num_players=1, seed=game_seed + attempt)
            path = _bfs(game.state.game_state["player_pos"], self._at_goal(game), self._successors(game))
            if path is not None and len(path) == 2 * (self.size - 1):
                return game
            game.get_observation()  # drop the redrawn board's messages
        raise RuntimeError(f"TA-FrozenLake: no board with a shortest path of {2 * (self.size - 1)} moves in 1000 "
                           f"draws (size {self.size}, {self.holes} holes); use fewer holes")

    def _intro(self) -> str:
        return (f"FrozenLake, {self.size}x{self.size}: walk from P (top-left) to G (bottom-right) with "
                "move(direction); stepping on H (a hole) loses.")

    @staticmethod
    def _at_goal(game: Any) -> Any:
        grid = game.state.game_state["grid"]
        return lambda pos: grid[pos[0]][pos[1]] == "G"

    @staticmethod
    def _successors(game: Any) -> Any:
        grid, n = game.state.game_state["grid"], game.size

        def successors(pos: tuple[int, int]) -> Iterator[tuple[str, tuple[int, int]]]:
            for name, (dr, dc) in DIRECTIONS.items():
                r, c = pos[0] + dr, pos[1] + dc
                if 0 <= r < n and 0 <= c < n and grid[r][c] != "H":
                    yield name, (r, c)

        return successors

    def state_key(self) -> Hashable:
        return tuple(self.game.state.game_state["player_pos"])

    def _plan(self) -> list[str]:
        return _bfs(tuple(self.game.state.game_state["player_pos"]), self._at_goal(self.game),
                    self._successors(self.game)) or []

    def _safe_directions(self) -> list[str]:
        r, c = self.game.state.game_state["player_pos"]
        grid = self.game.state.game_state["grid"]
        inside = lambda r, c: 0 <= r < self.size and 0 <= c < self.size  # noqa: E731
        return [d for d, (dr, dc) in DIRECTIONS.items() if not inside(r + dr, c + dc) or grid[r + dr][c + dc] != "H"]


WALL, TARGET, BOX_ON_TARGET, BOX = 0, 2, 3, 4  # TextArena's Sokoban cell codes (1 floor, 5 player)


class SokobanEnv(_GridGame):
    """TextArena's Sokoban in a `size` x `size` room with `boxes` boxes: push every box onto a target.
    Rooms whose shortest solution is longer than 3 * size moves are redrawn, so the turn budget
    3 * size + slack always leaves room for `slack` mistakes."""

    system_prompt = "Solve the Sokoban puzzle with the move tool."

    def __init__(self, size: int = 6, boxes: int = 1, slack: int = 2, partial_credit: bool = False,
                 error_allowance: int | None = None):
        if not 5 <= size <= 9:
            raise ValueError(f"TA-Sokoban: size must be between 5 and 9, got {size}")
        if not 1 <= boxes <= 3:
            raise ValueError(f"TA-Sokoban: boxes must be between 1 and 3, got {boxes}")
        self.size, self.boxes = size, boxes
        super().__init__(3 * size, slack, partial_credit, error_allowance)

    def _new_game(self, game_seed: int) -> Any:
        from textarena.envs.Sokoban.env import SokobanEnv as Game

        game = Game(dim_room=(self.size, self.size), num_boxes=self.boxes)
        for attempt in range(100):
            game.reset(num_players=1, seed=game_seed + 1000 * attempt)  # the game itself retries seed + k
            path = self._solve(game)
            if path is not None and len(path) <= 3 * self.size:
                return game
            game.get_observation()
        raise RuntimeError(f"TA-Sokoban: no room of size {self.size} with {self.boxes} box(es) solvable in "
                           f"{3 * self.size} moves in 100 draws")

    def _intro(self) -> str:
        return (f"Sokoban, {self.size}x{self.size}, {self.boxes} box(es): push every box X onto a target O with "
                "move(direction); you are P, # is a wall, a box on a target shows as √; boxes cannot be pulled.")

    @staticmethod
    def _problem(game: Any) -> tuple[Any, Any, Any]:
        """(the current state, is_goal, successors) of the room, for `_bfs`; a state is (player, boxes)."""
        fixed, room = game.room_fixed, game.room_state
        rows, cols = fixed.shape
        targets = {(int(r), int(c)) for r in range(rows) for c in range(cols) if fixed[r, c] == TARGET}
        boxes = frozenset((r, c) for r in range(rows) for c in range(cols) if room[r, c] in (BOX, BOX_ON_TARGET))
        player = tuple(int(x) for x in game.player_position)
        free = lambda r, c: 0 <= r < rows and 0 <= c < cols and fixed[r, c] != WALL  # noqa: E731

        def successors(state: tuple[tuple[int, int], frozenset]) -> Iterator[tuple[str, Any]]:
            (r, c), bx = state
            for name, (dr, dc) in DIRECTIONS.items():
                nr, nc = r + dr, c + dc
                if not free(nr, nc):
                    continue
                if (nr, nc) in bx:  # a push: the cell beyond must be free floor without a box
                    br, bc = nr + dr, nc + dc
                    if free(br, bc) and (br, bc) not in bx:
                        yield name, ((nr, nc), (bx - {(nr, nc)}) | {(br, bc)})
                else:
                    yield name, ((nr, nc), bx)

        return (player, boxes), (lambda s: s[1] <= targets), successors

    @classmethod
    def _solve(cls, game: Any) -> list[str] | None:
        return _bfs(*cls._problem(game))

    def state_key(self) -> Hashable:
        room = self.game.room_state
        boxes = tuple(sorted((int(r), int(c)) for r, c in zip(*((room == BOX) | (room == BOX_ON_TARGET)).nonzero())))
        return (tuple(int(x) for x in self.game.player_position), boxes)

    def _plan(self) -> list[str]:
        return self._solve(self.game) or []

    def _safe_directions(self) -> list[str]:
        # a slip may waste turns or bump a wall, never push a box where it can no longer reach a target
        start, is_goal, successors = self._problem(self.game)
        legal = dict(successors(start))
        return [d for d in DIRECTIONS if d not in legal or _bfs(legal[d], is_goal, successors) is not None]


for _name, _cls, _kwargs in [("TowerOfHanoi", "HanoiEnv", {"disks": 3}), ("FrozenLake", "FrozenLakeEnv", {"size": 4}),
                             ("Sokoban", "SokobanEnv", {"size": 6, "boxes": 1})]:
    gymnasium.register(id=f"agentrl/TA-{_name}-v0", entry_point=f"agentrl.adapters.textarena_games:{_cls}",
                       # make() returns the bare AgentEnv
                       kwargs=_kwargs, disable_env_checker=True, order_enforce=False)
