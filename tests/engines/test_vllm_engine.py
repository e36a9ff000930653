"""The vLLM engine. On CPU, without vLLM: the missing-extra message, the row bookkeeping, and the
session driven by a scripted stand-in for `vllm.LLM` (outputs shaped like vLLM's RequestOutput /
CompletionOutput), down to a whole Vault rollout. On a CUDA GPU with the [vllm] extra: a real LLM
whose log-probs must match a full forward in torch, and whose weights must follow `sync_weights`."""

from __future__ import annotations

import copy
import importlib.util
import sys
from types import SimpleNamespace

import pytest
import torch

from agentrl.config import TinyModelConfig
from agentrl.engines import SamplingConfig
from agentrl.engines import vllm_engine as ve
from agentrl.engines.vllm_engine import VLLMEngine, _Histories, sampling_kwargs, to_generation
from agentrl.policy import Policy, build_tiny_policy, token_stats
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.stages.sft import expert_texts
from agentrl.store import make_batch

STOP, EOS = 90, 91  # stop ids of the hand-made sessions below (</tool_call>, <|im_end|>)


# -- a scripted stand-in for vllm ------------------------------------------------------------------


class FakeParams:
    def __init__(self, **kwargs):
        self.kw = kwargs


class FakeLoRA:
    def __init__(self, name, int_id, path):
        self.name, self.int_id, self.path = name, int_id, path


FAKE_VLLM = SimpleNamespace(SamplingParams=FakeParams, TokensPrompt=dict, LoRARequest=FakeLoRA, LLM=None,
                            version="0.11.0")


def completion(ids, finish, logprobs=None, stop_reason=None):
    """Shaped like vllm.CompletionOutput: one {token id: Logprob} per generated token."""
    lps = logprobs if logprobs is not None else [-0.25 * (i + 1) for i in range(len(ids))]
    steps = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(ids, lps)]
    return SimpleNamespace(token_ids=ids, logprobs=steps, finish_reason=finish, stop_reason=stop_reason)


class FakeLLM:
    """Duck-typed `vllm.LLM.generate`: plays `act(position, history) -> ids` for every prompt, stopping
    at the first stop id and keeping it, as vLLM does; records every call."""

    def __init__(self, act):
        self.act = act
        self.calls = []

    def generate(self, prompts, sampling_params, *, use_tqdm=True, lora_request=None):
        self.calls.append(SimpleNamespace(prompts=[list(p["prompt_token_ids"]) for p in prompts],
                                          params=sampling_params,
                                          lora=lora_request))
        outputs = []
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params, strict=True)):
            ids, stops = list(self.act(i, prompt["prompt_token_ids"])), params.kw["stop_token_ids"]
            ids = ids[: params.kw["max_tokens"]]
            end = next((k + 1 for k, t in enumerate(ids) if t in stops), len(ids))
            ids = ids[:end]
            finish = "stop" if ids[-1] in stops else "length"
            stop_reason = ids[-1] if finish == "stop" else None
            outputs.append(SimpleNamespace(outputs=[completion(ids, finish, stop_reason=stop_reason)]))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.setattr(ve, "_import_vllm", lambda: FAKE_VLLM)
    return FAKE_VLLM


def engine_on(llm, **kw):
    return VLLMEngine(llm, SamplingConfig(max_new_tokens=8), [STOP, EOS], EOS, 0, **kw)


# -- without vLLM ----------------------------------------------------------------------------------


def test_missing_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    msg = r"--engine vllm needs the \[vllm\] extra: pip install 'agentrl\[vllm\]' \(GPU only\)"
    with pytest.raises(ImportError, match=msg):
        ve._import_vllm()
    with pytest.raises(ImportError, match=msg):
        VLLMEngine.from_policy("some/model", SamplingConfig(), [STOP], EOS, 0)


