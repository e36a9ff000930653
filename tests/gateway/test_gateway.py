"""The gateway: an agent's chat calls in, token-exact episodes out (agentrl.gateway).

Layout tests drive `AgentSession` with scripted generations and compare the ids with the chat template's own
rendering; the HTTP tests drive a real server with the openai SDK (sync, async, streaming) and raw requests
against a scripted engine; the training tests run the trainer on agents from tests/gateway/gateway_agents.py with a
micro Llama built here.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette", reason="the gateway needs starlette and uvicorn (pip install 'agentrl[gateway]')")
openai = pytest.importorskip("openai", reason="the openai SDK drives the gateway here (pip install 'agentrl[gateway]')")
httpx = pytest.importorskip("httpx")

from agentrl.config import AgentConfig, GatewayConfig, TinyModelConfig, TrainConfig  # noqa: E402
from agentrl.engines.base import Generation  # noqa: E402
from agentrl.gateway import Agent, AgentRunner, AgentSession, Call, CallError, Gateway  # noqa: E402
from agentrl.gateway.server import Server, build_app  # noqa: E402
from agentrl.policy import Policy  # noqa: E402
from agentrl.stages.data import load_conversations  # noqa: E402
from agentrl.stages.sft import tiny_policy_from_conversations  # noqa: E402
from agentrl.store import make_batch  # noqa: E402

HERE = Path(__file__).parent
AGENTS = str(HERE / "gateway_agents.py")
MICRO = TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, max_position_embeddings=512, vocab_size=400)
CALL = '<tool_call>{"name": "add", "arguments": {"a": 13, "b": 24}}</tool_call>'


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A micro Llama whose tokenizer was trained on the example agent's demonstrations."""
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("gw")
    demos = folder / "demos.jsonl"
    subprocess.run([sys.executable, str(HERE.parents[1] / "examples/agent/write_demos.py"), "--out", str(demos), "--n",
                    "120"], check=True, capture_output=True)
    tiny_policy_from_conversations([c for _, c in load_conversations(demos)], folder / "model", MICRO, seed=0)
    return folder


@pytest.fixture(scope="module")
def chat(policy_dir):
    return Policy.load(policy_dir / "model").chat


class Scripted:
    """An engine whose k-th action for a row is `script(row, k)` (text in the model's format)."""

    def __init__(self, chat, script):
        self.chat, self.script, self.calls = chat, script, {}
        self.sampling = None

    def open(self, prompts):
        engine = self

        class Session:
            turn_level = True

            def __init__(self):
                self.rows, self.started, self.contexts = [], [], {}

            def add(self, rows, prompts):
                self.rows += list(rows)

            def extend(self, chunks, rows=None):
                pass

            def drop(self, rows):
                self.rows = [r for r in self.rows if r not in rows]

            def start(self, rows):
                self.started += list(rows)

            def collect(self):
                out = []
                for r in self.started:
                    k = engine.calls[r] = engine.calls.get(r, -1) + 1
                    ids = engine.chat.action_ids(engine.script(r, k))
                    out.append((r, Generation(ids, [-0.5] * len(ids), "eos")))
                self.started = []
                return out

        return Session()


def calc_script(row, k):
    return CALL if k == 0 else "37"


@pytest.fixture
def served(chat):
    """A gateway with a scripted engine behind a real HTTP server: (gateway, server)."""
    gateway = Gateway(GatewayConfig(batch_wait=0.0))
    gateway.open_rollout(Scripted(chat, calc_script), chat, max_context=512)
    server = Server(build_app(gateway)).start()
    yield gateway, server
    server.stop()
    gateway.close()


def client_for(gateway, server, name, cls=None):
    cls = cls or openai.OpenAI
    return cls(base_url=f"{server.url}/sessions/{name}/v1", api_key=gateway.token, max_retries=0)


# -- the layout, by hand ------------------------------------------------------------------------------


