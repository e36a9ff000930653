"""Checkpoints a run can be resumed from, written so that a kill at any moment leaves a usable one.

    <run>/checkpoints/update_00010/   model.pt  optimizer.pt  assigner.pt  rng.pt  state.json  manifest.json

A checkpoint is written into a temporary folder beside the others, every file fsync'ed, the manifest
(the SHA-256 of every file) written last, then renamed into place: a folder named `update_*` either
holds a complete checkpoint or fails its manifest (a disk that lost writes), and a `.tmp-*` folder is
a write that was interrupted. Saving an update that has a folder already (a resumed run saving it
again) moves the old folder aside to `.old-*` first, then renames the new one into place: a kill
between the two renames leaves both and no `update_*`, and `latest` puts back the one that verifies
(the new write first). So a kill at any point of a save leaves the update's old checkpoint, its new
one, or (on a first save) the previous updates' checkpoints. `latest` picks the newest checkpoint
whose manifest verifies and says which ones it skipped and why.

Tensors are stored with `torch.save` and read back with `weights_only=True` (no pickled code runs
from a run folder); everything else (counters, the health history, RNG states of python and numpy)
is JSON, which writes floats exactly.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> folder = write(root, 3, {"state.json": {"update": 3}}, keep=2)
>>> folder.name, verify(folder)["update"]
('update_00003', 3)
>>> latest(root)[0] == folder
True
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1
MANIFEST = "manifest.json"
PREFIX = "update_"


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or does not match its manifest."""


def folder_name(update: int) -> str:
    return f"{PREFIX}{update:05d}"


