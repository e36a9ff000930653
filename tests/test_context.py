"""Context policies (`rollout.context`, agentrl.context): episodes longer than the context budget.

A scripted policy pins what each policy does to the conversation (the segments it opens, the summary turn,
the env's hook) in both history modes; an engine that counts its cached tokens, and the torch engine on the
micro model, show that a 128-turn episode costs what a 16-turn one does.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from agentrl.chat.layout import ChatFormat
from agentrl.config import RolloutConfig
from agentrl.context import SUMMARY_HEADER, ContextConfig
from agentrl.core import AgentEnv, Episode, Turn
from agentrl.engines import SamplingConfig, ScriptedEngine, TorchEngine
from agentrl.rollout import rollout
from agentrl.store import TrajectoryStore, make_batch

FILLER = "the tool answered with words that fill the context, " * 2


class Notes(AgentEnv):
    """A long episode: the task names a code, every turn the policy writes a note and is answered at length."""

    max_turns = 16

    def note(self, text: str) -> str:
        """Write a note."""
        return f"noted {self.turn}: {FILLER}"

    tools = [note]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.code = 100 + (seed or 0)
        return f"The code is {self.code}. Take notes.", {}

    def verify(self) -> float:
        return 1.0

    def state_key(self):
        return self.turn

    def facts_kept(self, summary: str) -> float:
        return float(str(self.code) in summary)

    def compact(self, messages):
        return messages[:1] + [{"role": "user", "content": f"(compacted) the code is {self.code}"}]


NOTE = '<tool_call>{"name": "note", "arguments": {"text": "the code is 100"}}</tool_call>'


class Counting:
    """A scripted engine that keeps a count of the tokens each row would hold in a KV cache: a row's cache is
    freed when it is dropped. `peak` is the most held at once, `log` the calls (to see a cut's drop and add)."""

    def __init__(self, act, eos_id):
        self.inner = ScriptedEngine(act, eos_id)
        self.live: dict[int, int] = {}
        self.peak = 0
        self.log: list[tuple[str, int, int]] = []

    def open(self, prompts):
        engine, session = self, self.inner.open(prompts)

        class Session:
            turn_level = True

            def __getattr__(self, name):
                return getattr(session, name)

            def add(self, rows, prompts):
                session.add(rows, prompts)
                for r, p in zip(rows, prompts):
                    engine._set(r, len(p), "add")

            def extend(self, chunks, rows=None):
                session.extend(chunks, rows)
                for r, c in zip(rows, chunks):
                    engine._set(r, engine.live[r] + len(c), "extend")

            def collect(self):
                out = session.collect()
                for r, gen in out:
                    engine._set(r, engine.live[r] + len(gen.ids), "generate")
                return out

            def drop(self, rows):
                session.drop(rows)
                for r in rows:
                    engine.log.append(("drop", r, engine.live.pop(r, 0)))

        return Session()

    def _set(self, row, n, what):
        self.live[row] = n
        self.log.append((what, row, n))
        self.peak = max(self.peak, sum(self.live.values()))


def roll(chat, policy="truncate", turns=16, seeds=(0,), budget=1000, engine=None, **kw):
    if policy == "summarize":
        kw.setdefault("instruction", "Summarise.")  # the default is long in the micro tokenizer's pieces
    envs = [Notes(max_turns=turns) for _ in seeds]
    engine = engine or ScriptedEngine(lambda row: chat.action_ids(NOTE), chat.eos_id)
    context = ContextConfig(policy=policy, budget=budget, **kw) if policy is not None else None
    episodes, stats = rollout(envs, list(seeds), engine, chat, max_context=4096, max_new_tokens=40,
                              workers="serial", context=context)
    return envs, episodes, stats


def text(chat, ids):
    return chat.tokenizer.decode(ids, skip_special_tokens=False)


def test_the_config_names_its_policies_and_refuses_a_budget_past_the_model():
    assert ContextConfig().policy == "truncate" and ContextConfig().budget is None
    with pytest.raises(ValidationError, match="unknown context policy 'forget'"):
        ContextConfig(policy="forget")
    with pytest.raises(ValidationError, match="over max_context"):
        RolloutConfig(max_context=512, context={"budget": 1024})
    with pytest.raises(ValidationError, match="summary_max_tokens"):
        RolloutConfig(sampling={"max_new_tokens": 64}, context={"policy": "summarize", "summary_max_tokens": 128})


def test_truncate_is_what_a_rollout_did_before_and_the_budget_tightens_it(vault_policy):
    chat = vault_policy.chat
    _, (before,), stats = roll(chat, policy=None, budget=None)
    _, (named,), _ = roll(chat, policy="truncate", budget=None)
    assert named.token_ids() == before.token_ids() and named.num_turns == before.num_turns == 16
    assert "context/compactions_per_episode" not in stats.extra  # nothing new is logged for existing runs
    _, (short,), _ = roll(chat, policy="truncate", budget=500)
    assert short.truncated and short.num_turns < 16 and len(short.token_ids()) + 40 <= 500 + 200


@pytest.mark.parametrize("history", ["append", "template"])
def test_window_keeps_the_head_and_the_last_turns_in_a_new_segment(vault_policy, history):
    chat = ChatFormat(vault_policy.chat.tokenizer, history=history)
    engine = Counting(lambda row: chat.action_ids(NOTE), chat.eos_id)
    _, (ep,), stats = roll(chat, "window", turns=24, engine=engine, keep_turns=2)
    assert not ep.error and ep.num_turns == 24 and stats.compactions > 1
    opened = [k for k, t in enumerate(ep.turns) if t.segment_context is not None]
    assert len(opened) == stats.compactions == len(ep.segments()) - 1
    for k in opened:
        context = text(chat, ep.turns[k].segment_context)
        assert "The code is 100. Take notes." in context  # the head stays
        assert f"noted {k}:" in context and f"noted {k - 1}:" in context  # the last two turns stay...
        assert f"noted {k - 2}:" not in context  # ...and no earlier one
        assert len(ep.turns[k].segment_context) + 40 <= 1000
    # the engine freed the row's cache at each cut and started it on the new context
    cuts = [i for i, (what, _, _) in enumerate(engine.log) if what == "drop"][:-1]  # the last: the episode's end
    assert len(cuts) == stats.compactions
    assert all(engine.log[i + 1][0] == "add" for i in cuts)
    assert stats.extra["context/compactions_per_episode"] == stats.compactions
    assert stats.extra["context/tokens_at_compaction"] + 40 > 1000


def test_drop_observations_stubs_the_older_tool_results(vault_policy):
    chat = vault_policy.chat
    _, (ep,), stats = roll(chat, "drop-observations", turns=12, budget=800, keep_turns=1, stub="(gone)")
    k = next(k for k, t in enumerate(ep.turns) if t.segment_context is not None)
    context = text(chat, ep.turns[k].segment_context)
    assert context.count("(gone)") == k - 1  # every result but the latest...
    assert f"noted {k}:" in context and "noted 1:" not in context  # ...which stays whole
    assert context.count("the code is 100") == k  # the actions stay


@pytest.mark.parametrize("history", ["append", "template"])
def test_the_summary_is_a_turn_of_its_own_and_the_episode_goes_on_from_it(vault_policy, history):
    chat = ChatFormat(vault_policy.chat.tokenizer, history=history)
    envs, (ep,), stats = roll(chat, "summarize", turns=30, summary_max_tokens=12, trigger=0.75)
    summaries = [k for k, t in enumerate(ep.turns) if t.kind == "summary"]
    assert len(summaries) >= 2 and not ep.error
    assert envs[0].turn == 30 == ep.num_turns - len(summaries)  # a summary is no env step
    for k in summaries:
        before, summary, after = ep.turns[k - 1], ep.turns[k], ep.turns[k + 1]
        # the instruction follows the last observation in the running sequence, then the summary is sampled
        assert "Summarise." in text(chat, before.obs_ids)
        assert summary.context_len == before.context_len + len(before.action_ids) + len(before.obs_ids)
        assert summary.obs_ids == [] and summary.observation == "" and len(summary.action_ids) == 12
        assert summary.action == chat.decode(NOTE and chat.action_ids(NOTE)[:12])
        assert summary.state_key == f"summary {before.state_key}"
        # the next action is given the head and the summary, a new segment
        assert after.segment_context is not None and after.kind == "action"
        context = text(chat, after.segment_context)
        assert "The code is 100. Take notes." in context and SUMMARY_HEADER + summary.action in context
        assert "noted" not in context  # no earlier turn survives the cut
    assert stats.extra["context/summary_tokens"] == 12
    assert stats.extra["context/compactions_per_episode"] == len(summaries)
    assert stats.extra["context/facts_kept"] == 0.0  # 12 tokens of the note do not reach the code


def test_facts_kept_is_the_envs_verdict_on_each_summary(vault_policy):
    chat = vault_policy.chat
    _, _, stats = roll(chat, "summarize", turns=20, summary_max_tokens=40)
    assert stats.extra["context/facts_kept"] == 1.0  # the whole note names the code


def test_the_env_policy_asks_the_envs_own_hook_and_a_bad_answer_errs_that_episode(vault_policy):
    chat = vault_policy.chat
    _, (ep,), stats = roll(chat, "env", turns=20)
    opened = [t for t in ep.turns if t.segment_context is not None]
    assert opened and not ep.error
    assert "(compacted) the code is 100" in text(chat, opened[0].segment_context)

    class Broken(Notes):
        def compact(self, messages):
            return "not messages"

    envs = [Broken(max_turns=20), Notes(max_turns=20)]
    episodes, _ = rollout(envs, [0, 1], ScriptedEngine(lambda row: chat.action_ids(NOTE), chat.eos_id), chat,
                          max_context=4096, max_new_tokens=40, workers="serial",
                          context=ContextConfig(policy="env", budget=700))
    assert "compact() must return" in episodes[0].error and episodes[1].error is None


def test_a_summary_survives_the_store_and_mask_summary_zeroes_exactly_its_tokens(vault_policy, tmp_path):
    _, (ep,), _ = roll(vault_policy.chat, "summarize", turns=20, summary_max_tokens=12)
    (back,) = TrajectoryStore.load(TrajectoryStore([ep]).save(tmp_path / "s.parquet")).episodes
    assert [t.kind for t in back.turns] == [t.kind for t in ep.turns] and "summary" in [t.kind for t in ep.turns]
    trained = make_batch([back], pad_id=0).action_mask[0]
    masked = make_batch([back], pad_id=0, mask_summary=True).action_mask[0]
    summary_positions = {t.context_len + i for t in ep.turns if t.kind == "summary" for i in range(len(t.action_ids))}
    differ = {i for i in range(len(trained)) if trained[i] != masked[i]}
    assert differ == summary_positions and all(trained[i] == 1 for i in differ)


def hand_episode() -> Episode:
    """prompt [1, 2]; a1 [3] o1 [4, 5] (the instruction at the end); the summary [6, 7]; a2 [8] on [1, 2, 9]."""
    return Episode([1, 2], [Turn(2, [3], [-0.1], [4, 5]), Turn(5, [6, 7], [-0.2, -0.3], [], kind="summary"),
                            Turn(7, [8], [-0.4], [0], segment_context=[1, 2, 9])], reward=1.0)


def test_a_summarised_episode_trains_as_two_segments():
    ep = hand_episode()
    assert ep.segments() == [([1, 2, 3, 4, 5, 6, 7], [-1, -1, 2, -1, -1, 5, 6]), ([1, 2, 9, 8], [-1, -1, -1, 7])]
    assert make_batch([ep], 0, mask_summary=True).action_mask[0].tolist() == [0, 0, 1, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("policy", ["summarize", "window"])
def test_a_128_turn_episode_holds_what_a_16_turn_one_does(vault_policy, policy):
    chat = vault_policy.chat
    peaks = {}
    for turns in (16, 128):
        engine = Counting(lambda row: chat.action_ids(NOTE), chat.eos_id)
        _, (ep,), stats = roll(chat, policy, turns=turns, engine=engine, budget=800, summary_max_tokens=30)
        assert ep.num_turns >= turns and not ep.error
        peaks[turns] = engine.peak
    assert peaks[16] <= 800 and peaks[128] <= 1.2 * peaks[16], peaks
    _, (whole,), _ = roll(chat, "truncate", turns=128, budget=4096)  # without a policy the context keeps growing
    assert len(whole.token_ids()) > 4 * peaks[128]


def cache_bytes(session) -> int:
    """What the torch session's cache holds: every layer's key and value buffers and the mask."""
    total = session.mask.numel() * session.mask.element_size()
    for layer in getattr(session.cache, "layers", []):
        for t in (getattr(layer, "key_buf", None), getattr(layer, "value_buf", None), layer.keys, layer.values):
            if t is not None:
                total += t.numel() * t.element_size()
    return total


def test_the_torch_engine_frees_a_rows_cache_at_each_cut(vault_policy):
    """The micro model samples its own (malformed) actions; its episode runs 64 turns on a 400-token budget in
    the memory of a 16-turn one (the counting engine above runs 128: a CPU forward per turn keeps this one to
    64)."""
    chat = vault_policy.chat
    peaks = {}
    for turns in (16, 64):
        engine = TorchEngine(vault_policy.model, SamplingConfig(max_new_tokens=4, temperature=1.0), chat.stop_ids,
                             chat.eos_id, chat.pad_id, seed=0)
        opened = engine.open
        seen = []

        def open_measured(prompts, _opened=opened, _seen=seen):
            session = _opened(prompts)
            collect = session.collect

            def measured():
                out = collect()
                _seen.append(cache_bytes(session))
                return out

            session.collect = measured
            return session

        engine.open = open_measured
        envs = [Notes(max_turns=turns)]
        (ep,), stats = rollout(envs, [0], engine, chat, max_context=512, max_new_tokens=4, workers="serial",
                               context=ContextConfig(policy="window", budget=400, keep_turns=1))
        assert ep.num_turns == turns and not ep.error
        peaks[turns] = max(seen)
    assert stats.compactions > 5
    assert peaks[64] <= 1.2 * peaks[16], peaks


def test_the_summary_instruction_reaches_the_policy_as_a_user_message(vault_policy):
    chat = vault_policy.chat
    _, (ep,), _ = roll(chat, "summarize", turns=20, summary_max_tokens=12, instruction="Summarise now.")
    k = next(k for k, t in enumerate(ep.turns) if t.kind == "summary")
    tail = text(chat, ep.turns[k - 1].obs_ids)
    assert json.dumps("Summarise now.")[1:-1] in tail and tail.endswith("assistant\n")


def test_the_trainer_scores_every_action_and_summary_on_the_context_it_was_sampled_in(vault_policy_dir, tmp_path):
    """The micro model, summarising on a 400-token budget: the engine's log-probs (sampled on each segment) are
    the trainer's, which they cannot be if the trainer scored the appended layout."""
    import torch

    from agentrl.config import TrainConfig
    from agentrl.trainer import Trainer

    cfg = TrainConfig(model=str(vault_policy_dir), env={"id": f"{__file__}:Notes", "kwargs": {"max_turns": 12}},
                      algo="grpo", updates=1, out=str(tmp_path / "run"),
                      rollout={"groups": 1, "group_size": 2, "env_workers": "serial", "max_context": 512,
                               "sampling": {"max_new_tokens": 10},
                               "context": {"policy": "summarize", "budget": 400, "summary_max_tokens": 8,
                                           "instruction": "Summarise."}},
                      optim={"lr": 1e-3, "minibatches": 1}, eval={"episodes": 2, "every": 0},
                      checkpoint={"every": 0})
    trainer = Trainer(cfg)
    episodes, metrics = trainer.collector.collect(1)
    assert all(any(t.kind == "summary" for t in e.turns) for e in episodes)
    assert metrics["context/compactions_per_episode"] >= 1 and metrics["context/summary_tokens"] <= 8
    batch = make_batch(episodes, trainer.policy.chat.pad_id)
    scored = trainer.learner.score(batch, trainer.learner.scorer(), None)
    mask = batch.action_mask > 0
    assert torch.allclose(scored[mask], batch.behaviour_logp[mask], atol=1e-4)
