"""The torch engine's kept cache against re-encoding, and its in-place cache growth.

Sampled log-probs at T=1 against a full recompute are pinned in test_rollout.py
(`test_kv_cached_rollout_logprobs_match_full_recompute`, to 1e-4); here: greedy tokens against
re-encoding the whole history every turn, with and without padding holes; the cache that grows
into reserved room (`_RollingCache`, `_append`) against the plain `DynamicCache` it replaces, whose
run at T=0.8 with top-k also checks its log-probs against a recompute to 1e-5; and that decoding
a turn does not reallocate the cache.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from collections import Counter

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from agentrl.engines import SamplingConfig, TorchEngine
from agentrl.engines.torch import cache, forward, prefill
from agentrl.engines.torch.cache import _append
from agentrl.policy import token_stats
from agentrl.registry import make
from agentrl.rollout import rollout
from agentrl.store import make_batch


@torch.no_grad()
def greedy_reencoded(model, history: list[int], max_new: int, stops: set[int]) -> list[int]:
    """The reference: one row, no padding, no cache; the whole history is run again for every token."""
    ids, out = list(history), []
    for _ in range(max_new):
        tok = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
        if tok in stops:
            break
    return out


@pytest.fixture(scope="module")
def context_model():
    """A micro Llama whose greedy choice depends on the context, not just on the last token (an
    untrained model at the usual init scale often ignores context, and would miss a masking bug)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, initializer_range=0.1, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("ragged", [True, False], ids=["ragged", "even"])
def test_greedy_with_kept_cache_equals_reencoding_the_history(context_model, ragged):
    """Rows of different lengths (padding holes in the cache) or of one length (no holes, and no
    mask given to the model, until a row stops), rows that stop early inside a turn, rows that
    leave the batch after their last turn: the cached engine decodes token for token what
    re-encoding each row's whole history decodes."""
    model, pad_id, eos_id = context_model, 0, 1
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size

    def length(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g)) if ragged else 4

    prompts = [torch.randint(2, vocab, (length(3, 18),), generator=g).tolist() for _ in range(5)]
    turns = [4, 2, 4, 3, 1]  # row i takes turns[i] turns, then keep() drops it
    obs = [[torch.randint(2, vocab, (length(1, 8),), generator=g).tolist() for _ in range(4)] for _ in prompts]
    max_new = 8
    # a stop token that the rows' first greedy actions contain in some rows but not all, so that
    # rows finish at different steps of a turn
    first = [greedy_reencoded(model, p, max_new, set()) for p in prompts]
    seen = Counter(t for action in first for t in set(action))
    stop = next(t for t, n in seen.most_common() if n < len(prompts))
    stops = {stop}

    engine = TorchEngine(model, SamplingConfig(temperature=0, max_new_tokens=max_new), list(stops), eos_id, pad_id)
    session = engine.open(prompts)
    history = [list(p) for p in prompts]
    finishes = set()
    for k in range(max(turns)):
        gens = session.generate()
        for row, gen in zip(session.rows, gens):
            assert gen.ids == greedy_reencoded(model, history[row], max_new, stops), f"row {row}, turn {k}"
            history[row] += gen.ids
        finishes.add(tuple(sorted({g.finish for g in gens})))
        keep = [pos for pos, row in enumerate(session.rows) if turns[row] > k + 1]
        session.keep(keep)
        session.extend([obs[row][k] for row in session.rows])
        for row in session.rows:
            history[row] += obs[row][k]
    assert ("length", "stop") in finishes, "no turn had rows stopping early and rows running to the cap"


class PlainCacheEngine(TorchEngine):
    """The engine on transformers' own `DynamicCache` (which concatenates at every token)."""

    def open(self, prompts):
        session = super().open(prompts)
        session.cache = DynamicCache()
        return session


