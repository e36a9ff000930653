"""The commands about an environment: `check-env` (does it keep the AgentEnv contract?), `serve-env` (as an
OpenEnv or MCP server), `show-prompt` (its first prompt as a model sees it), `verify-probe` (what its
verifier wrongly accepts)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Annotated

import tyro
from pydantic import Field

from agentrl.cli.flags import UsageError, _check_env, _console, _err, _kv, _parse
from agentrl.config import EnvConfig, Strict


class CheckEnvCommand(Strict):
    target: Annotated[str, tyro.conf.Positional] = Field(description="Registered id (agentrl/Vault-v0), module:Class "
                                                         "or path/to/file.py:Class.")
    kw: list[str] = Field([], description="A constructor argument KEY=VALUE (repeatable).")


def cmd_check_env(argv: Sequence[str]) -> int:
    cmd = _parse(CheckEnvCommand, argv, "agentrl check-env", "Runs agentrl.checker's checks (reset/step types, "
                 "malformed calls become observations, the turn budget truncates, the same seed and actions give the "
                 "same episode, copies played in threads at once give the episodes each plays alone, a declared "
                 "split's train and eval tasks do not overlap, ...). Exit status 1 if any fails.")
    from rich.table import Table

    from agentrl.checker import check_env

    try:
        results = check_env(cmd.target, **_kv(cmd.kw, "--kw"))
    except (ValueError, TypeError, ImportError, AttributeError) as e:
        raise UsageError(str(e)) from None
    table = Table(title=f"check-env {cmd.target}")
    for col in ("check", "result", "why"):
        table.add_column(col)
    for r in results:
        table.add_row(r.name, "[green]ok[/green]" if r.ok else "[red]FAIL[/red]", r.message)
    _console().print(table)
    return 0 if all(r.ok for r in results) else 1


class ShowPromptCommand(Strict):
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment whose first turn is shown.")
    model: str = Field(description="A folder, hub id or known name (smollm2-135m-instruct); only its tokenizer is "
                       "loaded.")
    tool_format: str | None = Field(None, description="The call format, a key of agentrl.chat.FORMATS; None: detected "
                                    "from the chat template.")
    seed: int = Field(0, description="The task seed of the episode shown.")


def cmd_show_prompt(argv: Sequence[str]) -> int:
    cmd = _parse(ShowPromptCommand, argv, "agentrl show-prompt", "Prints an environment's first prompt exactly as the "
                 "model sees it (chat template, tool schemas, the call format), says whether the template rendered "
                 "the tools itself or agentrl put them in the system prompt, and re-renders one expert episode through "
                 "the template to check that the tokens a run trains on are laid out as the template lays them out.")
    from agentrl.checker import prompt_report

    try:
        r = prompt_report(cmd.env.id, cmd.model, cmd.tool_format, cmd.seed, **cmd.env.kwargs)
    except (ValueError, TypeError, ImportError, AttributeError, OSError) as e:
        raise UsageError(f"show-prompt: {e}") from None
    where = "the template renders tools=" if r.template_renders_tools else ("the template ignores tools=: agentrl "
                                                                              "wrote them into the system prompt")
    history = "turns appended" if r.history == "append" else ("turns laid out by the template (it rewrites the "
                                                              "history: a rewritten context starts a new segment)")
    print(f"# model {r.model}: tool format {r.tool_format}; {where}; {history}; {r.prompt_tokens} prompt tokens")
    print(r.prompt, end="" if r.prompt.endswith("\n") else "\n")
    missing = [name for name, named in r.tools_named.items() if not named]
    print(f"# tools named in the prompt: {', '.join(r.tools_named)}" + (f"; MISSING: {', '.join(missing)}"
                                                                         if missing else ""))
    if r.expert_text is not None:
        print(f"# the expert's first action in this format: {r.expert_text!r}")
    if r.layout is not None:
        lay = r.layout
        verdict = ("the rollout's ids are the template's" if lay.ids_equal else "same text, other token ids"
                   if lay.text_equal else f"LAYOUT DRIFT {lay.first_difference}")
        print(f"# re-render check of one expert episode: {verdict}")
    return 0 if not missing and (r.layout is None or r.layout.text_equal) else 1


class VerifyProbeCommand(Strict):
    env: str = Field(description="Environment id (agentrl/Code-v0) or module:Class whose verifier is attacked.")
    seeds: int = Field(3, ge=1, description="Episodes (seeds 0..N-1) to attack; each seed is a different task.")


def cmd_verify_probe(argv: Sequence[str]) -> int:
    cmd = _parse(VerifyProbeCommand, argv, "agentrl verify-probe", "Runs adversarial answers (empty, format tricks, "
                 "leaked references, ...) against an environment's verifier and reports what it wrongly accepts. Exit "
                 "status 1 if any is accepted.")
    from agentrl.core import EnvError
    from agentrl.verify.probe import print_result, run_verifier_probe

    try:
        result = run_verifier_probe(cmd.env, seeds=tuple(range(cmd.seeds)))
    except (EnvError, TypeError, ValueError, ImportError) as e:
        raise UsageError(f"verify-probe: {e}") from None
    print_result(result)
    return 0 if result.ok else 1


class ServeEnvCommand(Strict):
    target: Annotated[str, tyro.conf.Positional] = Field(description="The environment to serve: a registered id "
                                                         "(agentrl/Vault-v0), module:Class or path/to/file.py:Class.")
    kw: list[str] = Field([], description="A constructor argument KEY=VALUE (repeatable).")
    host: str = Field("127.0.0.1", description="The address to listen on; 127.0.0.1 keeps the env off the network. "
                      "Any other address is refused without --allow-remote.")
    port: int = Field(8000, ge=0, le=65535, description="The port (OpenEnv's usual 8000); 0 takes a free one.")
    max_sessions: int = Field(256, ge=1, description="Concurrent OpenEnv sessions (one env instance each). A training "
                              "run holds one per rollout env and one per held-out env (the defaults: 64 + 128), so 256 "
                              "serves `agentrl train` on its defaults with room for a second client.")
    allow_remote: bool = Field(False, description="Serve on a --host that is not a loopback address (0.0.0.0: every "
                               "interface). Off by default, refused rather than warned about: a served env runs the "
                               "tools any client with the token asks for, and plain HTTP carries the token in clear "
                               "text, so serving a network is a decision to write down (put TLS in front of it).")
    no_token: bool = Field(False, description="Serve without a token. By default every request must carry the token "
                           "printed at start (from AGENTRL_ENV_TOKEN when that is set; agentrl's OpenEnvEnv reads it "
                           "there), so that no other user of this machine, and no web page, can drive the env.")
    tool_timeout: float = Field(60.0, gt=0, description="Wall-clock seconds one tool call may take; past it the "
                                "policy reads that it timed out and the episode goes on (rollout.tool_timeout's "
                                "default, so a served episode is the one a local rollout plays).")
    idle_timeout: float = Field(300.0, gt=0, description="Seconds a session may wait for its client's next message "
                                "before it is closed and its env freed, so that silent clients cannot hold every "
                                "session. A turn's generation must fit in it; agentrl's OpenEnvEnv reopens a session "
                                "closed between episodes at its next reset.")
    mcp: bool = Field(False, description="Serve the env's tools as an MCP server over stdio instead (one episode "
                      "stream, one env: the client calls `reset`, then the env's tools; extra [mcp]); --host, --port, "
                      "--max-sessions, --allow-remote, --no-token and --idle-timeout do not apply.")


def cmd_serve_env(argv: Sequence[str]) -> int:
    cmd = _parse(ServeEnvCommand, argv, "agentrl serve-env", "Serves an agentrl environment as an OpenEnv server "
                 "(WebSocket /ws, one env per session), for TRL/SkyRL/ART or agentrl's own OpenEnv adapter "
                 "(agentrl.adapters.openenv:OpenEnvEnv), or with --mcp its tools as an MCP server over stdio. Runs "
                 "until interrupted.")
    kwargs = _kv(cmd.kw, "--kw")
    if not cmd.mcp:  # the doors first: nothing is imported or built for a server that may not start
        from agentrl.adapters.serve import TOKEN_ENV, check_token, is_loopback, new_token

        if not is_loopback(cmd.host) and not cmd.allow_remote:
            raise UsageError(f"--host {cmd.host} is not a loopback address: a served env runs the tools its clients "
                             "ask for; pass --allow-remote to serve it to the network")
        from_env = os.environ.get(TOKEN_ENV) if not cmd.no_token else None
        try:
            token = None if cmd.no_token else check_token(from_env) if from_env else new_token()
        except ValueError as e:
            raise UsageError(f"{TOKEN_ENV}: {e}") from None
    with contextlib.redirect_stdout(sys.stderr if cmd.mcp else sys.stdout):  # --mcp: stdout is the protocol's
        _check_env(cmd.target, kwargs)  # a bad id or argument is refused before a server stack is imported
    if cmd.mcp:
        from agentrl.adapters.mcp_serve import serve_stdio
        from agentrl.registry import make

        try:
            serve_stdio(lambda: make(cmd.target, **kwargs), name=f"agentrl {cmd.target}",
                        tool_timeout=cmd.tool_timeout)
        except (ImportError, ValueError) as e:  # no mcp package; an env tool that takes the name `reset`
            raise UsageError(f"serve-env --mcp {cmd.target}: {e}") from None
        except KeyboardInterrupt:
            pass
        return 0
    try:
        from agentrl.adapters.serve import serve
    except ImportError as e:
        raise UsageError(str(e)) from None

    def ready(url: str) -> None:
        said = ("no token (--no-token): any local program can drive it" if token is None else
                f"token from {TOKEN_ENV}" if from_env else f"token {token}")
        print(f"serving {cmd.target} over OpenEnv at {url} (WebSocket {url.replace('http', 'ws', 1)}/ws); {said}; "
              f"a client: {'' if token is None else TOKEN_ENV + '=<token> '}agentrl.adapters.openenv:OpenEnvEnv "
              f"url={url}", flush=True)
        if not is_loopback(cmd.host):
            _err(f"serving {cmd.target} to the network on {cmd.host} (--allow-remote): whoever reaches this port "
                 + ("runs its tools, with no token asked" if token is None else "with the token runs its tools, and "
                    "plain HTTP shows the token to the network: put TLS in front of it"))

    try:
        serve(cmd.target, kwargs, host=cmd.host, port=cmd.port, max_sessions=cmd.max_sessions, on_ready=ready,
              token=token, allow_remote=cmd.allow_remote, tool_timeout=cmd.tool_timeout,
              idle_timeout=cmd.idle_timeout)
    except (ValueError, TypeError, AttributeError) as e:
        raise UsageError(f"environment {cmd.target}: {e}") from None
    except OSError as e:
        raise UsageError(f"cannot listen on {cmd.host}:{cmd.port}: {e}") from None
    except KeyboardInterrupt:
        pass
    return 0

