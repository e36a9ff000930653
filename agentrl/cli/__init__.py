"""The `agentrl` command, generated from the configuration models.

    agentrl train [--algo turn-ppo] [--config run.yaml] [--set rollout.group_size=4 ...] [--rollout.groups 4 ...]
    agentrl sft --out warm/ [--data demos.jsonl] [--model ...]
    agentrl dpo --model warm/ --out pref/
    agentrl pipeline [--algo grpo]                         # SFT -> DPO -> RL
    agentrl distill --mode rejection|on-policy --teacher MODEL
    agentrl probe [--env ...] | --store RUN_DIR             # horizon report, recommended assigner
    agentrl check-env my_pkg.envs:MyEnv
    agentrl verify-probe --env agentrl/Code-v0
    agentrl report RUN_DIR
    agentrl algos

Every flag of a subcommand is a field of that subcommand's pydantic model, and its `--help` line is
the field's description (tyro builds the parser from the models: nested models become dotted
flags such as `--rollout.group-size`, and a typo is answered with the nearest flag). It was chosen
over pydantic-settings' CLI source because it needs no settings classes (no environment variables
leak into a run's config) and types a nested model's flags exactly, and over jsonargparse because it
reads pydantic's field descriptions and validators as they are. `--config FILE` gives the defaults
(a run's own config.yaml works), `--set KEY=VALUE` overrides any field by its dotted name, and a
flag overrides both. Every error goes to stderr with exit status 2, before any work is done: this
package and `agentrl.config` import neither torch nor transformers.

One module per group of commands, each a pydantic model of its flags and a `cmd_*` function that
parses, checks, calls the layers below and prints:

    flags         what the commands share: --config / --set / --agent, the generated parser, the checks
                  that fail before any work (UsageError), --resume / --overwrite
    training      train, sft, dpo, pipeline, distill, serve-policy
    probe         probe
    environments  check-env, serve-env, show-prompt, verify-probe
    info          report, algos, models
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Sequence

from agentrl.cli.environments import cmd_check_env, cmd_serve_env, cmd_show_prompt, cmd_verify_probe
from agentrl.cli.flags import UsageError, _err
from agentrl.cli.info import cmd_algos, cmd_models, cmd_report
from agentrl.cli.probe import cmd_probe
from agentrl.cli.training import cmd_distill, cmd_dpo, cmd_pipeline, cmd_serve_policy, cmd_sft, cmd_train

COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "train": (cmd_train, "RL on an environment (defaults: tiny policy, SFT warm start, Vault, CPU, minutes)"),
    "sft": (cmd_sft, "stage one: fine-tune on demonstrations"),
    "dpo": (cmd_dpo, "stage two: DPO / SimPO / IPO on multi-turn episodes"),
    "pipeline": (cmd_pipeline, "SFT -> (distill) -> DPO -> RL with the held-out pass rate after every stage"),
    "distill": (cmd_distill, "distil a teacher into the student: rejection sampling + SFT, or on-policy"),
    "probe": (cmd_probe, "horizon report: measure episodes and recommend a credit assigner"),
    "check-env": (cmd_check_env, "does an environment follow the AgentEnv contract?"),
    "serve-env": (cmd_serve_env, "serve an environment as an OpenEnv server"),
    "serve-policy": (cmd_serve_policy, "train an agent in another process through an OpenAI-compatible endpoint"),
    "verify-probe": (cmd_verify_probe, "what does an environment's verifier wrongly accept?"),
    "report": (cmd_report, "markdown + HTML report of a run"),
    "algos": (cmd_algos, "list the credit assigners"),
    "show-prompt": (cmd_show_prompt, "print an env's first prompt exactly as a model sees it; check its layout"),
    "models": (cmd_models, "list or fetch the real instruct models agentrl can get without a model hub"),
}


def _overview() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items())
    return ("usage: agentrl COMMAND [--help] [FLAGS]\n\nMulti-turn agentic RL for language-model agents.\n\n"
            f"commands:\n{rows}\n\n`agentrl COMMAND --help` lists a command's flags, each with why its default is what "
            "it is.")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_overview(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    from agentrl import log

    log.setup()
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        _err(f"unknown command {name!r}" + (f"; did you mean {near[0]!r}?" if near else "") + " (commands: "
             f"{', '.join(COMMANDS)})")
        return 2
    try:
        return int(COMMANDS[name][0](rest) or 0)
    except UsageError as e:
        _err(str(e))
        return 2
    except RuntimeError as e:  # a named model that could not be fetched, or whose cached copy is damaged
        models = sys.modules.get("agentrl.models")  # imported by whatever fetched (not here: it loads torch)
        if models is None or not isinstance(e, models.ModelFetchError):
            raise
        _err(str(e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