def test_a_call_that_extends_the_last_continues_the_sequence_with_the_sampled_ids(chat):
    s = AgentSession(chat, name="s", row=0, group_id=0, task_id="t", seed=0, version=0)
    first = [{"role": "user", "content": "What is 13 + 24?"}]
    s.plan(Call(first, TOOLS_()))
    # sampled as one id per character: not how the tokenizer would encode the text
    sampled = [i for ch in CALL for i in chat.encode(ch)] + [chat.eos_id]
    reply = s.record(Generation(sampled, [-0.1] * len(sampled), "eos"))
    assert reply.finish == "tool_calls" and reply.calls[0][1:] == ("add", {"a": 13, "b": 24})
    call_id = reply.calls[0][0]
    back = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "add", "arguments": '{"a": 13, "b": 24}'}}]}
    second = first + [back, {"role": "tool", "tool_call_id": call_id, "content": "37"}]
    plan = s.plan(Call(second, TOOLS_()))
    assert not plan.new_segment and plan.extension is not None
    assert plan.context[:len(s.seq)] == s.seq  # the sampled ids exactly, never re-encoded
    assert plan.context != chat.encode(chat.render(s.messages(Call(second, TOOLS_())), TOOLS_()))  # (they differ)
    s.record(Generation(chat.action_ids("37"), [-0.2] * 2, "eos"))
    ep = s.end(1.0)
    assert ep.num_turns == 2 and ep.turns[0].obs_ids == plan.extension and ep.turns[1].segment_context is None
    # the layout is the first prompt, the sampled action, the template's wrapper of the tool message, the answer
    text = chat.tokenizer.decode(ep.token_ids(), skip_special_tokens=False)
    want = chat.render(s.messages(Call(second, TOOLS_())), TOOLS_()) + "37<|im_end|>"
    assert text == want
    assert s.prefix_breaks == 0 and ep.turns[1].context_len == len(plan.context)


def TOOLS_():
    from gateway_agents import TOOLS

    return TOOLS


def test_a_rewritten_history_opens_a_segment_on_exactly_its_context(chat):
    s = AgentSession(chat, name="s", row=0, group_id=0, task_id="t", seed=0, version=3)
    s.plan(Call([{"role": "user", "content": "What is 13 + 24?"}]))
    s.record(Generation(chat.action_ids("thinking"), [-0.1] * 3, "eos"))
    summary = [{"role": "system", "content": "Summary: thinking"}, {"role": "user", "content": "What is 13 + 24?"}]
    plan = s.plan(Call(summary))
    assert plan.new_segment and plan.context == chat.encode(chat.render(summary, []))
    s.record(Generation(chat.action_ids("37"), [-0.2] * 2, "eos"))
    ep = s.end(1.0)
    assert ep.turns[1].segment_context == plan.context and ep.turns[0].obs_ids == []
    assert [ids for ids, _ in ep.segments()][1] == plan.context + chat.action_ids("37")
    assert s.prefix_breaks == 1 and ep.turns[1].policy_version == 3


def test_max_tokens_and_stop_cut_the_reply_where_the_client_asked(chat):
    s = AgentSession(chat, name="s", row=0, group_id=0, task_id="t", seed=0, version=0)
    s.plan(Call([{"role": "user", "content": "hi"}], max_tokens=2))
    ids = chat.action_ids("12345")
    reply = s.record(Generation(ids, [-0.1] * len(ids), "eos"))
    assert reply.finish == "length" and reply.completion_tokens == 2 and len(s.episode.turns[0].action_ids) == 2
    assert s.engine_holds == 0  # the engine sampled more than was kept: the next call re-admits the row
    s.plan(Call([{"role": "user", "content": "again"}], stop=("3",)))
    reply = s.record(Generation(ids, [-0.1] * len(ids), "eos"))
    assert reply.content == "12" and reply.finish == "stop"
    assert chat.decode(s.episode.turns[1].action_ids).startswith("123")  # trained on what was sampled up to the stop


def test_bad_calls_are_refused_with_what_and_where(chat):
    s = AgentSession(chat, name="s", row=0, group_id=0, task_id="t", seed=0, version=0)
    with pytest.raises(CallError, match="a tool message must answer"):
        s.plan(Call([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]))
    with pytest.raises(CallError, match=r"messages\[0\].role"):
        s.plan(Call([{"role": "wizard", "content": "x"}]))
    with pytest.raises(CallError, match="only text parts"):
        s.plan(Call([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]))


def test_a_call_the_agent_marks_as_its_summary_is_a_summary_turn_that_mask_summary_leaves_out(served, chat):
    """An agent's own summariser says so in `metadata` (OpenAI's field, which the SDK sends as is): the turn is
    recorded with kind "summary", and rollout.context.mask_summary leaves exactly its tokens out of the loss."""
    from agentrl.store import make_batch

    gateway, server = served
    name = gateway.open_session(group_id=0, task_id="t", seed=0)
    client = client_for(gateway, server, name)
    msgs = [{"role": "user", "content": "What is 13 + 24?"}]
    client.chat.completions.create(model="m", messages=msgs)
    client.chat.completions.create(model="m", messages=msgs + [{"role": "user", "content": "Summarise."}],
                                   metadata={"agentrl_kind": "summary"})
    client.chat.completions.create(model="m", messages=[{"role": "system", "content": "Summary: asked 13 + 24"}])
    ep = gateway.end(name, 1.0)
    assert [t.kind for t in ep.turns] == ["action", "summary", "action"]
    kept, masked = make_batch([ep], chat.pad_id), make_batch([ep], chat.pad_id, mask_summary=True)
    assert int(kept.action_mask.sum() - masked.action_mask.sum()) == len(ep.turns[1].action_ids) > 0


