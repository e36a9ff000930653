"""Many processes, one run: what each rank does on its own and what all of them do together.

Under `accelerate launch -m agentrl train` (or `agentrl train --num-processes N`, which starts that
launcher) every rank runs the same loop, and the trainer keeps to four rules:

- **One task stream.** Every rank draws the update's task seeds from the same generator and rolls out a
  contiguous block of the groups (whole groups stay on one rank), its sampling streams keyed by the
  episode's place in the whole update: the union of the ranks' episodes is the episodes one process
  would have rolled out.
- **One batch for credit.** After a rollout the ranks exchange their episodes (`Ranks.gather`), so
  every rank assigns credit over the whole batch alike: critic and PRM fits, whitening over turns,
  zero-advantage counts and dynamic sampling's resample decision see every episode, and agree.
- **Own rows for the gradient.** A rank runs forward and backward on its own episodes only, each
  micro-batch weighted by its share of the whole minibatch's aggregate (tokens or episodes, counted over
  all ranks), and DDP averages the gradients: the step is the one-process step.
- **One writer.** The main process alone writes config.yaml, metrics.jsonl, summary.json and the
  checkpoints; each rank writes its own store shard.

With one process every method here is the identity and nothing touches `torch.distributed`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def launched() -> bool:
    """Whether this process is one rank of a multi-process launch (torchrun / accelerate set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


class RankError(RuntimeError):
    """Another rank failed at a point where every rank meets; raised on the ranks that did not fail."""


class Ranks:
    """This process's place among the run's processes, and the few collectives the trainer needs.

    Built after accelerate's state (an `Accelerator` or `PartialState`), which initialises the process
    group (gloo on CPU, NCCL on GPUs); objects travel pickled through `all_gather_object`, which suits
    what crosses here (episodes, small dicts of floats), not weights."""

    def __init__(self, cpu: bool | None = None) -> None:
        from accelerate import PartialState

        state = PartialState(**({} if cpu is None else {"cpu": cpu}))
        self.rank, self.world, self.main = state.process_index, state.num_processes, state.is_main_process
        self._state = state

    def __repr__(self) -> str:
        return f"Ranks(rank={self.rank}, world={self.world})"

    def block(self, n: int, rank: int | None = None) -> tuple[int, int]:
        """The contiguous share [lo, hi) of n items of this rank (or of `rank`); the first n % world ranks
        take one more."""
        rank = self.rank if rank is None else rank
        size, extra = divmod(n, self.world)
        lo = rank * size + min(rank, extra)
        return lo, lo + size + (rank < extra)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """The main process's `obj`, on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Key-wise sums over the ranks (a key missing on a rank counts 0)."""
        if self.world == 1:
            return dict(values)
        out: dict[str, float] = {}
        for part in self.gather(values):
            for k, v in part.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def agree(self, error: BaseException | None, where: str) -> None:
        """Meet the other ranks after a step that may have failed on some. A rank that failed passes
        its exception and re-raises it itself after this returns; every other rank raises here, naming
        the rank that failed and why, so that none waits forever in the next collective."""
        if self.world == 1:
            return
        errors = self.gather(None if error is None else f"{type(error).__name__}: {error}")
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed and error is None:
            raise RankError(f"{where}: rank {failed[0][0]} of {self.world} failed: {failed[0][1]}")

    def together(self, where: str, step: Callable[[], T]) -> T:
        """Run `step` on this rank and meet the others after it (`agree`): if it raises on any rank, every rank
        raises, this one its own exception."""
        try:
            out = step()
        except Exception as e:
            self.agree(e, where)
            raise
        self.agree(None, where)
        return out

    def gather_lists(self, items: list[Any]) -> list[Any]:
        """Every rank's list, concatenated in rank order, on every rank."""
        return [x for part in self.gather(items) for x in part]

    def mean_grads(self, params: list[Any]) -> None:
        """Average the gradients of `params` over the ranks, in place, as DDP's backward does (a sum over the
        ranks divided by their number): one all-reduce of the flattened gradients per dtype and device. A
        parameter with no gradient on this rank counts as zeros, so that every rank flattens the same tensors."""
        if self.world == 1:
            return
        import torch
        import torch.distributed as dist

        groups: dict[tuple[Any, Any], list[Any]] = {}
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for grads in groups.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= self.world
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def barrier(self) -> None:
        if self.world > 1:
            self._state.wait_for_everyone()

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """The main process runs the block first (e.g. builds a cache), the others after it."""
        with self._state.main_process_first():
            yield


def _free_port() -> int:
    import socket

    with socket.socket() as s:  # the kernel's pick; two runs on one machine must not share a rendezvous port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_command(n: int, module_args: Sequence[str]) -> list[str]:
    """The accelerate launcher's command line that runs `python -m agentrl <module_args>` in `n` processes."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n),
            "--num_machines", "1", "--main_process_port", str(_free_port()), "--mixed_precision", "no",
            "--dynamo_backend", "no", "-m", "agentrl", *module_args]


def launch(n: int, module_args: Sequence[str]) -> int:
    """Run `python -m agentrl <module_args>` in n processes through accelerate's launcher and wait for its exit
    status: Ctrl-C reaches every rank (they finish the update and save a checkpoint), SIGTERM is passed on to
    the launcher, which passes it to the ranks."""
    import signal
    import subprocess

    cmd = launch_command(n, module_args)
    print(f"starting {n} processes: {' '.join(cmd[1:])}", file=sys.stderr)
    proc = subprocess.Popen(cmd)
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # the ranks got it too (one process group): wait for their checkpoint
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["RankError", "Ranks", "launch", "launch_command", "launched"]
