"""Your own environment, end to end, from the README alone (issue 18).

The env is the code block of README.md's "Write your own environment" section, copied out of the
README by the test, so the README cannot drift from what trains. Sizes are tiny (hidden 16), so
these runs say that the road works, not how well the policy learns.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentrl import cli
from agentrl.config import SFTConfig, TrainConfig
from agentrl.registry import make

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "tiny.hidden_size=16", "--set", "tiny.intermediate_size=32", "--set", "tiny.num_attention_heads=2",
        "--set", "tiny.num_key_value_heads=1", "--set", "tiny.max_position_embeddings=256",
        "--set", "tiny.vocab_size=300"]
SMALL_RUN = ["--updates", "2", "--rollout.groups", "2", "--rollout.group-size", "4", "--eval.episodes", "8",
             "--sft.episodes", "48", "--sft.epochs", "1"]
MICRO = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
         "max_position_embeddings": 256, "vocab_size": 300}


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Write your own environment")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def readme_env_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", readme_section(), flags=re.S)
    assert blocks, "the README's env section has no python code block"
    return blocks[0]


def readme_jsonl_lines() -> list[str]:
    """The indented JSONL example lines of the section (the --data format)."""
    return [line.strip() for line in readme_section().splitlines() if line.startswith('    {"')]


def without_expert(code: str) -> str:
    """The README's env with its optional expert hook left out (the method removed from the class)."""
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            node.body = [n for n in node.body if not (isinstance(n, ast.FunctionDef) and n.name == "expert_action")]
    return ast.unparse(tree)


def write_module(folder: Path, name: str, code: str) -> str:
    path = folder / f"{name}.py"
    path.write_text(code)
    sys.modules.pop(name, None)  # as a new process would: import the file as it is now
    return f"{path}:Arithmetic"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "1000")  # rich tables one row per line, so a row's cells can be read together
    return tmp_path / "cache"


def test_readme_env_with_its_expert_trains_through_agentrl_train(tmp_path, cache, capsys):
    env_id = write_module(tmp_path, "readme_env", readme_env_code())
    rc, out, _ = run_cli(["check-env", env_id], capsys)
    assert rc == 0 and re.search(r"expert\s*│\s*ok\s*│\s*yes", out), out
    run = tmp_path / "run"
    # turn-ppo with a warm-up the critic cannot finish early (EV never reaches 2): update 1 is critic-only
    rc, out, err = run_cli(["train", "--env.id", env_id, "--algo", "turn-ppo", "--credit.warmup-updates", "1",
                            "--credit.warmup-ev", "2.0", *TINY, *SMALL_RUN, "--out", str(run)], capsys)
    assert rc == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates_done"] == 2 and 0.0 <= summary["final_pass_rate"] <= 1.0
    assert (run / "checkpoint" / "config.json").is_file()
    assert summary["critic_only_updates"] == 1 and "update 1: critic only" in out
    assert "update 2: the policy trains from here on" in out
    warm = summary["decisions"]["warm_start"]
    assert warm["key_parts"]["expert"].startswith("fingerprint ") and warm["sft"]["noise"] == 0.35
    assert 0.0 < warm["sft"]["demo_pass_rate"] <= 1.0  # the expert's pass rate, recorded before SFT ran


def test_readme_env_without_expert_trains_from_readme_format_data(tmp_path, cache, capsys):
    code = readme_env_code()
    env_id = write_module(tmp_path, "readme_noexpert", without_expert(code))
    rc, out, _ = run_cli(["check-env", env_id], capsys)
    assert rc == 0 and re.search(r"expert\s*│\s*ok\s*│\s*none: the environment has no scripted expert", out), out

    t0 = time.perf_counter()
    rc, _, err = run_cli(["train", "--env.id", env_id, *TINY], capsys)
    # before any work: ~0.3 s on a quiet machine; the bound leaves room for a loaded CI box, not for an SFT
    assert rc == 2 and time.perf_counter() - t0 < 2.5
    assert "no scripted expert" in err and "--model" in err and "agentrl sft --data" in err

    # demonstrations in the README's documented format: its own three example lines, and more like them
    expert = make(write_module(tmp_path, "readme_expert", code))
    lines = readme_jsonl_lines()
    assert len(lines) == 3
    for seed in range(40):
        obs, _ = expert.reset(seed=seed)
        messages = [{"role": "user", "content": obs}]
        while True:
            action = expert.expert_action(0.0)
            obs, _, terminated, truncated, _ = expert.step(action)
            messages.append({"role": "assistant", "content": action})
            if terminated or truncated:
                break
            messages.append({"role": "tool", "content": obs})
        lines.append(json.dumps({"messages": messages}))
    data = tmp_path / "demos.jsonl"
    data.write_text("\n".join(lines) + "\n")

    warm = tmp_path / "warm"
    tiny_flags = [f"--tiny.{k.replace('_', '-')}={v}" for k, v in MICRO.items()]
    rc, out, err = run_cli(["sft", "--data", str(data), "--env.id", env_id, "--out", str(warm), *tiny_flags,
                            "--sft.epochs", "2", "--eval-episodes", "8"], capsys)
    assert rc == 0, err
    assert "43 demonstrations" in out and "lr 0.003 (the tiny policy's" in out and "ETA" in out
    assert (warm / "config.json").is_file() and (warm / "tokenizer.json").is_file()

    run = tmp_path / "run"
    rc, _, err = run_cli(["train", "--env.id", env_id, "--model", str(warm), *SMALL_RUN, "--out", str(run)], capsys)
    assert rc == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates_done"] == 2 and summary["warm_start_dir"] is None


