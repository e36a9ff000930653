"""Environments from the ecosystem, each behind its own optional extra and imported only when used.

- `agentrl.adapters.openenv.OpenEnvEnv`: any OpenEnv server's environment (``[openenv]``).
- `agentrl.adapters.serve`: any agentrl environment served as an OpenEnv server (``agentrl serve-env``).
- `agentrl.adapters.gym_text.GymTextEnv`: any gymnasium env with text spaces (``--env.id gym:SomeId``).
- `agentrl.adapters.textarena_games`: TextArena's Tower of Hanoi, FrozenLake, Sokoban (``[textarena]``).
- `agentrl.adapters.reasoning_gym_tasks`: reasoning-gym's tasks, single- and multi-turn (``[reasoning-gym]``).
- `agentrl.adapters.textworld_games`: TextWorld's generated adventures, quest length as horizon (``[textworld]``).
- `agentrl.adapters.verifiers_env`: a Prime Intellect verifiers environment, run by verifiers itself with the
  policy's seat pointed at the gateway (``--agent agentrl.adapters.verifiers_env:solve``, ``[verifiers]``).
"""
