"""The default backend: batched generation with transformers models in plain torch.

All rows of a session share one KV cache laid out as a rectangle. Rows differ in length, so every chunk fed to the
model (the prompts, then each turn's observations) is left-padded to the longest row, and padding stays in the
cache as masked holes; positions come from the attention mask, so a row sees the same positions it would see
unpadded (and in training). One forward per generated token serves the whole batch; a row that has stopped feeds a
masked pad token until the turn ends. Finished episodes leave the batch with `keep()`, which slices the cache.

Where things are:

- `engine`: `TorchEngine` (which fast paths a model gets) and `TorchSession` (rows in slots, a turn's plan and its
  decode loop); `for_policy`, the registry's builder;
- `tuning`: `EngineTuning`, the cost model's values, one preset for CPUs and one for accelerators;
- `sampling`: a token per row, and the per-row random numbers that make it independent of the batch;
- `cache`: the KV cache written into room reserved ahead (`_RollingCache`), windows of it for runs of slots;
- `packing`: a padded chunk's mask, run packed (only its real tokens through the layers), its attention in levels,
  its tokens written into their rows' holes;
- `forward`: one forward of a run of slots, and the long chunks' heads fed alone;
- `planning`: where a turn cuts the batch into runs, and which heads run alone;
- `prefill`: a prompt shared by several rows prefilled once;
- `cpu`: the CPU fast path (the engine's attention, its decoder layers, malloc).

Over many turns the observation chunk is the costly forward (on CPU, rows x chunk width x cache width of attention,
against rows x cache width for a decode step). The engine builds its additive mask once per forward and lets SDPA
read grouped key/value heads in place. A chunk with padding runs packed and its attention in levels, so that no row
attends over a longer row's columns. Where the engine's attention is not used, the longest observations' heads are
fed in forwards of their own instead. The holes are squeezed out of the cache when that pays (`_compact`), and a
packed chunk fills them first. `positions_attended` / `positions_padding` count what the forwards attended over and
how much of it was holes; `attention_pairs` counts the query-key pairs computed and how many were real.
"""

from agentrl.engines.torch.cpu.malloc import keep_freed_memory
from agentrl.engines.torch.engine import TorchEngine, TorchSession, for_policy
from agentrl.engines.torch.sampling import row_uniforms, sample_tokens
from agentrl.engines.torch.tuning import ACCELERATOR_TUNING, CPU_TUNING, EngineTuning

__all__ = ["ACCELERATOR_TUNING", "CPU_TUNING", "EngineTuning", "TorchEngine", "TorchSession", "for_policy",
           "keep_freed_memory", "row_uniforms", "sample_tokens"]