def test_rolling_cache_changes_nothing_and_logprobs_match_recompute(vault_policy):
    """Writing into reserved room is an optimisation only: with the same seed, the same samples and
    bit-identical log-probs as `DynamicCache`, across turns with rows leaving the batch; and the
    log-probs equal one forward over the finished episodes to 1e-5."""
    chat = vault_policy.chat
    sampling = SamplingConfig(temperature=0.8, top_k=50, max_new_tokens=10)
    runs = []
    for cls in (TorchEngine, PlainCacheEngine):
        envs = [make("agentrl/Vault-v0", locks=1 + i % 3) for i in range(6)]
        engine = cls(vault_policy.model, sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=4, capture_hidden=True)
        engine.share_prefill = False  # the prompts' common prefix run once is test_engine_prefix.py's
        # one forward over the whole batch in both runs (DynamicCache has no windows); chunks written into holes
        # put keys in another order, which rounds the last bit of a sum differently: test_engine_padding.py
        # compares that to the plain engine
        engine.tune(length_buckets=False, fill_holes=False)
        # serial env steps: the same batches in both runs, so that log-probs can compare bit for bit
        runs.append(rollout(envs, list(range(6)), engine, chat, workers="serial")[0])
    rolling, plain = runs
    assert len({e.num_turns for e in rolling}) > 1  # episodes left the batch at different turns
    assert [e.token_ids() for e in rolling] == [e.token_ids() for e in plain]
    assert [t.logprobs for e in rolling for t in e.turns] == [t.logprobs for e in plain for t in e.turns]
    assert [t.hidden for e in rolling for t in e.turns] == [t.hidden for e in plain for t in e.turns]

    batch = make_batch(rolling, chat.pad_id)
    with torch.no_grad():
        logp = token_stats(vault_policy.model, batch.input_ids, batch.attention_mask, temperature=0.8).logp
    m = batch.action_mask.bool()
    assert torch.allclose(logp[m], batch.behaviour_logp[m], atol=1e-5), (logp[m] - batch.behaviour_logp[m]).abs().max()


def test_append_writes_in_place_until_the_room_is_used():
    cat = torch.arange(12).reshape(2, 6)
    view, buf = _append(cat[:, :0], None, cat[:, :2], room=5, dim=1)
    assert buf.shape == (2, 5) and torch.equal(view, cat[:, :2])
    first = buf.data_ptr()
    for t in range(2, 5):  # one position at a time, into the room: no new buffer
        view, buf = _append(view, buf, cat[:, t : t + 1], room=5, dim=1)
        assert buf.data_ptr() == first and torch.equal(view, cat[:, : t + 1])
    view, buf = _append(view, buf, cat[:, 5:6], room=5, dim=1)  # full: grows to just what is needed
    assert buf.data_ptr() != first and buf.shape == (2, 6) and torch.equal(view, cat)
    swapped = view[[1, 0]]  # the caller replaced the view (keep() selecting rows): it is adopted
    view, buf = _append(swapped, buf, torch.tensor([[7], [8]]), room=9, dim=1)
    assert torch.equal(view, torch.cat([swapped, torch.tensor([[7], [8]])], 1)) and buf.shape == (2, 9)

    kv = torch.randn(3, 2, 4, 5)  # (B, H, L, D): keys grow along -2
    view, buf = _append(kv[:, :, :1], None, kv[:, :, 1:3], room=4, dim=-2)
    view, buf = _append(view, buf, kv[:, :, 3:], room=4, dim=-2)
    assert torch.equal(view, kv) and buf.shape == (3, 2, 4, 5)


def test_decoding_a_turn_does_not_reallocate_the_cache(vault_policy, monkeypatch):
    """The point of the rolling cache: a turn's tokens are written into room reserved at its first
    forward, so buffers are (re)allocated a bounded number of times per turn, not once per token."""
    grown, appends = [], []

    def counting_append(view, buf, new, room, dim):
        out = _append(view, buf, new, room, dim)
        appends.append(1)
        grown.append(out[1] is not buf)
        return out

    for module in (cache, forward, prefill):  # the layers', the mask's and the shared prefill's appends
        monkeypatch.setattr(module, "_append", counting_append)
    chat = vault_policy.chat
    layers = vault_policy.model.config.num_hidden_layers
    engine = TorchEngine(vault_policy.model, SamplingConfig(max_new_tokens=12), [], chat.eos_id, chat.pad_id, seed=0)
    session = engine.open([[5, 6, 7], [8, 9]])
    turns = 3
    for _ in range(turns):
        gens = session.generate()
        assert [len(g.ids) for g in gens] == [12, 12]
        session.extend([[10, 11], [12]])
    # per turn: the mask and every layer's keys and values grow once (the first write of a session
    # goes through DynamicLayer itself); appends: 12 forwards a turn, 1 + 2 * layers tensors each
    assert len(appends) > 10 * turns * (1 + 2 * layers)
    assert sum(grown) <= turns * (1 + 2 * layers)
    for layer in session.cache.layers:
        assert layer.keys.shape[-2] == session.cache_len and layer.key_buf.shape[-2] >= session.cache_len
        assert layer.keys.data_ptr() == layer.key_buf.data_ptr()