def test_hidden_states_are_refused_before_anything_loads(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(NotImplementedError, match="use --engine torch"):
        VLLMEngine.from_policy("some/model", SamplingConfig(), [STOP], EOS, 0, capture_hidden=True)


def test_histories_follow_generate_extend_keep():
    h = _Histories([[1, 2], [3], [4, 4]])
    h.record([[10, STOP], [11, EOS], [12]])
    h.extend([[5], [6, 6], [7]])
    assert h.tokens == [[1, 2, 10, STOP, 5], [3, 11, EOS, 6, 6], [4, 4, 12, 7]]
    h.keep([2, 0])  # row 1 finished; the caller's indices stay attached to their histories
    assert h.rows == [2, 0] and h.tokens == [[4, 4, 12, 7], [1, 2, 10, STOP, 5]]
    h.record([[13], [14]])
    assert h.tokens == [[4, 4, 12, 7, 13], [1, 2, 10, STOP, 5, 14]]
    with pytest.raises(ValueError, match="3 chunks for 2 rows"):
        h.extend([[1], [2], [3]])


def test_completion_becomes_a_generation_like_the_torch_engines():
    g = to_generation(completion([5, 6, STOP], "stop", [-0.1, -0.2, -0.3], stop_reason=STOP), [STOP, EOS], EOS)
    assert (g.ids, g.logprobs, g.finish, g.hidden) == ([5, 6, STOP], [-0.1, -0.2, -0.3], "stop", None)
    assert to_generation(completion([5, EOS], "stop", stop_reason=EOS), [STOP, EOS], EOS).finish == "eos"
    assert to_generation(completion([5, 6, 7], "length"), [STOP, EOS], EOS).finish == "length"
    # a stop token as the very last allowed token is a stop, whatever vLLM calls it (0.10 says "length")
    assert to_generation(completion([5, STOP], "length"), [STOP, EOS], EOS).finish == "stop"


def test_completion_that_lost_its_stop_token_or_logprobs_is_an_error():
    with pytest.raises(RuntimeError, match="do not end with a stop token"):
        to_generation(completion([5, 6], "stop", stop_reason=STOP), [STOP, EOS], EOS)
    with pytest.raises(RuntimeError, match="no log-probs"):
        to_generation(SimpleNamespace(token_ids=[5], logprobs=None, finish_reason="length", stop_reason=None), [STOP],
                      EOS)


def test_sampling_params_follow_the_config_and_seeds_are_per_request(fake_vllm):
    cfg = SamplingConfig(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=12)
    assert sampling_kwargs(cfg, [STOP, EOS]) == {
        "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 12, "stop_token_ids": [STOP, EOS],
        "ignore_eos": True, "logprobs": 0, "detokenize": False,
    }
    assert sampling_kwargs(cfg.model_copy(update={"top_k": 5}), [STOP])["top_k"] == 5
    eng = engine_on(FakeLLM(lambda i, h: [STOP]), seed=3)
    seeds = [p.kw["seed"] for p in eng.request_params(4)]
    assert len(set(seeds)) == 4 and seeds == [p.kw["seed"] for p in engine_on(None, seed=3).request_params(4)]
    assert {p.kw["seed"] for p in engine_on(None).request_params(2)} == {None}
    eng.sampling = eng.sampling.model_copy(update={"temperature": 0.3})  # a turned temperature: a new copy
    assert eng.request_params(1)[0].kw["temperature"] == 0.3


def test_session_resubmits_each_live_rows_whole_history(fake_vllm):
    llm = FakeLLM(lambda i, h: [len(h), STOP, 99])  # an action that depends on the history; 99 is cut
    session = engine_on(llm).open([[1, 2], [3]])
    first = session.generate()
    assert [g.ids for g in first] == [[2, STOP], [1, STOP]] and all(g.finish == "stop" for g in first)
    assert first[0].logprobs == [-0.25, -0.5]
    session.extend([[5, 5], [6]])
    session.generate()
    assert llm.calls[1].prompts == [[1, 2, 2, STOP, 5, 5], [3, 1, STOP, 6]]
    session.keep([1])
    session.extend([[7]])
    (last,) = session.generate()
    assert session.rows == [1] and llm.calls[2].prompts == [[3, 1, STOP, 6, 4, STOP, 7]] and last.ids == [7, STOP]
    assert all(c.lora is None for c in llm.calls)


def test_vault_rollout_through_a_scripted_llm_keeps_the_transcript(fake_vllm, vault_policy):
    """The stand-in plays Vault's expert; what vLLM is sent each turn must be exactly the episode's
    tokens before that turn's action, as the learner will see them."""
    chat = vault_policy.chat
    envs = [make("agentrl/Vault-v0", locks=1, slack=0) for _ in range(3)]  # 2 turns: read the clue, open
    sessions, sent = [], {row: [] for row in range(3)}

    def expert(position, history):
        row = sessions[-1].submitted[position]  # the rollout sends the rows that are ready, not every row
        sent[row].append(list(history))
        return chat.action_ids(envs[row].expert_action())

    engine = VLLMEngine(FakeLLM(expert), SamplingConfig(max_new_tokens=48), chat.stop_ids, chat.eos_id, chat.pad_id,
                        seed=0)
    opened = engine.open
    engine.open = lambda prompts: sessions.append(opened(prompts)) or sessions[-1]
    episodes, stats = rollout(envs, [0, 1, 2], engine, chat)
    assert [(e.num_turns, e.reward, e.terminated) for e in episodes] == [(2, 1.0, True)] * 3
    close = chat.tokenizer.convert_tokens_to_ids("</tool_call>")
    for row, ep in enumerate(episodes):
        ids = ep.token_ids()
        assert sent[row] == [ids[: t.context_len] for t in ep.turns]
        assert [t.action_ids[-1] for t in ep.turns] == [close, close]
        assert '"name": "clue"' in ep.turns[0].action and '"name": "open"' in ep.turns[1].action
        assert all(len(t.logprobs) == len(t.action_ids) for t in ep.turns)


def test_from_policy_builds_the_llm_it_needs(monkeypatch):
    made = {}
    monkeypatch.setattr(ve, "_import_vllm",
                        lambda: SimpleNamespace(**{**vars(FAKE_VLLM), "LLM": lambda **kw: made.update(kw) or "llm"}))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    eng = VLLMEngine.from_policy("/models/tiny", SamplingConfig(), [STOP], EOS, 0, seed=7, max_model_len=512)
    assert eng.llm == "llm" and made == {
        "model": "/models/tiny", "enable_prefix_caching": True, "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": 0.3,
        "enable_lora": False, "max_lora_rank": 16, "dtype": "bfloat16", "seed": 7, "max_model_len": 512,
    }
    assert ve.os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # in-process: weights pass by reference
    monkeypatch.setattr(ve, "_import_vllm", lambda: SimpleNamespace(**{**vars(FAKE_VLLM), "version": "0.10.1"}))
    with pytest.raises(ImportError, match=r"needs vLLM >= 0.10.2, found 0.10.1"):
        VLLMEngine.from_policy("/models/tiny", SamplingConfig(), [STOP], EOS, 0)


class FakeInner:
    def __init__(self):
        self.loaded = []

    def load_weights(self, weights):
        self.loaded.append({name: t.clone() for name, t in weights})  # as copied into vLLM's own tensors


def test_sync_weights_loads_the_state_dict_then_drops_the_prefix_cache(fake_vllm):
    learner = torch.nn.Linear(3, 2)
    inner = FakeInner()
    worker = SimpleNamespace(get_model=lambda: inner)
    events = []
    llm = SimpleNamespace(collective_rpc=lambda fn, kwargs: events.append("load") or [fn(worker, **kwargs)],
                          reset_prefix_cache=lambda: events.append("reset"))
    engine_on(llm).sync_weights(learner)
    assert events == ["load", "reset"] and set(inner.loaded[0]) == {"weight", "bias"}
    assert torch.equal(inner.loaded[0]["weight"], learner.weight)

    # an older in-process engine without collective_rpc: reached through its attributes
    old_inner = FakeInner()
    runner = SimpleNamespace(model=old_inner)
    old_worker = SimpleNamespace(model_runner=runner)
    old = SimpleNamespace(llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=old_worker)),
                          reset_prefix_cache=lambda: events.append("reset"))
    engine_on(old).sync_weights(learner)
    assert set(old_inner.loaded[0]) == {"weight", "bias"} and events[-1] == "reset"

    with pytest.raises(RuntimeError, match="neither LLM.collective_rpc nor"):
        engine_on(SimpleNamespace(reset_prefix_cache=lambda: None)).sync_weights(learner)
    with pytest.raises(RuntimeError, match="did not reset its prefix cache"):
        engine_on(SimpleNamespace(collective_rpc=llm.collective_rpc,
                                  reset_prefix_cache=lambda: False)).sync_weights(learner)


