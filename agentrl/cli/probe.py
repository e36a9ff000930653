"""`agentrl probe`: the horizon report of a short rollout or a saved store, and the assigner it recommends
(the workflow is `agentrl.probe.run`'s; this module parses the flags and prints)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError

from agentrl.cli.flags import UsageError, _check_agent, _check_env, _console, _kv, _parse, _validate
from agentrl.config import Strict, TrainConfig, _deep_update, describe_errors, read_yaml

if TYPE_CHECKING:
    from agentrl.probe.result import ProbeResult


class ProbeCommand(Strict):
    env: str | None = Field(None, description="Environment id or module:Class to roll out (default agentrl/Vault-v0); "
                            "excludes --store.")
    store: str | None = Field(None, description="Probe a saved store instead of rolling out: a Parquet file, a folder "
                              "of them, or a run folder (its store/).")
    env_kw: list[str] = Field([], description="An environment constructor argument KEY=VALUE, e.g. locks=4 "
                              "(repeatable).")
    model: str | None = Field(None, description="HF hub id or folder; default: the tiny policy's SFT warm start.")
    agent: str | None = Field(None, description="Probe an agent of your own through the gateway instead of an env: "
                              "FILE.py:solve (docs/gateway.md); its tasks from the module's tasks(seed) or "
                              "--agent-tasks, its warm start from --agent-demos when there is no --model.")
    agent_tasks: str | None = Field(None, description="With --agent: a JSONL file of tasks or FILE.py:fn.")
    agent_demos: str | None = Field(None, description="With --agent and no --model: its OpenAI-format "
                                    "demonstrations, which warm-start the tiny policy.")
    groups: int = Field(8, ge=1, description="Tasks to roll out: enough groups for the group statistics to mean "
                        "something.")
    group_size: int | None = Field(None, ge=2, description="Episodes per task; default the train config's (8).")
    seed: int | None = Field(None, description="Seeds the rollout; default the train config's.")
    config: str | None = Field(None, description="A train config (YAML) to take the environment, model and budget "
                               "from.")
    out: str = Field("runs/probe", description="Report folder: report.json, report.md, report.html.")
    sweep: str | None = Field(None, description="Derive the thresholds from this horizon sweep's JSON instead of the "
                              "calibration that ships with agentrl.")
    threshold: list[str] = Field([], description="Override a threshold, KEY=VALUE, e.g. horizon_cutoff=12 "
                                 "(repeatable).")
    budget: int | None = Field(None, ge=1, description="Planned training episodes; default for --env: the config's "
                               "updates x groups x group size.")
    bakeoff: bool = Field(False, description="Also train each candidate assigner briefly from the same start and plot "
                          "the learning curves (minutes per assigner).")
    bakeoff_updates: int = Field(10, ge=1, description="Updates per bake-off run.")
    bakeoff_algos: list[str] | None = Field(None, description="Assigners to run in the bake-off; default all "
                                            "registered that need no teacher.")
    bakeoff_eval: int = Field(32, ge=1, description="Held-out episodes per bake-off evaluation.")


def _probe_config(cmd: ProbeCommand) -> TrainConfig:
    """The train config whose environment (or agent), policy and seed the probe rolls out: --config's, with the
    flags on top."""
    data: dict[str, Any] = read_yaml(cmd.config) if cmd.config else {}
    _deep_update(data, {k: v for k, v in {"model": cmd.model, "seed": cmd.seed}.items() if v is not None})
    if cmd.env:
        _deep_update(data, {"env": {"id": cmd.env}})
    if cmd.env_kw:
        _deep_update(data, {"env": {"kwargs": _kv(cmd.env_kw, "--env-kw")}})
    if cmd.agent:
        _deep_update(data, {"agent": {k: v for k, v in {"entry": cmd.agent, "tasks": cmd.agent_tasks,
                                                        "demos": cmd.agent_demos}.items() if v is not None}})
    cfg: TrainConfig = _validate(TrainConfig, data, "probe")
    if cfg.agent is not None:
        _check_agent(cfg)
    else:
        _check_env(cfg.env.id, cfg.env.kwargs)
    return cfg


def cmd_probe(argv: Sequence[str]) -> int:
    cmd = _parse(ProbeCommand, argv, "agentrl probe", "Horizon report: measure episodes (a short rollout of the "
                 "current policy, or a saved store) — turns, zero-advantage groups, a cross-validated turn-value "
                 "probe, value-change concentration, ... (docs/algorithms.md, 'The horizon probe') — apply the "
                 "recommendation rules, and write report.json, report.md and a self-contained report.html into --out.")
    if cmd.env and cmd.store:
        raise UsageError("--env and --store exclude each other: probe a rollout or a saved store")
    if cmd.agent and (cmd.env or cmd.store):
        raise UsageError("--agent excludes --env and --store: probe an agent, an env or a saved store")
    if (cmd.agent_tasks or cmd.agent_demos) and not cmd.agent:
        raise UsageError("--agent-tasks / --agent-demos without --agent FILE.py:solve")
    from agentrl.probe.run import probe_env, probe_store, probe_thresholds
    from agentrl.store import StoreError

    if cmd.sweep and not Path(cmd.sweep).is_file():
        raise UsageError(f"--sweep: no file at {Path(cmd.sweep)}")
    try:
        th = probe_thresholds(cmd.sweep, _kv(cmd.threshold, "--threshold"))
    except ValidationError as e:
        raise UsageError(f"--threshold:\n{describe_errors(e)}") from None
    except ValueError as e:  # a sweep that is not JSON, or not a horizon sweep
        raise UsageError(str(e)) from None
    cfg = None
    try:
        if cmd.store:
            if cmd.bakeoff:
                raise UsageError("--bakeoff trains on an environment; give --env (a store alone has none)")
            result = probe_store(cmd.store, th, budget_episodes=cmd.budget)
        else:
            cfg = _probe_config(cmd)
            result = probe_env(cfg, groups=cmd.groups, group_size=cmd.group_size, thresholds=th,
                               store_out=Path(cmd.out) / "probe_store.parquet", budget_episodes=cmd.budget)
    except StoreError as e:
        raise UsageError(f"store: {e}") from None
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    from agentrl.horizon_report import write_report

    runs = None
    if cmd.bakeoff and cfg is not None:
        from agentrl.probe.bakeoff import bakeoff

        runs = bakeoff(cfg, cmd.bakeoff_algos or None, cmd.bakeoff_updates, cmd.out, cmd.bakeoff_eval)
    _print_result(result, write_report(result, cmd.out, runs))
    return 0


def _print_result(result: ProbeResult, paths: dict[str, Path]) -> None:
    from rich.table import Table

    from agentrl.horizon_report import stat_rows

    console = _console()
    table = Table(title=f"horizon probe: {result.source}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for label, value in stat_rows(result):
        table.add_row(label, value)
    console.print(table)
    rec, th = result.recommendation, result.thresholds
    console.print(f"[bold green]recommended assigner: {rec.algo}[/bold green] ({rec.reason})")
    console.print(f"confidence: {rec.confidence}" + (f" ({rec.evidence})" if rec.evidence else ""))
    if rec.advice:
        console.print(f"[yellow]advice[/yellow]: {rec.advice}")
    console.print(f"thresholds: {th.source}" + (f" (sweep of {th.sweep_started})" if th.sweep_started else ""))
    if result.family is not None:
        colour = "green" if result.family.inside else "yellow"
        console.print(f"[{colour}]fitted on[/{colour}] {result.family.source}: {result.family.meaning}")
    console.print(f"report: {paths['html']}  {paths['md']}  {paths['json']}")
