"""The warm start's slip rate (`--sft.noise auto`), the check before RL, and SFT's progress after a resume."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import SFTConfig, TrainConfig
from agentrl.health.warm_start import warm_start_advice
from agentrl.monitor import SilentMonitor
from agentrl.registry import make
from agentrl.stages.sft import collect_demos, progress_lines, sft
from agentrl.stages.warm_start import choose_noise
from tests.conftest import MICRO

BAND = SFTConfig().useful_band


class Probes:
    """A scripted warm start: the pass rate each noise gives, and which noises were built."""

    def __init__(self, rate):
        self.rate, self.built = rate, []

    def __call__(self, noise: float) -> float:
        self.built.append(noise)
        return self.rate(noise)


def test_auto_keeps_the_default_when_its_warm_start_is_inside_the_band():
    probes = Probes(lambda n: 0.76)  # recoverable slips: the default's warm start is fine
    noise, tried, why = choose_noise(probes, 0.35, BAND, probes=3)
    assert (noise, probes.built) == (0.35, [0.35]) and "stays" in why


def test_auto_tries_cleaner_demonstrations_below_the_band():
    probes = Probes(lambda n: round(0.6 - 3 * n, 3))  # fatal slips: each slip costs the episode
    noise, tried, _ = choose_noise(probes, 0.35, BAND, probes=3)
    # 0.35 -> -0.45 (clipped nowhere: the scripted rate only needs to sit below the band), 0.175 -> 0.075, 0 -> 0.6
    assert probes.built == [0.35, 0.175, 0.0] and noise == 0.0 and tried[0.0] == 0.6


def test_auto_stops_at_the_first_warm_start_inside_the_band():
    probes = Probes(lambda n: round(0.9 - 2 * n, 3))
    noise, tried, _ = choose_noise(probes, 0.35, BAND, probes=3)
    assert probes.built == [0.35] and noise == 0.35  # 0.2: inside
    probes = Probes(lambda n: round(0.8 - 2 * n, 3))
    assert choose_noise(probes, 0.35, BAND, probes=3)[0] == 0.175 and probes.built == [0.35, 0.175]


def test_auto_adds_no_noise_at_the_ceiling_and_says_so():
    probes = Probes(lambda n: 0.97)
    noise, _, why = choose_noise(probes, 0.35, BAND, probes=3)
    assert (noise, probes.built) == (0.35, [0.35]) and "above the band" in why


def test_auto_nothing_inside_picks_the_nearest_and_says_the_policy_does_not_learn():
    probes = Probes(lambda n: {0.35: 0.02, 0.175: 0.08, 0.0: 0.05}[n])
    noise, _, why = choose_noise(probes, 0.35, BAND, probes=3)
    assert noise == 0.175 and "does not learn" in why


def test_auto_nothing_inside_keeps_the_default_when_a_cleaner_warm_start_passes_no_more():
    # 0.125 at the default and at half of it: leaving the default would gain nothing
    probes = Probes(lambda n: {0.35: 0.125, 0.175: 0.125, 0.0: 0.0625}[n])
    noise, tried, why = choose_noise(probes, 0.35, BAND, probes=3)
    assert probes.built == [0.35, 0.175, 0.0] and noise == 0.35 and "does not learn" in why
    probes = Probes(lambda n: {0.35: 0.0625, 0.175: 0.125, 0.0: 0.125}[n])  # a tie between two others
    assert choose_noise(probes, 0.35, BAND, probes=3)[0] == 0.0


def test_advice_fires_at_the_floor_and_the_ceiling_and_far_below_the_expert():
    floor = warm_start_advice(0.0, 128, 0.55)
    ceiling = warm_start_advice(1.0, 128, 1.0)
    assert floor is not None and "at the floor" in floor and "--sft.noise auto" in floor
    assert ceiling is not None and "at the ceiling" in ceiling and "harder" in ceiling
    # the advice for the ceiling never asks for more noise (it teaches the slips): it says why not
    assert "higher --sft.noise teaches" in ceiling
    far = warm_start_advice(0.25, 128, 0.9)
    assert far is not None and "far below the expert" in far and "--sft.epochs" in far
    # Vault's defaults: the expert passes ~0.55 at noise 0.35 and the warm start about as much
    assert warm_start_advice(0.47, 128, 0.55) is None
    assert warm_start_advice(0.76, 128, 0.99) is None  # the grid world at the default noise
    assert warm_start_advice(0.25, 16, 0.55) is None  # 16 episodes: within the noise of half the expert's


class Said(SilentMonitor):
    def __init__(self, out, total=0):
        super().__init__(out, total)
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        self.lines.append(text)


@pytest.mark.parametrize("planted,expect", [(0.0, "at the floor"), (1.0, "at the ceiling"), (0.5, None)])
def test_the_trainer_warns_before_rl_on_a_planted_warm_start(tmp_path, vault_policy_dir, planted, expect):
    from agentrl.evaluation import EvalResult
    from agentrl.trainer import Trainer

    cfg = TrainConfig(env={"id": "agentrl/Vault-v0", "kwargs": {"locks": 1}}, updates=0, tiny=MICRO,
                      eval={"episodes": 4, "every": 0}, rollout={"groups": 1, "group_size": 2},
                      out=str(tmp_path / "run"))
    monitor = Said(cfg.out)
    Trainer(cfg, monitor=monitor, start=vault_policy_dir).train(warm=EvalResult(planted, planted, 2.0, 128))
    warnings = [t for t in monitor.lines if t.startswith("warning: the warm start")]
    if expect is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and expect in warnings[0]


def test_progress_after_a_resume_counts_only_the_steps_run(tmp_path, vault_policy_dir):
    from agentrl.policy import Policy

    def fresh():
        return Policy.load(vault_policy_dir)

    demos = collect_demos(lambda: make("agentrl/Vault-v0", locks=1), fresh().chat, list(range(24)), 0.3)
    kw = dict(epochs=3, lr=3e-3, batch_size=8, seed=5)

    class Killed(Exception):
        pass

    def kill_in_epoch_2(m):
        if m["sft/epoch"] == 2:
            raise Killed

    state = tmp_path / "sft.pt"
    first = fresh()
    with pytest.raises(Killed):
        sft(first.model, demos, first.chat.pad_id, log=kill_in_epoch_2, resume_file=state, **kw)
    logged, lines = [], []
    say = progress_lines(lines.append, every=0.5)

    def log(m):
        logged.append(dict(m))
        say(m)

    again = fresh()
    sft(again.model, demos, again.chat.pad_id, resume_file=state, log=log, **kw)
    assert [m["sft/step"] for m in logged] == [7, 8, 9]  # 6 steps skipped, 3 run
    for m in logged:
        run = m["sft/step"] - 6
        assert m["sft/steps_per_s"] == pytest.approx(run / m["sft/elapsed_s"])
        assert m["sft/eta_s"] == pytest.approx(m["sft/elapsed_s"] / run * (m["sft/steps"] - m["sft/step"]))
    assert lines[0].startswith("  sft step 7/9")  # the resumed run's first step is said, wherever it falls
    rate = float(lines[0].split("steps/s")[0].split()[-1])
    assert rate == pytest.approx(logged[0]["sft/steps_per_s"], rel=0.06, abs=0.06)
    assert torch.isfinite(torch.tensor(logged[-1]["sft/loss"]))


def test_auto_with_sampling_error_leaves_the_default_only_for_a_reliably_better_warm_start():
    # 9 of 64 at the default against 16 of 64 cleaner: 1.6 standard errors apart, within the noise
    probes = Probes(lambda n: {0.35: 9 / 64, 0.175: 16 / 64}[n])
    noise, tried, why = choose_noise(probes, 0.35, BAND, probes=3, episodes=64)
    assert probes.built == [0.35, 0.175] and noise == 0.35 and "two standard errors of 64 episodes" in why
    # the same rates over 512 episodes each are 4.5 standard errors apart: cleaner demonstrations win
    assert choose_noise(Probes(lambda n: {0.35: 9 / 64, 0.175: 16 / 64}[n]), 0.35, BAND, episodes=512)[0] == 0.175
    # TextWorld at one seed: 8 of 64 against 31 of 64
    assert choose_noise(Probes(lambda n: {0.35: 8 / 64, 0.175: 31 / 64}[n]), 0.35, BAND, episodes=64)[0] == 0.175