def test_sync_weights_sends_a_peft_learner_merged_under_plain_names(fake_vllm):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    plain_names = set(base.state_dict())
    learner = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in learner.named_parameters():
            if "lora_B" in name:
                p.normal_()  # peft starts B at zero; make the adapters matter
    unmerged = {name: t.clone() for name, t in learner.state_dict().items()}
    merged = copy.deepcopy(learner).merge_and_unload().state_dict()
    inner = FakeInner()
    llm = SimpleNamespace(collective_rpc=lambda fn, kwargs: [fn(SimpleNamespace(get_model=lambda: inner), **kwargs)],
                          reset_prefix_cache=lambda: True)
    engine_on(llm).sync_weights(learner)
    (loaded,) = inner.loaded
    assert set(loaded) == plain_names
    for name in plain_names:
        torch.testing.assert_close(loaded[name], merged[name])
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           base.model.layers[0].self_attn.q_proj.base_layer.weight)
    for name, t in learner.state_dict().items():  # the learner is unmerged again
        torch.testing.assert_close(t, unmerged[name])


def test_lora_adapters_get_a_new_id_each_sync(fake_vllm):
    llm = FakeLLM(lambda i, h: [STOP])
    with pytest.raises(ValueError, match="enable_lora=True"):
        engine_on(llm).sync_lora("/tmp/adapter")
    eng = engine_on(llm, enable_lora=True)
    with pytest.raises(ValueError, match="sync_lora"):
        eng.sync_weights(torch.nn.Linear(2, 2))
    eng.sync_lora("/run/adapter_1")
    eng.open([[1]]).generate()
    eng.sync_lora("/run/adapter_2")
    eng.open([[1]]).generate()
    assert [(c.lora.name, c.lora.int_id, c.lora.path) for c in llm.calls] == [
        ("agentrl-policy-1", 1, "/run/adapter_1"), ("agentrl-policy-2", 2, "/run/adapter_2")]


