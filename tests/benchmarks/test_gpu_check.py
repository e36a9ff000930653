"""benchmarks/gpu_check.py on a machine with no GPU: its plan (--dry-run), every torch section run for real at a
tiny size (--cpu-smoke), and the bounds that keep a section from holding up the rest."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402

TORCH_SECTIONS = ["build", "rollout-fp32", "rollout-bf16", "train-step"]
MODELS = ["smollm2-135m", "qwen2.5-1.5b"]
VLLM_SECTIONS = ["vllm-tests", "vllm-two-ranks", *(f"vllm-rollout:{m}" for m in MODELS)]
NAMES = [f"{s}:{m}" for m in MODELS for s in TORCH_SECTIONS] + ["tiny-run", *VLLM_SECTIONS]


def run_check(tmp_path: Path, *flags: str, timeout: float) -> tuple[dict, dict]:
    """Run the script; its last printed line and the file it wrote, which must be the same JSON."""
    path = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), *flags, "--out",
                           str(tmp_path / "work"), "--json", str(path)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert json.loads(path.read_text()) == printed
    return printed, {s["name"]: s for s in printed["sections"]}


def test_dry_run_plans_every_section_with_its_settings_and_runs_nothing(tmp_path):
    result, by_name = run_check(tmp_path, "--dry-run", timeout=120)
    assert result["dry_run"] is True and result["mode"] == "gpu" and result["device"] == "cuda"
    assert result["passed"] is None and result["failed"] == [] and result["complete"] is True
    assert list(by_name) == NAMES
    assert all(s["status"] == "planned" and s["settings"] and s["limit_s"] > 0 for s in by_name.values())
    # the published shapes, written here from the models' config.json
    smol, qwen = by_name["build:smollm2-135m"]["settings"], by_name["build:qwen2.5-1.5b"]["settings"]
    assert (smol["hidden_size"], smol["num_hidden_layers"], smol["num_attention_heads"], smol["num_key_value_heads"],
            smol["intermediate_size"], smol["vocab_size"], smol["tie_word_embeddings"]) == (
        576, 30, 9, 3, 1536, 49152, True)
    assert (qwen["hidden_size"], qwen["num_hidden_layers"], qwen["num_attention_heads"], qwen["num_key_value_heads"],
            qwen["intermediate_size"], qwen["vocab_size"], qwen["tie_word_embeddings"]) == (
        1536, 28, 12, 2, 8960, 151936, True)
    assert by_name["train-step:qwen2.5-1.5b"]["settings"]["bf16_autocast"] is True
    if result["environment"]["vllm"] is None:  # the vLLM sections say why they would not run here
        assert all("no vllm importable" in by_name[n]["would_skip"] for n in VLLM_SECTIONS)
    assert not (tmp_path / "work" / "models").exists()  # nothing was built


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smoke")
    t0 = time.monotonic()
    result, by_name = run_check(tmp, "--cpu-smoke", timeout=180)
    return result, by_name, time.monotonic() - t0


def test_cpu_smoke_runs_every_torch_section_and_skips_vllm_saying_why(smoke):
    result, by_name, _ = smoke
    assert result["dry_run"] is False and result["mode"] == "cpu-smoke" and result["device"] == "cpu"
    assert list(by_name) == NAMES
    assert [n for n, s in by_name.items() if s["status"] == "ok"] == NAMES[: len(NAMES) - len(VLLM_SECTIONS)]
    assert all(by_name[n]["status"] == "skipped" and "CUDA" in by_name[n]["reason"] for n in VLLM_SECTIONS)
    assert result["passed"] is True and result["failed"] == [] and result["skipped"] == VLLM_SECTIONS


def test_cpu_smoke_figures(smoke):
    result, by_name, _ = smoke
    for m in MODELS:
        build = by_name[f"build:{m}"]
        assert build["settings"]["scaled_down"] is True and build["figures"]["vocab"] == 2048  # the padded vocabulary
        for dtype in ("fp32", "bf16"):
            f = by_name[f"rollout-{dtype}:{m}"]["figures"]
            # 8 rows x 2 turns x at most 8 new tokens; an untrained model rarely stops early
            assert f["episodes"] == 8 and f["turns"] == 16 and 64 <= f["action_tokens"] <= 128
            assert f["tokens_per_s"] > 0
        step = by_name[f"train-step:{m}"]
        assert step["settings"]["bf16_autocast"] is False and "CUDA only" in step["settings"]["bf16_autocast_reason"]
        f = step["figures"]
        assert f["mixed_precision"] == "no" and f["autocast_dtype"] == "torch.float32"
        assert math.isfinite(f["loss"]) and f["params_moved"] == f["params"] > 0
    tiny = by_name["tiny-run"]["figures"]
    assert tiny["steps"] == [1, 2] and all(math.isfinite(x) for x in tiny["losses"]) and tiny["tensors_unmoved"] == 0
    assert result["ratio"] > 0  # bf16 over fp32 tokens/s on the first model


def test_cpu_smoke_stays_within_its_minute(smoke):
    result, _, wall = smoke
    assert result["seconds"] < 60 and result["budget_s"] == 60
    assert wall < 150  # with the imports, on a loaded 2-core machine


def test_a_section_that_raises_or_overruns_fails_alone_and_one_without_time_is_skipped(tmp_path):
    ck = gpu_check.Check(device="cpu", models=[], smoke=True, out=tmp_path, rows=8, group_size=4, turns=2,
                         new_tokens=8, updates=2, gpus=0, bf16=False, bf16_reason="cpu", vllm_reason=None)
    ran = []

    def boom():
        raise ValueError("broken")

    def hang():
        time.sleep(30)

    plan = [gpu_check.Section("raises", {}, boom, 10),
            gpu_check.Section("hangs", {}, hang, 1),
            gpu_check.Section("after", {}, lambda: ran.append(1) or {"x": 1}, 10),
            gpu_check.Section("cannot", {}, lambda: {}, 10, lambda: "no reason to run"),
            gpu_check.Section("long", {}, lambda: {}, 600)]
    writes = []
    t0 = time.monotonic()
    records = gpu_check.execute(ck, plan, budget_s=20, dry_run=False, write=lambda r: writes.append(len(r)))
    assert time.monotonic() - t0 < 10
    by = {r["name"]: r for r in records}
    assert by["raises"]["status"] == "failed" and by["raises"]["reason"] == "ValueError: broken"
    assert by["hangs"]["status"] == "failed" and "ran past its 1 s" in by["hangs"]["reason"]
    assert by["after"]["status"] == "ok" and by["after"]["figures"] == {"x": 1} and ran == [1]
    assert by["cannot"] == {"name": "cannot", "settings": {}, "limit_s": 10, "status": "skipped",
                            "reason": "no reason to run"}
    # 600 s of limit wants 30 s left to start; about 18 s of the 20 s budget are left
    assert by["long"]["status"] == "skipped" and "not enough time left" in by["long"]["reason"]
    assert writes and writes[-1] == 5  # the JSON is rewritten as the sections go


def test_each_skip_says_what_is_missing(tmp_path):
    def check(**kw):
        base = dict(device="cuda", models=["smollm2-135m"], smoke=False, out=tmp_path, rows=64, group_size=8, turns=3,
                    new_tokens=64, updates=3, gpus=1, bf16=True, bf16_reason=None, vllm_reason=None)
        return gpu_check.Check(**{**base, **kw})

    ck = check()
    assert ck.unbuilt("smollm2-135m") == "model smollm2-135m was not built (see build:smollm2-135m)"
    ck.folders["smollm2-135m"] = tmp_path
    assert ck.unbuilt("smollm2-135m", bf16=True) is None and ck.no_vllm("smollm2-135m") is None
    assert ck.no_vllm(ranks=2) == "2 ranks need 2 GPUs; this machine shows 1"
    assert check(gpus=2).no_vllm(ranks=2) is None
    assert check(vllm_reason="no vllm importable").no_vllm() == "no vllm importable"
    assert check(device="cpu").no_vllm() == "vLLM needs a CUDA GPU: this run is on the CPU"
    old = check(bf16=False, bf16_reason="this GPU (Tesla V100) has no bf16")
    old.folders["smollm2-135m"] = tmp_path
    assert old.unbuilt("smollm2-135m", bf16=True) == "this GPU (Tesla V100) has no bf16"
    assert old.unbuilt("smollm2-135m") is None  # fp32 runs anywhere


def test_padded_tokenizer_decodes_every_id_and_encodes_with_its_own():
    tok = gpu_check.padded_tokenizer(2048)
    assert len(tok) == 2048
    assert tok.decode([2047]) == "<pad2047>"
    ids = tok("Say something with an even number of characters.").input_ids
    assert ids and max(ids) < 1024  # the padding is never produced by encoding
    assert tok.eos_token == "<|im_end|>" and tok.chat_template


def test_wheels_leave_out_torch_and_what_torch_brings():
    names = {n for n, _, _ in gpu_check.wheels()}
    assert {"transformers", "tokenizers", "accelerate", "peft", "pydantic", "tyro"} <= names
    assert not names & {"torch", "sympy", "networkx", "filelock", "agentrl"}
    pure = {n: p for n, _, p in gpu_check.wheels()}
    assert pure["transformers"] is True and pure["tokenizers"] is False