# -- HTTP: the openai SDK, raw requests ---------------------------------------------------------------


def test_the_openai_sdk_drives_an_agent_to_an_episode(served, chat):
    from gateway_agents import solve, tasks

    gateway, server = served
    name = gateway.open_session(group_id=0, task_id="t0", seed=0)
    reward = solve(tasks(0), client_for(gateway, server, name))  # 10 + 20 = 30; the script answers 37
    ep = gateway.end(name, reward)
    assert reward == 0.0 and ep.num_turns == 2 and ep.terminated and ep.error is None
    assert ep.turns[0].action == CALL and chat.decode(ep.turns[1].action_ids) == "37"
    assert gateway.stats.calls == 2 and gateway.stats.prefix_breaks == 0
    assert gateway.stats.ids_checked == 2 and gateway.stats.ids_drift == 0  # the template's own encoding


def test_the_async_client_and_a_stream_are_served(served):
    gateway, server = served
    name = gateway.open_session(group_id=0, task_id="t", seed=0)

    async def go():
        client = client_for(gateway, server, name, openai.AsyncOpenAI)
        return await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}],
                                                    tools=TOOLS_())

    reply = asyncio.run(go()).choices[0]
    assert reply.finish_reason == "tool_calls" and json.loads(reply.message.tool_calls[0].function.arguments) == \
        {"a": 13, "b": 24}
    other = gateway.open_session(group_id=0, task_id="t", seed=0)
    stream = client_for(gateway, server, other).chat.completions.create(
        model="p", messages=[{"role": "user", "content": "hi"}], tools=TOOLS_(), stream=True)
    calls = [c for chunk in stream for choice in chunk.choices for c in (choice.delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["add"]


def hostile(url: str, token: str) -> list[tuple[str, dict, int]]:
    """(what, request keywords, the status expected): twenty kinds of malformed or hostile request."""
    auth = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    chat = f"{url}/sessions/S/v1/chat/completions"
    ok_msgs = [{"role": "user", "content": "hi"}]

    def body(**kw):
        return {"url": chat, "headers": auth, "content": json.dumps({"messages": ok_msgs, **kw})}

    return [
        ("no token", {"url": chat, "headers": {}, "content": "{}"}, 401),
        ("wrong token", {"url": chat, "headers": {"authorization": "Bearer nope"}, "content": "{}"}, 401),
        ("not JSON", {"url": chat, "headers": auth, "content": "{messages: ["}, 400),
        ("a JSON list", {"url": chat, "headers": auth, "content": "[1, 2]"}, 400),
        ("nested 100k deep", {"url": chat, "headers": auth, "content": "[" * 100_000 + "]" * 100_000}, 400),
        ("over the body limit", {"url": chat, "headers": auth, "content": "x" * (5 << 20)}, 413),
        ("no messages", {"url": chat, "headers": auth, "content": "{}"}, 400),
        ("empty messages", body(messages=[]), 400),
        ("unknown role", body(messages=[{"role": "root", "content": "x"}]), 400),
        ("a tool reply to nothing", body(messages=[{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]),
         400),
        ("an image part", body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), 400),
        ("n = 3", body(n=3), 400),
        ("a JSON schema response_format", body(response_format={"type": "json_schema"}), 400),
        ("max_tokens 0", body(max_tokens=0), 400),
        ("temperature 7", body(temperature=7), 400),
        ("five stops", body(stop=["a", "b", "c", "d", "e"]), 400),
        ("a call kind the gateway does not know", body(metadata={"agentrl_kind": "plan"}), 400),
        ("metadata that is not an object", body(metadata="summary"), 400),
        ("tool_choice names a tool not offered", body(tools=TOOLS_(), tool_choice={"type": "function",
                                                                                   "function": {"name": "rm"}}), 400),
        ("a tool name the model cannot write", body(tools=[{"type": "function", "function": {"name": "a b"}}]), 400),
        ("the same tool twice", body(tools=TOOLS_() + TOOLS_()), 400),
        ("arguments that are not JSON", body(messages=ok_msgs + [{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{a:"}}]}]), 400),
        ("an unknown session", {**body(), "url": f"{url}/sessions/nobody/v1/chat/completions"}, 404),
        ("a reward that is not a number", {"url": f"{url}/sessions/S/reward", "headers": auth,
                                           "content": json.dumps({"reward": "lots"})}, 400),
    ]


def test_twenty_kinds_of_hostile_request_get_4xx_and_the_next_session_is_served(served):
    from gateway_agents import solve, tasks

    gateway, server = served
    cases = hostile(server.url, gateway.token)
    assert len({what for what, _, _ in cases}) >= 20
    name = gateway.open_session(group_id=0, task_id="t", seed=0, name="S")
    with httpx.Client(timeout=30) as http:
        for what, kw, status in cases:
            r = http.post(kw.pop("url"), **kw)
            assert r.status_code == status, (what, r.status_code, r.text[:200])
            assert 400 <= r.status_code < 500
            if r.status_code != 413:
                err = r.json()["error"]
                assert err["message"] and err["type"], what
        assert http.get(f"{server.url}/v1/models").status_code == 401
        listed = http.get(f"{server.url}/v1/models", headers={"authorization": f"Bearer {gateway.token}"}).json()
        assert listed["data"][0]["id"] == gateway.model_name
    assert gateway.session(name).calls == 0  # nothing hostile reached the session
    other = gateway.open_session(group_id=1, task_id="t", seed=0)
    solve(tasks(0), client_for(gateway, server, other))
    assert gateway.end(other, 1.0).num_turns == 2


def test_a_client_that_leaves_mid_generation_frees_its_place(chat):
    class Slow(Scripted):
        def open(self, prompts):
            session = super().open(prompts)
            collect = session.collect
            session.collect = lambda: (time.sleep(0.6), collect())[1]
            return session

    gateway = Gateway(GatewayConfig(batch_wait=0.0))
    gateway.open_rollout(Slow(chat, calc_script), chat, max_context=512)
    name = gateway.open_session(group_id=0, task_id="t", seed=0)
    call = Call([{"role": "user", "content": "hi"}])

    async def left():
        return True

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(gateway.complete(name, call, left))
    assert gateway.stats.cancelled == 1 and gateway.session(name).pending is None
    reply = asyncio.run(gateway.complete(name, call))  # the session goes on: its next call is served
    assert reply.content == "37" and gateway.session(name).calls == 1  # the abandoned action was never laid in
    gateway.close()


# -- the in-process runner and the trainer ------------------------------------------------------------------


def runner_for(entry, **gw):
    cfg = AgentConfig(entry=f"{AGENTS}:{entry}", gateway=GatewayConfig(batch_wait=0.0, **gw))
    return AgentRunner(Agent(cfg, heldout_count=4))


def test_the_runner_runs_every_agent_kind_and_names_a_failing_task(chat):
    engine = Scripted(chat, calc_script)
    with runner_for("solve") as runner:
        eps, stats = runner.rollout(engine, chat, [0, 0, 1, 1], group_ids=[0, 0, 1, 1], max_context=512)
        assert [e.num_turns for e in eps] == [2] * 4 and [e.group_id for e in eps] == [0, 0, 1, 1]
        assert stats.extra["gateway/prefix_break_rate"] == 0 and stats.extra["gateway/sessions_in_flight_max"] >= 1
    with runner_for("solve_async") as runner:
        eps, _ = runner.rollout(Scripted(chat, calc_script), chat, [0, 1], max_context=512)
        assert [e.reward for e in eps] == [0.5, 0.5]
    with runner_for("solve_none") as runner:  # None: the module's verify judges
        eps, _ = runner.rollout(Scripted(chat, calc_script), chat, [0], max_context=512)
        assert eps[0].reward == 1.0 and eps[0].error is None
    with runner_for("solve_by_url") as runner:
        eps, _ = runner.rollout(Scripted(chat, calc_script), chat, [0], max_context=512)
        assert eps[0].num_turns == 2
    with runner_for("solve_raising") as runner:
        eps, _ = runner.rollout(Scripted(chat, calc_script), chat, [5], max_context=512)
        assert "solve raised RuntimeError: the agent's own bug" in eps[0].error and "seed 5" in eps[0].error


def test_a_silent_session_ends_truncated_and_a_call_past_the_context_truncates(chat):
    with runner_for("solve_silent", session_timeout=0.5) as runner:
        t0 = time.perf_counter()
        eps, stats = runner.rollout(Scripted(chat, calc_script), chat, [0, 1], max_context=512)
        assert time.perf_counter() - t0 < 2.5  # not the agent's 3 s: the sessions were ended for it
        assert all(e.truncated and e.error is None for e in eps) and stats.extra["gateway/session_timeouts"] == 2
    with runner_for("solve") as runner:  # the first prompt does not fit: the agent's call fails, the episode truncates
        eps, stats = runner.rollout(Scripted(chat, calc_script), chat, [0], max_context=40)
        assert eps[0].truncated and eps[0].error is None or eps[0].error and "without a single call" in eps[0].error
        assert stats.extra["gateway/context_overflows"] == 1


def agent_config(policy_dir, out, entry="solve", **kw) -> TrainConfig:
    data = {"model": str(policy_dir / "model"), "agent": {"entry": f"{AGENTS}:{entry}"}, "algo": "grpo",
            "updates": 1, "out": str(out),
            "rollout": {"groups": 2, "group_size": 2, "sampling": {"max_new_tokens": 12}},
            "optim": {"lr": 1e-3, "minibatches": 1}, "eval": {"episodes": 2, "every": 0},
            "checkpoint": {"every": 0}, **kw}
    return TrainConfig(**data)


def test_a_rewriting_agent_trains_each_segment_on_its_own_context(policy_dir, tmp_path):
    from agentrl.trainer import Trainer

    trainer = Trainer(agent_config(policy_dir, tmp_path / "run", "solve_rewriting"))
    try:
        episodes, metrics = trainer.collector.collect(1)
    finally:
        trainer.runner.close()
    assert metrics["rollout/segmented_frac"] == 1.0 and metrics["gateway/prefix_break_rate"] == 1.0
    batch = make_batch(episodes, trainer.policy.chat.pad_id)
    scored = trainer.learner.score(batch, trainer.learner.scorer(), None)
    mask = batch.action_mask > 0
    assert torch.allclose(scored[mask], batch.behaviour_logp[mask], atol=1e-4)  # the engine's, on each segment
    model = trainer.learner.scorer()
    for row, ep in enumerate(batch.episodes):  # the oracle: a forward on each segment's own ids
        assert len(ep.segments()) == 3
        for ids, src in ep.segments():
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float()
            for t, pos in enumerate(src):
                if pos >= 0:
                    want = torch.log_softmax(logits[t - 1], -1)[ids[t]]
                    assert float(scored[row, pos]) == pytest.approx(float(want), abs=1e-4)


def test_train_through_the_gateway_moves_the_weights_and_logs_the_gateway(policy_dir, tmp_path):
    from agentrl.stages.pipeline import train

    out = tmp_path / "run"
    before = {k: v.clone() for k, v in Policy.load(policy_dir / "model").model.state_dict().items()}
    summary = train(agent_config(policy_dir, out, "solve_parity", rollout={"groups": 2, "group_size": 4}))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trained = next(r for r in rows if r.get("step") == 1)
    assert trained["gateway/prefix_break_rate"] == 0.0 and trained["gateway/calls_per_episode"] >= 1
    assert torch.isfinite(torch.tensor(trained["train/loss"]))
    after = Policy.load(out / "checkpoint").model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert summary["eval_episodes"] == 2 and summary["env"] == f"agent:{AGENTS}:solve_parity"


def test_the_cli_refuses_a_bad_agent_before_any_work(tmp_path, capsys):
    from agentrl.cli import main

    assert main(["train", "--agent", f"{AGENTS}:nope", "--out", str(tmp_path / "r")]) == 2
    assert "has no function 'nope'" in capsys.readouterr().err
    assert main(["train", "--agent.tasks", "x.jsonl", "--out", str(tmp_path / "r")]) == 2
    assert "without --agent" in capsys.readouterr().err
    assert main(["train", "--agent", f"{AGENTS}:solve", "--out", str(tmp_path / "r")]) == 2
    assert "--agent.demos" in capsys.readouterr().err


def test_serve_policy_trains_on_the_groups_its_clients_bring(policy_dir, tmp_path):
    """An agent in another process: it opens sessions in groups, calls, posts rewards; the trainer waits for groups."""
    import threading

    from agentrl.gateway.remote import RemoteRunner
    from agentrl.stages.pipeline import train

    cfg = agent_config(policy_dir, tmp_path / "run").model_copy(update={"agent": None})
    runner = RemoteRunner(GatewayConfig(batch_wait=0.0))
    summary: dict = {}
    trainer = threading.Thread(target=lambda: summary.update(train(cfg, runner=runner)))
    trainer.start()
    auth = {"authorization": f"Bearer {runner.gateway.token}"}
    heldout, n = [], 0
    with httpx.Client(timeout=60) as http:
        while trainer.is_alive():
            try:
                r = http.post(f"{runner.base_url}/sessions", json={"group": f"g{n // 2}"}, headers=auth)
                if r.status_code == 503:  # the first rollout has not opened yet
                    time.sleep(0.05)
                    continue
                opened = r.json()
                client = openai.OpenAI(base_url=opened["base_url"], api_key=runner.gateway.token, max_retries=0)
                reply = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
                reward = float(len(reply.choices[0].message.content or "") % 2)
                http.post(f"{runner.base_url}/sessions/{opened['session']}/reward", json={"reward": reward},
                          headers=auth).raise_for_status()
                heldout.append(opened["heldout"])
                n += 1
            except (httpx.HTTPError, openai.APIError):
                break  # the run finished and its server closed
    trainer.join(timeout=60)
    assert summary["env"] == "serve-policy" and summary["updates_done"] == 1
    # the warm start's evaluation first; a session opened between rollouts is finished but not trained on
    assert heldout[:2] == [True, True] and heldout.count(False) >= 4
    assert n - (2 + 4 + 2) == runner.stale_dropped
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert next(r for r in rows if r.get("step") == 1)["rollout/episodes"] == 4


def test_the_probe_measures_an_agent_like_an_env(policy_dir, tmp_path, capsys):
    from agentrl.cli import main

    out = tmp_path / "probe"
    assert main(["probe", "--agent", f"{AGENTS}:solve", "--model", str(policy_dir / "model"), "--groups", "2",
                 "--group-size", "2", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())["probe"]
    assert report["source"] == f"gateway rollout of agent {AGENTS}:solve" and report["stats"]["episodes"] == 4
    assert "recommended assigner" in capsys.readouterr().out


def test_a_run_through_the_gateway_resumes_from_its_checkpoint(policy_dir, tmp_path):
    from agentrl.stages.pipeline import train

    out = tmp_path / "run"
    train(agent_config(policy_dir, out, "solve_parity", updates=1, checkpoint={"every": 1}))
    summary = train(agent_config(policy_dir, out, "solve_parity", updates=2, checkpoint={"every": 1}), resume=True)
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if "rollout/episodes" in json.loads(x)]
    assert summary["updates_done"] == 2 and steps == [1, 2]


def test_a_half_sent_request_head_is_closed_and_others_are_served(served, monkeypatch):
    import socket

    gateway, server = served
    monkeypatch.setattr(server.server.config, "agentrl_handshake_timeout", 0.5)
    idle = [socket.create_connection((server.host, server.port)) for _ in range(10)]
    for s in idle:
        s.sendall(b"POST /sessions/x/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
    time.sleep(1.5)
    for s in idle:
        s.settimeout(2)
        assert s.recv(1) == b""  # closed by the server
        s.close()
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_an_agent_source_is_evaluated_through_the_gateway_on_its_held_out_tasks(policy_dir):
    from agentrl.eval_sources import evaluate_source, resolve_sources

    # solve_rewriting's reward is 1 iff the task's answer (seed % 7 + 10 + seed % 5 + 20) is odd, whatever the
    # policy says: seeds 4, 5, 6, 7 have answers 38, 35, 37, 32
    cfg = TrainConfig(model=str(policy_dir / "model"), rollout={"sampling": {"max_new_tokens": 12}}, eval={"sources": [
        {"name": "parity", "agent": {"entry": f"{AGENTS}:solve_rewriting", "gateway": {"batch_wait": 0.0}},
         "seed_offset": 4, "episodes": 4, "k": 2}]})
    [source] = resolve_sources(cfg)
    assert source.env_id == f"agent:{AGENTS}:solve_rewriting" and source.seeds == [4, 5, 6, 7]
    result = evaluate_source(cfg, source, Policy.load(policy_dir / "model"), max_context=512)
    assert (result.pass_at, result.avg, result.greedy) == ({2: 0.5}, 0.5, 0.5)
    with pytest.raises(ValueError, match=r"eval.sources\[0\] \(gone\): agent nowhere.py:solve"):
        resolve_sources(TrainConfig(eval={"sources": [{"name": "gone", "agent": {"entry": "nowhere.py:solve"}}]}))
