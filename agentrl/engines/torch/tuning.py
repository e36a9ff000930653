"""The torch engine's cost model and levers, as one frozen value per kind of device.

Where a CPU pays for every row and every position a forward attends over, an accelerator pays for a forward
whatever its rows: so on an accelerator the batch is never cut into runs and no chunk's head is fed alone. The CPU
values were fitted with the tiny policy on a 2-core machine (docs/benchmarks.md, "The torch engine's tuning").

>>> EngineTuning.for_device(torch.device("cpu")) == CPU_TUNING
True
>>> ACCELERATOR_TUNING.split_cost > CPU_TUNING.split_cost
True
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

NEVER = 1e12  # a cost no saving outweighs: the lever is never pulled


@dataclass(frozen=True)
class EngineTuning:
    # Planning a turn (TorchSession._plan): costs in row-positions of one turn's attention; a turn over a run of
    # slots costs about split_cost + rows * (row_cost + cache width).
    length_buckets: bool = True  # cut the batch into runs of rows of similar length, each over its own window
    split_cost: float = 12_000.0  # another forward: a cut is made only where it saves more attention than this
    row_cost: float = 156.0  # a row's own cost per turn, whatever its width
    compact_cost: float = 0.1  # gathering one row-position when the cache is compacted, against attending over it
    # A chunk with padding (packing._chunk_run): costs in query-key pairs of attention.
    level_gather_cost: float = 3.5  # gathering a row's keys and values at one position for a level of its own
    level_call_cost: float = 6_000.0  # one more SDPA call
    fill_holes: bool = True  # a packed chunk writes each row's tokens into that row's holes before widening the cache
    # Without the engine's attention, the longest chunks' heads may run in forwards of their own (forward._feed_heads).
    head_cost: float = 40_000.0  # a forward's fixed cost in query-key pairs
    # Prompts (prefill._share_prefill): a prefix common to different prompts runs once when at least this long.
    min_shared_prefix: int = 16

    @staticmethod
    def for_device(device: torch.device) -> EngineTuning:
        """The preset for `device`: the CPU's cost model on a CPU, the accelerator's anywhere else."""
        return CPU_TUNING if device.type == "cpu" else ACCELERATOR_TUNING


CPU_TUNING = EngineTuning()
# a forward costs nearly the same for any number of rows: never cut the batch (a run still skips the leading holes
# and freed slots at its edges), never feed a head alone
ACCELERATOR_TUNING = replace(CPU_TUNING, split_cost=NEVER, head_cost=NEVER)
