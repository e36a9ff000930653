"""`GymTextEnv`: any gymnasium environment whose observations and actions are text, without code.

    agentrl check-env gym:MyTextGame-v0
    agentrl train --env.id gym:MyTextGame-v0 --model ...

`agentrl.make("gym:SomeId", **kwargs)` builds ``gymnasium.make("SomeId", **kwargs)`` (any id gymnasium
knows, ``module:SomeId`` included, which imports the module that registers it) and wraps it. Both of
its spaces must be `gymnasium.spaces.Text`.

The policy acts through one tool, ``act(text)``, in agentrl's tool-call convention, so that a
malformed call is an observation the policy learns from and is counted, as in every agentrl env.
An action outside the action space (too long, too short, a character the space does not allow) is
the policy's mistake too: it is answered with what the space accepts, counted, and not sent.

A source env that has a method ``expert_action(noise)`` returning its next action's text (a scripted
player, slipping with probability `noise`, drawing from its own ``np_random``) is the wrapper's expert:
without ``--model``, `agentrl train` warm-starts the tiny policy on it (`examples/gym_guess.py`).

Rewards: each step's reward goes to ``info["step_reward"]``; the episode's reward (agentrl's
terminal reward ``R``) is their sum, the return. ``terminated`` and ``truncated`` are the source's
(its TimeLimit included); `max_turns` (default: the spec's ``max_episode_steps``, else 16) counts
every turn, malformed ones too, and running out of it is ``truncated``. An exception raised by the
source's ``reset`` or ``step`` is an `EnvError` naming the env, episode and turn.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import gymnasium as gym
from gymnasium import spaces
from pydantic import AfterValidator, ConfigDict, create_model

from agentrl.core import AgentEnv, EnvError, Tool
from agentrl.loading import import_from_cwd

DEFAULT_MAX_TURNS = 16


def _describe(space: spaces.Text) -> str:
    allowed = "".join(sorted(space.character_set))
    chars = allowed if len(allowed) <= 100 else f"{len(allowed)} characters, e.g. {allowed[:40]}..."
    return f"{space.min_length}-{space.max_length} characters from: {chars!r}"


class GymTextEnv(AgentEnv):
    """A gymnasium text env (both spaces `spaces.Text`) as an `AgentEnv` (see the module docstring).

    >>> import gymnasium as gym
    >>> class Parrot(gym.Env):
    ...     observation_space = action_space = gym.spaces.Text(max_length=20)
    ...     def reset(self, *, seed=None, options=None):
    ...         super().reset(seed=seed)
    ...         return "say hi", {}
    ...     def step(self, action):
    ...         return "you said " + action, float(action == "hi"), True, False, {}
    >>> env = GymTextEnv(Parrot())
    >>> env.reset(seed=0)
    ('say hi', {})
    >>> env.step('<tool_call>{"name": "act", "arguments": {"text": "hi"}}</tool_call>')[:4]
    ('you said hi', 1.0, True, False)
    """

    def __init__(self, env: str | gym.Env, max_turns: int | None = None, system_prompt: str | None = None,
                 **kwargs: Any):
        if isinstance(env, str):
            module, _, _name = env.rpartition(":")
            if module and module not in sys.modules:
                # gymnasium imports `module` by name only; console scripts (`agentrl ...`) and `python
                # path/to/script.py` leave the current folder off sys.path, so import it from there first
                try:
                    import_from_cwd(module)
                except ModuleNotFoundError as e:
                    raise ValueError(f"gym:{env}: cannot import {module!r} ({e}); run from the folder that holds "
                                     "it or add that folder to PYTHONPATH") from e
            try:
                inner = gym.make(env, **kwargs)
            except gym.error.Error as e:
                raise ValueError(f"gym:{env}: gymnasium cannot build it ({e})") from e
            self.gym_id = env
        else:
            if kwargs:
                raise ValueError(f"GymTextEnv: keyword arguments {sorted(kwargs)} are for gymnasium.make; an env "
                                 "instance is built already")
            inner, self.gym_id = env, env.spec.id if env.spec is not None else type(env).__name__
        for which in ("observation_space", "action_space"):
            space = getattr(inner, which)
            if not isinstance(space, spaces.Text):
                raise ValueError(f"gym:{self.gym_id}: its {which} is {space}, not gymnasium.spaces.Text; agentrl's "
                                 "policies read and write text (wrap the env so that both spaces are Text)")
        self.inner = inner
        spec_limit = inner.spec.max_episode_steps if inner.spec is not None else None
        if system_prompt is not None:
            self.system_prompt = system_prompt
        super().__init__(max_turns=max_turns or spec_limit or DEFAULT_MAX_TURNS)
        self._tools = {"act": self._act_tool()}
        self._return, self._inner_truncated = 0.0, False

    @property
    def name(self) -> str:
        return f"gym:{self.gym_id}"

    def _act_tool(self) -> Tool:
        space: spaces.Text = self.inner.action_space

        def in_space(text: str) -> str:
            if not space.contains(text):
                raise ValueError(f"the action must be {_describe(space)}")
            return text

        params = create_model("act_args", __config__=ConfigDict(extra="forbid"),
                              text=(Annotated[str, AfterValidator(in_space)], ...))
        return Tool("act", f"Send your action to the environment ({_describe(space)}).", params, self._act)

    def _act(self, text: str) -> str:
        if self._finished or self._inner_truncated:
            return "error: the episode has already ended; this action was not sent"
        obs, reward, terminated, truncated, _info = self._source("step", self.inner.step, text)
        self._return += float(reward)
        self.add_step_reward(float(reward))
        if terminated:
            self.finish()
        self._inner_truncated = bool(truncated) and not terminated
        return self._text(obs)

    def _source(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # the wrapped env's bug: an errored episode, never a reward of 0
            raise EnvError(f"{self._where()}: the gymnasium env's {what}() raised {type(e).__name__}: {e}") from e

    def _text(self, obs: Any) -> str:
        if not isinstance(obs, str):
            raise EnvError(f"{self._where()}: the gymnasium env returned a {type(obs).__name__} observation, not text")
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._return, self._inner_truncated = 0.0, False
        obs, info = self._source("reset", self.inner.reset, seed=seed, options=options)
        return self._text(obs), dict(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if self._inner_truncated and not (terminated or truncated):  # the source's own time limit
            self._ended, truncated = True, True
            reward = float(self._guard("verify", self.verify))
        return obs, reward, terminated, truncated, info

    def verify(self) -> float:
        return self._return

    def expert_action(self, noise: float = 0.0) -> str:
        """The source's own `expert_action(noise)` text, sent through the `act` tool."""
        source = getattr(self.inner.unwrapped, "expert_action", None)
        if source is None:
            raise NotImplementedError(f"gym:{self.gym_id} has no expert_action(noise) method")
        return f"<tool_call>{json.dumps({'name': 'act', 'arguments': {'text': str(source(noise))}})}</tool_call>"

    def close(self) -> None:
        self.inner.close()

    def __setstate__(self, state: dict[str, Any]) -> None:  # a worker process: the tool is rebuilt, not pickled
        self.__dict__.update(state)
        self._tools = {"act": self._act_tool()}
