"""agentrl.memory: the limit is the smaller of the machine and a cgroup's, and the warning comes once, at the share."""

from __future__ import annotations

from agentrl.memory import GB, MemoryWatch, limit_bytes, peak_rss_bytes


def test_a_cgroup_limit_below_the_machine_is_the_limit_and_max_is_none(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    machine = limit_bytes(cgroup_files=())
    assert machine and machine > 256 * 1024**2  # this machine has some memory
    v2.write_text("max\n")  # cgroup v2 without a limit
    v1.write_text(str(2**63 - 4096))  # cgroup v1 without a limit: a page-rounded 2**63
    assert limit_bytes(cgroup_files=(v2, v1)) == machine
    v2.write_text("1073741824\n")  # 1 GiB
    assert limit_bytes(cgroup_files=(v2, v1, tmp_path / "absent")) == 1024**3
    v2.write_text(str(machine * 2))  # a limit above the machine: the machine runs out first
    assert limit_bytes(cgroup_files=(v2,)) == machine


def test_the_peak_is_this_processs_resident_memory():
    before = peak_rss_bytes()
    block = bytearray(64 * 1024**2)  # 64 MiB, touched
    for i in range(0, len(block), 4096):
        block[i] = 1
    assert peak_rss_bytes() >= before and peak_rss_bytes() > 64 * 1024**2


def test_it_warns_once_when_the_peak_passes_the_share_and_logs_the_peak():
    said, peaks = [], iter([7 * GB, 8 * GB, 9 * GB, 9.5 * GB])
    watch = MemoryWatch("dpo.max_batch_tokens", say=said.append, share=0.8, limit=10 * GB, peak=lambda: next(peaks))
    assert watch() == {"sys/rss_peak_gb": 7.0} and said == []  # 70%: quiet
    assert watch() == {"sys/rss_peak_gb": 8.0} and len(said) == 1  # 80%: the warning, with the knob
    assert "8.0 GB of the 10.0 GB" in said[0] and "dpo.max_batch_tokens" in said[0] and "137" in said[0]
    watch(), watch()
    assert len(said) == 1  # once a run


def test_no_known_limit_means_no_warning():
    said = []
    watch = MemoryWatch("x", say=said.append, limit=0, peak=lambda: 50 * GB)
    assert watch()["sys/rss_peak_gb"] == 50.0 and said == []