def _fsync(path: Path) -> None:
    """A file's or a folder's data and entry to the disk (a rename is durable once its folder is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync = _fsync  # for other modules' atomic writes (agentrl.models); this module calls _fsync


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write(root: Path | str, update: int, files: dict[str, Any], keep: int) -> Path:
    """Write one checkpoint atomically and keep the newest `keep`. `files` maps a file name to what it
    holds: a `.json` name gets JSON, any other name `torch.save` (tensors, state dicts)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{folder_name(update)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    digests = {}
    for name, obj in files.items():
        if name == MANIFEST:
            raise ValueError(f"checkpoint file name {MANIFEST!r} is the manifest's")
        path = tmp / name
        if name.endswith(".json"):
            path.write_text(json.dumps(obj))
        else:
            torch.save(obj, path)
        _fsync(path)
        digests[name] = sha256(path)
    manifest = {"format": FORMAT, "update": update, "files": digests}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _fsync(tmp / MANIFEST)
    _fsync(tmp)
    final = root / folder_name(update)
    if final.exists():  # a resumed run saving the same update again: swap, so a kill leaves one of the two
        old = root / f".old-{final.name}-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    _fsync(root)  # the rename itself reaches the disk
    for stale in checkpoints(root)[:-keep]:
        shutil.rmtree(stale)
    return final


def checkpoints(root: Path | str) -> list[Path]:
    """The checkpoint folders under `root`, oldest first (by update number)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit():
            found.append((int(p.name[len(PREFIX):]), p))
    return [p for _, p in sorted(found)]


def verify(folder: Path | str, update: int | None = None) -> dict[str, Any]:
    """The manifest of `folder` if every file it lists is present with its checksum and it is the checkpoint of
    `update` (default: the one the folder's name says); else CheckpointError."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: no {MANIFEST} (a write that did not finish)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{folder}: unreadable {MANIFEST}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"),
                                                                                            dict):
        raise CheckpointError(f"{folder}: {MANIFEST} is not an agentrl checkpoint manifest of format {FORMAT}")
    for name, digest in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{folder}: {name} is missing")
        if sha256(path) != digest:
            raise CheckpointError(f"{folder}: {name} does not match its checksum (corrupted on disk)")
    if update is None:
        update = int(folder.name[len(PREFIX):])
    if manifest.get("update") != update:
        raise CheckpointError(f"{folder}: its manifest says update {manifest.get('update')}")
    return manifest


_LEFTOVER = re.compile(rf"\.(tmp|old)-({PREFIX}\d+)-\d+")  # what a save leaves when it is killed (see write)


def _verifies(folder: Path, update: int) -> bool:
    try:
        verify(folder, update)
        return True
    except CheckpointError:
        return False


def recover(root: Path | str, warn: Callable[[str], None] | None = None) -> None:
    """Tidy what killed saves left under `root`: where an update has no folder that verifies but a
    leftover of its save does (the new write, `.tmp-*`, killed before its rename; or the old folder,
    `.old-*`, moved aside by a re-save killed before the new one took its place), rename that one
    into place, the new write first; remove every other leftover. Each step is named through `warn`."""
    root = Path(root)
    warn = warn or (lambda _msg: None)
    if not root.is_dir():
        return
    leftovers: dict[str, list[Path]] = {}
    for p in sorted(root.iterdir()):
        m = _LEFTOVER.fullmatch(p.name)
        if m and p.is_dir():
            leftovers.setdefault(m.group(2), []).append(p)
        elif p.name.startswith((".tmp-", ".old-")):  # not a name write() makes: still nothing a run reads
            leftovers.setdefault("", []).append(p)
    for name, found in sorted(leftovers.items()):
        final = root / name if name else None
        # the new write (.tmp) before the old folder (.old): both hold this update, the new one is what the run saved
        found.sort(key=lambda p: (not p.name.startswith(".tmp-"), p.name))
        update = int(name[len(PREFIX):]) if name else -1
        if final is not None and not (final.is_dir() and _verifies(final, update)):
            for p in found:
                if _verifies(p, update):
                    if final.exists():  # a folder that fails its manifest: the leftover is the sound copy
                        warn(f"replacing {final}, which does not verify, with {p.name} (a save that was killed)")
                        shutil.rmtree(final)
                    else:
                        warn(f"restoring {final.name} from {p.name} (a save killed between its renames)")
                    p.rename(final)
                    found.remove(p)
                    _fsync(root)
                    break
        for p in found:
            warn(f"skipping {p}: a checkpoint write that was interrupted (removed)")
            shutil.rmtree(p, ignore_errors=True)


def latest(root: Path | str, warn: Callable[[str], None] | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint under `root` that verifies, with its manifest (None if there is none),
    after `recover` has put back what a killed save left. Every newer one that does not verify, and
    every interrupted write, is named through `warn`."""
    root = Path(root)
    warn = warn or (lambda _msg: None)
    recover(root, warn)
    for folder in reversed(checkpoints(root)):
        try:
            return folder, verify(folder)
        except CheckpointError as e:
            warn(f"skipping checkpoint {e}")
    return None


def read(folder: Path | str, name: str) -> Any:
    """One file of a verified checkpoint: JSON, or tensors loaded without running pickled code."""
    path = Path(folder) / name
    if name.endswith(".json"):
        return json.loads(path.read_text())
    return torch.load(path, map_location="cpu", weights_only=True)


# -- every RNG the next update draws from ----------------------------------------------------------


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON part: python's and numpy's global generators; tensor part: torch's CPU and CUDA ones)."""
    version, state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    json_part = {"python": [version, list(state), gauss],
                 "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda:{i}"] = s
    return json_part, tensors


def set_rng_state(json_part: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    version, state, gauss = json_part["python"]
    random.setstate((version, tuple(state), gauss))
    kind, keys, pos, has_gauss, cached = json_part["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda:"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


# -- the run folder ---------------------------------------------------------------------------------

# what a run writes into its folder; --overwrite removes these and nothing else
RUN_FILES = ("config.yaml", "decisions.json", "metrics.jsonl", "summary.json", "summary.json.tmp", "store",
             "checkpoints", "checkpoint", "tensorboard", "wandb")


def clear_run(out: Path | str) -> None:
    """Remove a previous run's files from `out` (--overwrite): the folder may hold the user's own files too."""
    out = Path(out)
    for name in RUN_FILES:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


__all__ = ["CheckpointError", "checkpoints", "clear_run", "latest", "read", "recover", "rng_state",
           "set_rng_state", "verify", "write"]