@pytest.mark.parametrize("compact_cost", [0.0, 1e9], ids=["reordered", "in-place"])
def test_length_windows_decode_what_reencoding_decodes(context_model, compact_cost):
    """Rows of very different lengths in one batch (old rows beside rows refilled into freed slots,
    the continuous-batching case): each turn runs on runs of slots, each over a window of the cache
    that starts at its own rows' earliest position, after reordering the slots by length (reordered)
    or as they are (in-place). Every row still decodes token for token what re-encoding its whole
    history decodes, and the turns that ran on windows did run on them."""
    model, pad_id, eos_id = context_model, 0, 1
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size

    def rand(n):
        return torch.randint(2, vocab, (n,), generator=g).tolist()

    max_new = 6
    engine = TorchEngine(model, SamplingConfig(temperature=0, max_new_tokens=max_new), [], eos_id, pad_id)
    engine.tune(split_cost=0.0, compact_cost=compact_cost)  # cut wherever attention is saved
    history = {r: rand(40 + 9 * r) for r in range(4)}
    session = engine.open([history[r] for r in range(4)])
    next_row = 4
    for turn in range(6):
        want = [r for r in session.rows if (r + turn) % 3]  # some rows wait on their tool this turn
        gens = session.generate(rows=want)
        for row, gen in zip(want, gens):
            assert gen.ids == greedy_reencoded(model, history[row], max_new, set()), f"row {row}, turn {turn}"
            history[row] += gen.ids
        if turn in (1, 3):  # the oldest row leaves; a fresh, short episode takes its slot
            gone = session.rows[0]
            session.drop([gone])
            session.add([next_row], [rand(3)])
            history[next_row] = list(session.pending[session._slots([next_row])[0]])
            next_row += 1
        for row in [r for r in want if r in session.rows]:
            obs = rand(1 + (row + turn) % 4)
            session.extend([obs], rows=[row])
            history[row] += obs
    assert session.groups_run > 0
    assert (session.compactions > 0) == (compact_cost == 0.0)


_FAULTS_SCRIPT = """
import resource, sys, torch
if sys.argv[1] == "engine":
    from agentrl.engines.torch import keep_freed_memory
    assert keep_freed_memory()
def round_(r):  # 3 blocks of 20 MB + r MB, touched, then freed: a cache that grows a little each turn
    blocks = [torch.ones((5 << 20) + r * (1 << 18)) for _ in range(3)]
    del blocks
for r in range(3):  # warm-up: the heap grows to its steady size
    round_(r)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for r in range(3, 8):
    round_(r)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc")
def test_freed_cache_sized_blocks_are_reused_not_faulted_in_again():
    """Three 20-27 MB tensors, a little larger each round, allocated, touched and freed: glibc's defaults map each
    afresh (its dynamic threshold only rises to the last size freed), ~5,000 page faults a block; with the engine's
    setting they come from the heap, and a round faults in only its growth."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "AGENTRL_SYSTEM_MALLOC"}

    def faults(arm: str) -> int:
        out = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, arm], env=env, capture_output=True, text=True,
                             check=True)
        return int(out.stdout.split()[-1])

    pages = 3 * (20 << 20) // resource.getpagesize()
    assert faults("plain") > pages // 2  # the control: by default the blocks go back to the kernel
    assert faults("engine") < pages // 4  # measured: 19,200 against 770-1,230, six runs each
