"""benchmarks/decode_bound.py's roofline arithmetic, against a step's bytes and FLOPs counted by hand."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from decode_bound import linear_shapes, step_cost  # noqa: E402

# hidden 4, intermediate 8, one layer, 2 query heads and 1 key/value head of dim 2, vocabulary 10
CONFIG = SimpleNamespace(hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=2, vocab_size=10, tie_word_embeddings=True)
# q 4x4 + k 4x2 + v 4x2 + o 4x4 + gate, up 4x8 each + down 8x4 = 144; two norms of 4 and the final norm 4;
# the embedding 10x4 = 40, which the tied LM head reads as its matrix: 196 weights
PARAMS = 196


def test_a_step_reads_every_weight_once_and_each_rows_cache():
    nbytes, _ = step_cost(CONFIG, PARAMS, batch=1, context=3)
    # 196 weights x 4 bytes, plus K and V: 1 layer x 1 head x dim 2 x 3 positions x 2 tensors x 4 bytes
    assert nbytes == 784 + 48


def test_a_steps_flops_are_two_per_weight_per_row_plus_attention():
    _, flops = step_cost(CONFIG, PARAMS, batch=2, context=3)
    # 2 x 196 x 2 rows = 784; attention: scores and weighted sum, 2 FLOPs each per head-dim per position:
    # 4 x 1 layer x 2 heads x dim 2 x 3 positions x 2 rows = 96
    assert flops == 784 + 96


def test_an_untied_head_is_a_matmul_and_the_embedding_a_lookup():
    untied = SimpleNamespace(**{**vars(CONFIG), "tie_word_embeddings": False})
    nbytes, flops = step_cost(untied, PARAMS + 40, batch=1, context=0)  # the LM head's own 40 weights added
    # 236 weights, 196 of them read by matmuls; the embedding's 40 are a lookup of one row
    assert (nbytes, flops) == (4 * 196, 2 * 196)


def test_the_linear_shapes_are_the_layers():
    assert linear_shapes(CONFIG) == {"q": (4, 4), "kv": (4, 2), "o": (4, 4), "gate_up": (4, 8), "down": (8, 4),
                                     "lm_head": (4, 10)}
