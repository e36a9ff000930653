"""Drive many environments against one engine, turn by turn, into `Episode`s.

Every turn is one batched `generate()` over all unfinished episodes; each environment then steps
on its own action, and its observation's tokens are appended to that row's cache. Episodes that
end leave the batch. The environment sees only text and the engine only tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.core import AgentEnv, EnvError, Episode, Turn
from agentrl.engines.base import Engine
from agentrl.policy import ChatFormat


@dataclass
class RolloutStats:
    episodes: int = 0
    turns: int = 0
    action_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.action_tokens / self.seconds if self.seconds > 0 else 0.0


def rollout(
    envs: Sequence[AgentEnv],
    seeds: Sequence[int],
    engine: Engine,
    chat: ChatFormat,
    *,
    group_ids: Sequence[int] | None = None,
    max_context: int | None = None,
    max_new_tokens: int = 0,
) -> tuple[list[Episode], RolloutStats]:
    """Run one episode in each env (env i reset with seeds[i]) to its end.

    An episode whose next turn would not fit in `max_context` tokens (prompt, history and
    `max_new_tokens`) is ended as truncated and judged by the verifier as it stands. An env that
    raises (`EnvError`) ends its episode with `error` set; the others go on.
    """
    if len(envs) != len(seeds):
        raise ValueError(f"rollout: {len(envs)} envs but {len(seeds)} seeds")
    t0 = time.perf_counter()
    group_ids = list(group_ids) if group_ids is not None else list(range(len(envs)))
    episodes, prompts = [], []
    for env, seed, gid in zip(envs, seeds, group_ids):
        obs, _ = env.reset(seed=seed)
        prompt = chat.prompt_ids(obs, env.tool_schemas(), env.system_prompt)
        prompts.append(prompt)
        episodes.append(Episode(prompt_ids=prompt, env_id=env.name, task_id=f"{env.name}:{seed}", group_id=gid, seed=seed))
    ctx = [len(p) for p in prompts]
    session = engine.open(prompts)
    while session.rows:
        gens = session.generate()
        keep, chunks = [], []
        for pos, (row, gen) in enumerate(zip(list(session.rows), gens)):
            env, ep = envs[row], episodes[row]
            action = chat.decode(gen.ids)
            try:
                obs, reward, terminated, truncated, info = env.step(action)
            except EnvError as e:
                ep.error = str(e)
                continue
            obs_ids = chat.observation_ids(obs, ended_with_eos=gen.finish == "eos")
            key = info.get("state_key")
            ep.turns.append(
                Turn(ctx[row], gen.ids, gen.logprobs, obs_ids, action, obs, float(info.get("step_reward") or 0.0),
                     None if key is None else repr(key), int(info.get("malformed", 0)), gen.hidden)
            )
            ctx[row] += len(gen.ids) + len(obs_ids)
            if not (terminated or truncated) and max_context is not None and ctx[row] + max_new_tokens > max_context:
                try:
                    reward, truncated = env.truncate(), True
                except EnvError as e:
                    ep.error = str(e)
                    continue
            if terminated or truncated:
                ep.reward, ep.terminated, ep.truncated = float(reward), bool(terminated), bool(truncated)
                continue
            keep.append(pos)
            chunks.append(obs_ids)
        session.keep(keep)
        if keep:
            session.extend(chunks)
    stats = RolloutStats(len(episodes), sum(e.num_turns for e in episodes), sum(e.num_action_tokens for e in episodes), time.perf_counter() - t0)
    return episodes, stats
