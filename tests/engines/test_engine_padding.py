"""What the torch engine attends over: the additive mask it builds itself, grouped key and value heads read in
place, chunks packed with their attention in levels (or the long chunks' heads fed alone), compaction into
reserved room, and the padding counters.

The oracles: greedy decoding against re-encoding each row's whole history with no cache; the engine with
every one of these off (transformers' own 2D mask and head copies, every chunk padded to the longest), whose
samples and log-probs the mask and the grouped heads reproduce bit for bit and the heads and compactions up to
the last bit of a matmul run at another batch size; padding counted by hand on a two-row batch."""

from __future__ import annotations

import pytest
import torch
from test_engine_prefix import greedy_reencoded  # the oracle: generate by re-encoding the whole history
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.engines import SamplingConfig, TorchEngine
from agentrl.engines.torch import TorchSession, cache, packing
from agentrl.engines.torch.cache import _gather_positions
from agentrl.engines.torch.packing import _additive_mask
from agentrl.registry import make
from agentrl.rollout import rollout


@pytest.fixture(scope="module")
def context_model():
    """A micro Llama (grouped heads: 4 query, 2 key/value) whose greedy choice depends on the whole context."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, initializer_range=0.1, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval()


def plain(engine: TorchEngine) -> TorchEngine:
    """The engine as it was: transformers builds the mask, copies the grouped heads, every chunk padded."""
    engine.mask_dtype = engine.gqa_attention = None
    engine.skip_chunk_padding = False
    engine.tune(head_cost=float("inf"), compact_cost=1e9)
    return engine


def test_additive_mask_is_the_causal_mask_over_the_kept_positions():
    kept = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 1, 1]])  # (b, L): the last 2 positions are the chunk's
    mask = _additive_mask(kept, 2, torch.float32)  # (b, 1, C, L)
    allowed = torch.tensor([[[0, 1, 1, 0, 0], [0, 1, 1, 0, 1]],
                            [[1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]], dtype=torch.bool)[:, None]
    assert mask.shape == (2, 1, 2, 5)
    assert torch.equal(mask == 0, allowed) and bool((mask[~allowed] == float("-inf")).all())
    assert torch.equal(_additive_mask(kept, 1, torch.float32), mask[:, :, 1:])  # a decode step: the last row


@pytest.mark.parametrize("mode", ["packed-levels", "heads-alone", "padded"])
def test_uneven_chunks_decode_what_reencoding_decodes(context_model, mode):
    """One row's observation far longer than the others' every turn: with the chunk packed and its attention in
    levels (the default, here at any cost), the heads fed alone (head_cost 0) or the chunk padded to the longest,
    every row decodes token for token what re-encoding its history decodes."""
    model, g = context_model, torch.Generator().manual_seed(2)

    def rand(n):
        return torch.randint(2, model.config.vocab_size, (n,), generator=g).tolist()

    engine = TorchEngine(model, SamplingConfig(temperature=0, max_new_tokens=5), [], 1, 0)
    assert engine.mask_dtype == torch.float32 and engine.gqa_attention is not None and engine.skip_chunk_padding
    engine.tune(level_gather_cost=0.0, level_call_cost=0.0, head_cost=0.0 if mode == "heads-alone" else float("inf"))
    engine.skip_chunk_padding = mode == "packed-levels"
    history = [rand(6 + 3 * r) for r in range(4)]
    session = engine.open([list(h) for h in history])
    for turn in range(5):
        for row, gen in zip(session.rows, session.generate()):
            assert gen.ids == greedy_reencoded(model, history[row], 5), f"row {row}, turn {turn}"
            history[row] += gen.ids
        obs = [rand(30 if row == turn % 4 else 1 + row) for row in session.rows]
        session.extend(obs)
        for row, o in zip(session.rows, obs):
            history[row] += o
    assert (session.heads_fed > 0) == (mode == "heads-alone")
    assert (session.chunks_in_levels > 0) == (session.tokens_packed_out > 0) == (mode == "packed-levels")


@pytest.mark.parametrize("layout", ["buffer view", "heads last"])
def test_compaction_gather_picks_each_rows_positions(layout):
    """out[b, h, w] = x[rows[b], h, positions[b, w]], whole head vectors, for a cache layer stored as the leading part
    of a larger buffer (the rolling cache) and for one whose heads are not laid out as rows (copied first)."""
    if layout == "buffer view":  # (3, 2, 5, 4) as positions 1:6 of rows 1:4 of a (5, 2, 9, 4) buffer
        buf = torch.arange(5 * 2 * 9 * 4, dtype=torch.float32).view(5, 2, 9, 4)
        x = buf[1:4, :, 1:6]
        value = lambda b, h, p, d: ((b + 1) * 2 * 9 + h * 9 + p + 1) * 4 + d  # noqa: E731
    else:  # (3, 2, 5, 4) whose heads are the fastest-moving axis but one: x[b, h, p, d] = base[b, p, h, d]
        base = torch.arange(3 * 5 * 2 * 4, dtype=torch.float32).view(3, 5, 2, 4)
        x = base.transpose(1, 2)
        value = lambda b, h, p, d: ((b * 5 + p) * 2 + h) * 4 + d  # noqa: E731
    rows = torch.tensor([2, 0])
    positions = torch.tensor([[4, 0, 0], [1, 3, 2]])
    out = _gather_positions(x, rows, positions)
    assert out.shape == (2, 2, 3, 4)
    for b, row in enumerate((2, 0)):
        for h in range(2):
            for w, p in enumerate(positions[b].tolist()):
                assert out[b, h, w].tolist() == [value(row, h, p, d) for d in range(4)]


def greedy_turns_long_in_turn(model, engine: TorchEngine, g: torch.Generator, turns: int = 6, after_generate=None):
    """Three rows from 8-token prompts, decoding greedily for `turns` turns; each turn another row's observation is
    the longest (12 tokens against 2), so every row gets holes in turn. Every row must decode what re-encoding its
    history decodes. Returns the session (the last observations fed, not decoded from)."""

    def rand(n):
        return torch.randint(2, model.config.vocab_size, (n,), generator=g).tolist()

    history = [rand(8) for _ in range(3)]
    session = engine.open([list(h) for h in history])
    for turn in range(turns):
        for row, gen in zip(session.rows, session.generate()):
            assert gen.ids == greedy_reencoded(model, history[row], 4), f"row {row}, turn {turn}"
            history[row] += gen.ids
        if after_generate is not None:
            after_generate()
        obs = [rand(12 if row == turn % 3 else 2) for row in session.rows]
        session.extend(obs)
        for row, o in zip(session.rows, obs):
            history[row] += o
    return session


def test_compaction_gathers_into_the_room_ahead(context_model, monkeypatch):
    """Every row with holes (each turn another row's observation is the longest): the cache is compacted, each
    row still decodes what re-encoding its history decodes, and the chunk after a compaction writes into the
    room the gather left (no layer's keys or values copied again)."""
    model, g = context_model, torch.Generator().manual_seed(4)
    compacted, grew_after = [], []
    compact = TorchSession._compact

    def counting_compact(self, order=None):
        compacted.append(True)
        compact(self, order)

    def counting_append(view, buf, new, room, dim):
        out = cache._append.__wrapped__(view, buf, new, room, dim)
        if dim == -2 and compacted and compacted[-1]:
            grew_after.append(out[1] is not buf)
        return out

    counting_append.__wrapped__ = cache._append
    monkeypatch.setattr(TorchSession, "_compact", counting_compact)
    monkeypatch.setattr(cache, "_append", counting_append)  # the layers' appends

    engine = TorchEngine(model, SamplingConfig(temperature=0, max_new_tokens=4), [], 1, 0)
    engine.tune(head_cost=float("inf"), compact_cost=0.0,
                fill_holes=False)  # chunks filling their rows' holes leave none to compact
    # later appends are another turn's
    session = greedy_turns_long_in_turn(model, engine, g, after_generate=lambda: compacted and compacted.append(False))
    assert session.compactions > 0 and grew_after and not any(grew_after)


def test_fill_plan_and_mask_by_hand():
    """Row 0 has a hole at position 1 and feeds two tokens, row 1 has none and feeds one (left-padded): row 0's
    first token takes its hole, its second and row 1's token a new position 3, so the cache grows by one. Each
    query sees its row's old real positions and the chunk's tokens at or before its own column, wherever they went."""
    old = torch.tensor([[1, 0, 1], [1, 1, 1]])
    chunk_mask = torch.tensor([[1, 1], [0, 1]])
    index = chunk_mask.flatten().nonzero().squeeze(1)  # tokens at rectangle cells 0, 1 and 3
    fill = packing._fill_plan(old, chunk_mask, index)
    assert fill.rows.tolist() == [0, 0, 1] and fill.columns.tolist() == [1, 3, 3] and fill.grow == 1
    mask = packing._fill_mask(old, fill, chunk_mask, index, torch.float32)
    inf = float("-inf")
    assert mask.shape == (2, 1, 2, 4)
    assert mask[0, 0].tolist() == [[0, 0, 0, inf], [0, 0, 0, 0]]
    assert mask[1, 0].tolist() == [[0, 0, 0, inf], [0, 0, 0, 0]]  # the pad query sees the old positions only


def test_a_chunk_fills_its_rows_holes_before_it_widens_the_cache(context_model):
    """Each turn another row's observation is the longest (12 tokens against 2), so the others' chunks leave holes.
    Written into those holes, the cache stays exactly as wide as its longest row: by hand, 8 prompt tokens, then per
    turn 4 action tokens (3 decoded here, the last fed with the next chunk) and the observation. Every row decodes
    what re-encoding its history decodes, and without filling the cache is wider by the holes."""
    model, g = context_model, torch.Generator()
    widths = {}
    for fill in (True, False):
        g.manual_seed(4)
        engine = TorchEngine(model, SamplingConfig(temperature=0, max_new_tokens=4), [], 1, 0)
        engine.tune(head_cost=float("inf"), compact_cost=1e9, fill_holes=fill)
        session = greedy_turns_long_in_turn(model, engine, g)
        session.generate()
        widths[fill] = session.cache_len
        assert session.compactions == 0
    # 7 turns: 8 + 7 * 3 decoded tokens; the first turn's chunk is the prompt; six chunks of each row's last action
    # token and its observation: the longest row's six are 13 + 3 + 3 + 13 + 3 + 3 (rows take the long one in turn)
    assert widths[True] == 8 + 7 * 3 + 2 * 13 + 4 * 3
    assert widths[False] == 8 + 7 * 3 + 6 * 13  # every chunk as wide as the turn's longest


def vault_rollout(policy, engine: TorchEngine):
    chat = policy.chat
    envs = [make("agentrl/Vault-v0", locks=2 + i % 2, slack=0) for i in range(8)]
    sessions = []
    opened = engine.open
    engine.open = lambda prompts: sessions.append(opened(prompts)) or sessions[-1]
    episodes, _ = rollout(envs, list(range(8)), engine, chat, workers="serial")
    return episodes, sessions[0]


def test_mask_and_grouped_heads_change_no_sample(context_model):
    """The engine's own additive mask and SDPA over the grouped heads in place: the same kernels on the same
    numbers as transformers' boolean mask and copied heads for a chunk; a decode step folds each group's query
    heads into the query axis (each key head read once), which may round the last bit differently: the samples are
    equal and the log-probs equal to 1e-6."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 64, (5 + 4 * r,), generator=g).tolist() for r in range(3)]
    obs = [[torch.randint(2, 64, (1 + 7 * ((r + k) % 3),), generator=g).tolist() for r in range(3)] for k in range(3)]
    runs = []
    for own in (True, False):
        engine = TorchEngine(context_model, SamplingConfig(max_new_tokens=6), [], 1, 0, seed=5)
        engine.tune(head_cost=float("inf"), compact_cost=1e9)  # only the mask and the heads differ
        if not own:
            engine.mask_dtype = engine.gqa_attention = None
        session = engine.open(prompts)
        gens = []
        for k in range(3):
            gens += [(g.ids, g.logprobs) for g in session.generate()]
            session.extend(obs[k])
        runs.append(gens)
    assert [ids for ids, _ in runs[0]] == [ids for ids, _ in runs[1]]
    for (_, a), (_, b) in zip(runs[0], runs[1]):
        assert a == pytest.approx(b, abs=1e-6)


@pytest.mark.parametrize("mode", ["packed-levels", "heads-alone"])
def test_vault_rollout_with_uneven_observations_matches_the_plain_engine(vault_policy, mode):
    """A multi-turn Vault rollout (observations of uneven length every turn, sampling at T=1): the engine with
    its chunks packed and their attention in levels, written into their rows' holes (or its heads fed alone), its
    cache compacted into reserved room, its own mask and grouped heads samples what the plain engine samples, up to
    the last bit of a matmul run at another batch size or over keys in another order (at most one episode of 8 goes
    its own way after such a flip), with log-probs equal to 1e-5 wherever the tokens agree, and computes fewer of
    its attention's query-key pairs for padding."""
    chat = vault_policy.chat
    sampling = SamplingConfig(max_new_tokens=8)
    fast = TorchEngine(vault_policy.model, sampling, [], chat.eos_id, chat.pad_id, seed=7)
    fast.tune(compact_cost=0.0)  # every lever as often as it can be pulled
    if mode == "heads-alone":
        fast.skip_chunk_padding = False
        fast.tune(head_cost=0.0)
    else:
        fast.tune(level_gather_cost=0.0, level_call_cost=0.0)
    slow = plain(TorchEngine(vault_policy.model, sampling, [], chat.eos_id, chat.pad_id, seed=7))
    (eps, session), (ref, ref_session) = vault_rollout(vault_policy, fast), vault_rollout(vault_policy, slow)
    if mode == "heads-alone":
        assert session.heads_fed > 0
    else:
        assert session.chunks_in_levels > 0 and session.tokens_packed_out > 0 and session.chunks_filled > 0
    assert [e.num_turns for e in eps] == [e.num_turns for e in ref]
    same = [a.token_ids() == b.token_ids() for a, b in zip(eps, ref)]
    assert sum(same) >= len(ref) - 1
    gaps = [abs(x - y) for a, b, s in zip(eps, ref, same) if s for ta, tb in zip(a.turns, b.turns)
            for x, y in zip(ta.logprobs, tb.logprobs)]
    assert max(gaps) < 1e-5

    def padded(s):  # the share of the attention's query-key pairs that were padding
        computed, real = (sum(s.attention_pairs[kind][i] for kind in ("chunk", "decode")) for i in (0, 1))
        return 1 - real / computed

    assert padded(session) < padded(ref_session)


def test_padding_counters_by_hand(context_model):
    """Two prompts of 3 and 5 tokens, two new tokens: the prefill attends over 2 rows x 5 positions (2 of them
    the short row's padding), the one decode step over 2 x 6 (the same 2)."""
    engine = TorchEngine(context_model, SamplingConfig(max_new_tokens=2), [], 1, 0, seed=0)
    session = engine.open([[5, 6, 7], [8, 9, 10, 11, 12]])
    session.generate()
    assert session.forwards == 2
    assert (session.positions_attended, session.positions_padding) == (2 * 5 + 2 * 6, 2 + 2)
    # query-key pairs: the prefill computes 2 x 5 queries x 5 keys, of which real: the short row's 3 queries see
    # 1, 2, 3 real keys, the long row's 5 see 1..5; the decode step 2 x 1 x 6, real 3 + 1 and 5 + 1
    assert session.attention_pairs == {"chunk": [50, 6 + 15], "decode": [12, 4 + 6]}


def test_rollout_stats_carry_the_sessions_padding_counts(vault_policy):
    """What the rollout reports (and the trainer logs as rollout/cache_padding_frac) is the session's own count."""
    chat = vault_policy.chat
    engine = TorchEngine(vault_policy.model, SamplingConfig(max_new_tokens=8), [], chat.eos_id, chat.pad_id, seed=7)
    sessions = []
    opened = engine.open
    engine.open = lambda prompts: sessions.append(opened(prompts)) or sessions[-1]
    envs = [make("agentrl/Vault-v0", locks=2 + i % 2, slack=0) for i in range(4)]
    _, stats = rollout(envs, list(range(4)), engine, chat, workers="serial")
    assert stats.positions_attended == sessions[0].positions_attended > 0
    assert stats.positions_padding == sessions[0].positions_padding
    assert 0 <= stats.positions_padding < stats.positions_attended


@pytest.mark.parametrize("arch", ["llama", "llama-bias", "llama-bf16", "qwen2", "qwen3", "llama-lora"])
def test_layers_called_in_turn_match_the_model_bit_for_bit(arch):
    """The engine calls a llama-family decoder's layers in turn instead of the model (`_run_layers`), and runs each
    layer's ops itself (`_layer`): over three turns of uneven observations (packed chunks, decode steps, sampling at
    T=1) the tokens, log-probs and turn-critic hidden states are exactly those of the engine calling the layers as
    modules, and of the engine calling the model itself. Biases (llama's optional ones, qwen2's), qwen3's per-head
    norms and a bf16 engine each take their own ops; with LoRA (peft) the adapters, which change the samples, are in
    all three."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)
    if arch == "llama-bias":
        shape.update(attention_bias=True, mlp_bias=True)
    config, cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}.get(
        arch, (LlamaConfig, LlamaForCausalLM))
    model = cls(config(**shape)).eval()
    if arch == "llama-bias":  # transformers starts biases at zero: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.normal_(p, std=0.5)
    if arch == "llama-lora":
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero (an adapter that changes nothing): make it matter
                torch.nn.init.normal_(p, std=0.5)
        model.eval()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 64, (4 + 3 * r,), generator=g).tolist() for r in range(4)]
    obs = [[torch.randint(2, 64, (1 + 9 * ((r + k) % 3),), generator=g).tolist() for r in range(4)] for k in range(3)]
    runs = []
    for way in ("ops", "layers", "model"):
        engine = TorchEngine(model, SamplingConfig(max_new_tokens=5), [], 1, 0, seed=9, capture_hidden=True,
                             dtype="bf16" if arch == "llama-bf16" else "auto")
        assert engine.decoder is not None and engine.inline_layers
        engine.inline_layers = way == "ops"
        if way == "model":
            engine.decoder = None
        session = engine.open(prompts)
        gens = []
        for k in range(3):
            gens += [(g.ids, g.logprobs, g.hidden) for g in session.generate()]
            session.extend(obs[k])
        assert session.tokens_packed_out > 0
        runs.append(gens)
    assert runs[0] == runs[1] == runs[2]
    if arch == "llama-lora":  # the adapters were in the samples
        with model.disable_adapter():
            engine = TorchEngine(model, SamplingConfig(max_new_tokens=5), [], 1, 0, seed=9, capture_hidden=True)
            base = [(g.ids, g.logprobs, g.hidden) for g in engine.open(prompts).generate()]
        assert base != runs[0][: len(base)]


def test_a_model_loaded_from_disk_runs_its_layers_inline_unless_a_hub_kernel_replaced_one(context_model, tmp_path):
    """transformers kernelizes every model it loads while `kernels` is installed, so `use_kernels` is True for each
    model read from disk even where no kernel replaced anything (offline, or a CPU with no mapped kernel). Such a
    model runs its layers' ops in the engine (`_layer`), with the samples of the module calls; a model one of whose
    norms a hub kernel did replace (the mark kernels leaves, as its own `get_kernelized_layers` reads it) is called
    through its modules."""
    context_model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10]]

    def samples(inline: bool) -> list:
        engine = TorchEngine(loaded, SamplingConfig(max_new_tokens=4), [], 1, 0, seed=3)
        assert engine.inline_layers
        engine.inline_layers = inline
        return [(g.ids, g.logprobs) for g in engine.open(prompts).generate()]

    assert samples(inline=True) == samples(inline=False)

    norm = loaded.model.layers[1].post_attention_layernorm
    vars(norm)["_kernel_repo"] = "kernels-community/some-rmsnorm"  # what kernelize records beside its forward
    try:
        kernels = pytest.importorskip("kernels")
        assert kernels.get_kernelized_layers(loaded).layers  # kernels reads the same mark
        assert not TorchEngine(loaded, SamplingConfig(max_new_tokens=4), [], 1, 0, seed=3).inline_layers
    finally:
        del vars(norm)["_kernel_repo"]


def test_a_finished_session_is_freed_without_the_cyclic_gc(context_model):
    """A session's cache buffers go when the last reference to the session does, by reference counting alone:
    a reference cycle through the cache left each finished rollout's buffers to Python's rare full collections,
    and a 32-turn benchmark process grew by ~200 MB a round. Over turns that grow, compact and window the cache,
    with the cyclic collector off, the session, its cache and a layer's key buffer are gone once deleted."""
    import gc
    import weakref

    engine = TorchEngine(context_model, SamplingConfig(max_new_tokens=3), [], 1, 0, seed=2)
    engine.tune(compact_cost=0.0)  # compact whenever there are holes: that path too
    gc.collect()
    gc.disable()
    try:
        session = engine.open([[3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [13]])
        for k in range(3):
            session.generate()
            session.extend([[20 + k] * (1 + 5 * ((r + k) % 2)) for r in range(3)])
        session.drop([1])
        session.generate()
        layer = session.cache.layers[0]
        refs = [weakref.ref(session), weakref.ref(session.cache), weakref.ref(layer.keys)]
        assert all(r() is not None for r in refs)
        del session, layer
        assert [r() is None for r in refs] == [True, True, True]
    finally:
        gc.enable()


def test_a_kernels_without_its_inspector_keeps_a_loaded_model_on_its_module_calls(context_model, tmp_path, monkeypatch):
    """Where `kernels` cannot say what it replaced (a version without `get_kernelized_layers`), the engine trusts
    transformers' `use_kernels` flag, as it did before it asked: a loaded model is called through its modules."""
    kernels = pytest.importorskip("kernels")
    context_model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    if not loaded.use_kernels:
        pytest.skip("this transformers did not kernelize the loaded model")
    monkeypatch.delattr(kernels, "get_kernelized_layers")
    assert not TorchEngine(loaded, SamplingConfig(max_new_tokens=2), [], 1, 0, seed=3).inline_layers