def _warm(env_id: str, messages: list[str]) -> Path:
    from agentrl.stages.warm_start import warm_start

    return warm_start(env_id, {}, TrainConfig(tiny=MICRO).tiny, SFTConfig(episodes=16, epochs=1), 0,
                      say=messages.append)


def test_appending_a_function_keeps_the_warm_start_and_changing_the_expert_rebuilds_it(tmp_path, cache):
    code = readme_env_code()
    said: list[str] = []
    first = _warm(write_module(tmp_path, "my_env", code), said)
    assert any("building the tiny policy" in s for s in said)

    said.clear()  # a helper appended to the module: the demonstrations are the same
    again = _warm(write_module(tmp_path, "my_env", code + "\n\ndef helper():\n    return 1\n"), said)
    assert again == first and any("cached at" in s for s in said) and not any("building" in s for s in said)

    said.clear()  # the expert now guesses from a wider range when it slips: other demonstrations
    changed = code.replace("self.np_random.integers(10, 90)", "self.np_random.integers(10, 99)")
    assert changed != code
    rebuilt = _warm(write_module(tmp_path, "my_env", changed), said)
    assert rebuilt != first
    why = next(s for s in said if "building the tiny policy" in s)
    assert "because the cached one" in why and "expert: fingerprint" in why and "env_kwargs" not in why
    parts = json.loads((rebuilt / "warm_start_key.json").read_text())
    assert parts["expert"] in why

    said.clear()  # an explicit folder is used as it is, whatever the key
    env_id = write_module(tmp_path, "my_env", code)
    from agentrl.stages.warm_start import warm_start

    given = warm_start(env_id, {}, TrainConfig(tiny=MICRO).tiny, SFTConfig(warm_start=str(rebuilt)), 0, say=said.append)
    assert given == rebuilt and "as given" in said[0]


def test_calibrated_noise_gives_the_target_expert_pass_rate(tmp_path):
    from agentrl.stages.sft import expert_pass_rate
    from agentrl.stages.warm_start import calibrate_noise

    env = make(write_module(tmp_path, "calib_env", readme_env_code()))
    # this expert fails only when it slips at turn 0 and its guess in [10, 90) misses: by hand,
    # pass rate = (1 - noise) + noise / 80, so a 0.5 target sits at noise ~0.51
    noise, rate = calibrate_noise(env, 0.5, episodes=48)
    assert abs(rate - 0.5) <= 0.1 and 0.3 <= noise <= 0.7
    assert rate == expert_pass_rate(env, range(30_000_000, 30_000_048), noise)
    # above what even the noise-free expert reaches: no slips at all, and its rate says so
    assert calibrate_noise(env, 0.999, episodes=16) == (0.0, 1.0)


def test_algo_auto_records_its_pick_rule_and_statistics(tmp_path, cache, capsys):
    env_id = write_module(tmp_path, "auto_env", readme_env_code())
    run = tmp_path / "run"
    rc, _, err = run_cli(["train", "--env.id", env_id, "--algo", "auto", *TINY, *SMALL_RUN, "--updates", "1",
                          "--out", str(run)], capsys)
    assert rc == 0, err
    auto = json.loads((run / "summary.json").read_text())["decisions"]["algo_auto"]
    assert auto["algo"] == json.loads((run / "summary.json").read_text())["algo"]
    # the probe rolls out 8 groups of the run's group size (4)
    assert auto["rule"] and auto["reason"] and auto["statistics"]["episodes"] == 8 * 4
    # how far the env lies from the family the thresholds were fitted on, statistic by statistic
    rows = {r["statistic"]: r for r in auto["family"]["rows"]}
    assert rows["turns_median"]["value"] == auto["statistics"]["turns_median"] and rows["turns_median"]["low"] == 3.0
    assert auto["family"]["meaning"]
    header = (run / "config.yaml").read_text()
    assert f"picked by --algo auto (the horizon probe), rule {auto['rule']}" in header
    assert "turns_median" in header
    TrainConfig.model_validate(yaml.safe_load(header))  # the header is comments: the file still loads as a config


def test_an_env_that_cannot_be_imported_says_how_to_make_it_importable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a module that is not in the current folder, nor on the path
    with pytest.raises(ValueError, match=r"No module named 'not_here_env'.*PYTHONPATH.*path/to/my_env.py:MyEnv"):
        make("not_here_env:Arithmetic")
    with pytest.raises(ValueError, match=r"no file elsewhere/my_env.py"):
        make("elsewhere/my_env.py:Arithmetic")
    env_id = write_module(tmp_path, "named_env", readme_env_code())
    assert type(make(env_id)).__name__ == "Arithmetic"  # path/to/file.py:Class works from any folder
    with pytest.raises(ValueError, match=r"has no 'Arithmatic'; its AgentEnv classes: Arithmetic"):
        make(env_id.replace(":Arithmetic", ":Arithmatic"))