# -- on a GPU with vLLM ----------------------------------------------------------------------------

GPU_REASON = "vLLM needs a CUDA GPU and the [vllm] extra; this machine has neither"
needs_gpu = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
                               reason=GPU_REASON)

# head size 32: FlashAttention takes it in every vLLM release (older ones only 32, 64, 96, ...; the micro model has 8)
GPU_TINY = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1,
                           max_position_embeddings=512, vocab_size=400)
TEMPERATURE = 0.7  # not 1, so that a log-prob taken before temperature would show


@pytest.fixture(scope="module")
def gpu_engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm_policy")
    build_tiny_policy(expert_texts(make("agentrl/Vault-v0", locks=1, slack=0), range(60), noise=0.3), folder, GPU_TINY,
                      seed=0)
    policy = Policy.load(folder, device="cuda")
    chat = policy.chat
    engine = VLLMEngine.from_policy(folder, SamplingConfig(temperature=TEMPERATURE, max_new_tokens=16), chat.stop_ids,
                                    chat.eos_id,
                                    chat.pad_id, seed=0, gpu_memory_utilization=0.2, enforce_eager=True)
    return policy, engine


def recompute(policy, episodes, temperature):
    """Behaviour log-probs and the learner's log-probs from one full forward, at action tokens."""
    batch = make_batch(episodes, policy.chat.pad_id)
    with torch.no_grad():
        logp = token_stats(policy.model, batch.input_ids.cuda(), batch.attention_mask.cuda(), temperature).logp.cpu()
    m = batch.action_mask.bool()
    return batch.behaviour_logp[m], logp[m]


@needs_gpu
def test_vllm_rollout_logprobs_match_a_full_torch_forward(gpu_engine):
    policy, engine = gpu_engine
    envs = [make("agentrl/Vault-v0", locks=1, slack=0) for _ in range(8)]
    episodes, stats = rollout(envs, list(range(8)), engine, policy.chat)
    assert all(e.error is None for e in episodes) and max(e.num_turns for e in episodes) == 2
    assert stats.action_tokens > 0
    behaviour, learner = recompute(policy, episodes, TEMPERATURE)
    torch.testing.assert_close(behaviour, learner, atol=2e-2, rtol=0)  # vLLM in bf16, the learner in float32
    _, before_temperature = recompute(policy, episodes, 1.0)
    assert (behaviour - before_temperature).abs().mean() > 3e-2  # so log-probs taken before temperature would fail


@needs_gpu
def test_sync_weights_changes_what_vllm_generates(gpu_engine):
    policy, engine = gpu_engine
    chat = policy.chat
    greedy = VLLMEngine(engine.llm, SamplingConfig(temperature=0.0, max_new_tokens=8), chat.stop_ids, chat.eos_id,
                        chat.pad_id)
    env = make("agentrl/Vault-v0", locks=1, slack=0)
    prompts = [chat.prompt_ids(env.reset(seed=s)[0], env.tool_schemas(), env.system_prompt) for s in range(4)]
    before = greedy.open(prompts).generate()
    original = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        gen = torch.Generator(device="cuda").manual_seed(0)
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen, device=p.device))  # 2.5x the init scale
        engine.sync_weights(policy.model)
        envs = [make("agentrl/Vault-v0", locks=1, slack=0) for _ in range(4)]
        after, _ = rollout(envs, list(range(4)), greedy, chat)
        assert [e.turns[0].logprobs for e in after] != [g.logprobs for g in before]
        # vLLM now serves the perturbed weights, and no stale cached block of the old ones
        behaviour, learner = recompute(policy, after, 1.0)
        torch.testing.assert_close(behaviour, learner, atol=2e-2, rtol=0)
    finally:
        policy.model.load_state_dict(original)
        engine.sync_weights(policy.model)
