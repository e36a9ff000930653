"""One prefill per distinct prompt (`TorchSession._share_prefill`): rows that start from the same prompt
(a GRPO group) have it run through the model once, and a prefix common to different prompts (a system
prompt and its tools) runs once for all of them.

The oracles: greedy decoding against re-encoding each row's whole history with no cache at all; sampled
tokens and log-probs against the same engine with sharing off; the saved token counts against the
prompts' lengths, counted by hand."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.engines import SamplingConfig, TorchEngine
from agentrl.registry import make
from agentrl.rollout import rollout


@pytest.fixture(scope="module")
def context_model():
    """A micro Llama whose greedy choice depends on the whole context (initializer_range 0.1)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, initializer_range=0.1, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


@torch.no_grad()
def greedy_reencoded(model, history: list[int], max_new: int) -> list[int]:
    ids, out = list(history), []
    for _ in range(max_new):
        tok = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
    return out


def grouped_prompts(system: int = 18, tails=(2, 17, 9), group: int = 4, seed: int = 0) -> list[list[int]]:
    """`len(tails)` groups of `group` identical prompts: one `system`-token prefix, then a tail of each length."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(2, 64, (system,), generator=g).tolist()
    groups = [head + torch.randint(2, 64, (n,), generator=g).tolist() for n in tails]
    return [list(p) for p in groups for _ in range(group)]


def test_shared_prefill_counts_the_tokens_it_skips(context_model):
    """3 groups of 4 rows, prompts 20, 35 and 27 tokens long with an 18-token common prefix. Unshared, the
    model runs 4 * (20 + 35 + 27) = 328 prompt tokens. Shared: the prefix once (18), each group's rest but
    its last token once (1 + 16 + 8), and every row's last token (12): 55 run, 273 saved."""
    engine = TorchEngine(context_model, SamplingConfig(temperature=0, max_new_tokens=3), [1], 1, 0)
    session = engine.open(grouped_prompts())
    session.generate()
    assert (session.prefill_tokens, session.prefill_saved) == (55, 273)
    engine.share_prefill = False
    session = engine.open(grouped_prompts())
    session.generate()
    assert (session.prefill_tokens, session.prefill_saved) == (328, 0)


def test_a_short_common_prefix_is_not_run_apart(context_model):
    """A common prefix under min_shared_prefix (16) tokens is not worth a forward of its own: only the
    groups' duplicates are saved, 3 * (9 + 24 + 16) = 147 tokens."""
    engine = TorchEngine(context_model, SamplingConfig(temperature=0, max_new_tokens=3), [1], 1, 0)
    session = engine.open(grouped_prompts(system=8))
    session.generate()
    assert session.prefill_saved == 3 * ((8 + 2 - 1) + (8 + 17 - 1) + (8 + 9 - 1))


@pytest.mark.parametrize("system", [18, 0], ids=["common-prefix", "groups-only"])
def test_greedy_with_shared_prefill_equals_reencoding_the_history(context_model, system):
    """Three turns of greedy decoding, each row given its own observations after the first: what the
    shared-prefill engine decodes is what re-encoding each row's history with no cache decodes."""
    max_new = 5
    prompts = grouped_prompts(system=system, tails=(20, 35, 27) if not system else (2, 17, 9))
    g = torch.Generator().manual_seed(1)
    obs = [[torch.randint(2, 64, (1 + (i * 3 + k) % 6,), generator=g).tolist() for k in range(2)]
           for i in range(len(prompts))]
    engine = TorchEngine(context_model, SamplingConfig(temperature=0, max_new_tokens=max_new), [], 1, 0)
    session = engine.open(prompts)
    history = [list(p) for p in prompts]
    for turn in range(3):
        gens = session.generate()
        for i, gen in enumerate(gens):
            assert gen.ids == greedy_reencoded(context_model, history[i], max_new), (turn, i)
            history[i] += gen.ids
        if turn < 2:
            # the action's last token is pending in the engine (not yet in its cache): the history has it already
            session.extend([o[turn] for o in obs])
            for i in range(len(prompts)):
                history[i] += obs[i][turn]
    assert session.prefill_saved > 0


def test_rows_joining_a_running_batch_share_their_prompt(context_model):
    """Continuous batching: two rows decode a turn, then a group of three identical prompts joins (one into
    the slot a finished row freed); the joiners decode what re-encoding decodes, and share their prefill."""
    max_new = 4
    first = grouped_prompts(system=0, tails=(11, 23), group=1, seed=2)
    joiner = grouped_prompts(system=0, tails=(30,), group=1, seed=3)[0]
    engine = TorchEngine(context_model, SamplingConfig(temperature=0, max_new_tokens=max_new), [], 1, 0)
    session = engine.open(first)
    session.generate()
    session.drop([0])
    session.add([2, 3, 4], [joiner] * 3)
    saved = session.prefill_saved
    gens = session.generate(rows=[2, 3, 4])
    want = greedy_reencoded(context_model, joiner, max_new)
    assert [g.ids for g in gens] == [want] * 3
    assert session.prefill_saved - saved == 2 * (len(joiner) - 1)


def test_sampling_with_shared_prefill_matches_row_by_row_prefill(vault_policy):
    """Whole Vault rollouts at temperature 1, four groups of four: the same tokens as with every row's prompt
    prefilled, log-probs equal to 1e-5, and the saved tokens those the prompts' lengths give: per group, its
    rows after the first; across the groups, the common prefix after the first group's."""
    chat = vault_policy.chat
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=10)
    seeds = [s for s in (3, 5, 8, 13) for _ in range(4)]
    runs, stats = [], []
    for share in (True, False):
        envs = [make("agentrl/Vault-v0", locks=2) for _ in seeds]
        engine = TorchEngine(vault_policy.model, sampling, chat.stop_ids, chat.eos_id, chat.pad_id, seed=7)
        engine.share_prefill = share
        episodes, st = rollout(envs, seeds, engine, chat, workers="serial", schedule="lockstep")
        runs.append(episodes)
        stats.append(st)
    shared, plain = runs
    assert [e.token_ids() for e in shared] == [e.token_ids() for e in plain]
    a = torch.tensor([lp for e in shared for t in e.turns for lp in t.logprobs])
    b = torch.tensor([lp for e in plain for t in e.turns for lp in t.logprobs])
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    heads = [tuple(e.prompt_ids[:-1]) for e in plain]
    unique = list(dict.fromkeys(heads))
    common = 0
    while all(len(h) > common and h[common] == unique[0][common] for h in unique):
        common += 1
    across = (len(unique) - 1) * common if common >= 16 else 0
    within = sum(len(h) for h in heads) - sum(len(h) for h in unique)
    assert stats[0].prefill_tokens_saved == within + across
    assert stats[1].prefill_tokens_saved == 0
    assert stats[0].prefill_tokens + stats[0].prefill_tokens_saved == stats[1].prefill_tokens
    assert stats[1].prefill_tokens == sum(len(e.prompt_ids) for e in plain)
