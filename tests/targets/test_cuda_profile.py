"""Nsight Compute as the cuda target's profiler (targets/cuda_profile.py): its command, its raw CSV page parsed from a
report ncu wrote on the H200 (data/ncu-raw-h200.csv), its errors; on the GPU (marked ``cuda``), a judged candidate's
profile end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from ksearch.records import Candidate, Status
from ksearch.targets import get_target
from ksearch.targets.cuda_profile import MAX_LAUNCHES, NcuProfiler, find_ncu, kernel_filter, parse_ncu_csv
from ksearch.tasks import load_task

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def task():
    return load_task("selective-scan-fp16")


def test_the_command_runs_the_worker_under_ncu_on_the_plans_kernels_only(task, tmp_path):
    plan = {"launches": [{"kernel": "chunks<16>", "grid": [1], "block": [32]},
                         {"kernel": "ns::fold", "grid": [1], "block": [32]}, {"kernel": "chunks<32>", "grid": [1],
                                                                            "block": [32]}]}
    cand = Candidate(target="cuda", sources={"kernel.cu": ""}, launch=plan)
    assert kernel_filter(cand, task.definition) == "regex:^(chunks|fold)$"
    argv = NcuProfiler("/usr/local/cuda/bin/ncu").command(cand, task.definition, tmp_path / "r.csv")
    assert argv[0] == "/usr/local/cuda/bin/ncu" and argv[argv.index("--log-file") + 1] == str(tmp_path / "r.csv")
    assert argv[argv.index("--clock-control") + 1] == "none"  # the lent machines' rule: clocks as found
    assert argv[argv.index("--launch-count") + 1] == str(MAX_LAUNCHES)
    assert {"--csv", "--target-processes"} <= set(argv) and argv[argv.index("--page") + 1] == "raw"


def test_the_recorded_reports_give_every_metric_the_top_stalls_and_the_limits():
    """Reports ncu 2025.3.1.0 wrote on the H200 (bench/results/gpu-check-20261202b.md) for two selective-scan-fp16
    kernels on mamba370m-L4096: the naive one (a thread per channel, its state in a local array) and the searched
    warp-chunks kernel (bench/results/gpu-selective-scan-search-h200-20261130-best-candidate.json)."""
    (naive,) = parse_ncu_csv((DATA / "ncu-raw-h200-naive.csv").read_text(), "ncu 2025.3.1.0", "mamba370m-L4096")
    assert not naive.error and naive.workload == "mamba370m-L4096" and naive.tool == "ncu 2025.3.1.0"
    assert naive.metrics == {
        "registers_per_thread": 40.0, "achieved_occupancy_pct": 6.24, "theoretical_occupancy_pct": 75.0,
        "dram_throughput_pct": 0.17, "memory_throughput_pct": 6.35, "sm_throughput_pct": 2.06, "l1_hit_rate_pct": 99.08,
        "l2_hit_rate_pct": 95.9, "spill_instructions": 0.0, "waves_per_sm": 0.01, "block_threads": 128.0,
        "grid_blocks": 16.0, "shared_bytes_per_block": 0.0, "local_load_bytes": 537001984.0,
        "local_store_bytes": 537004672.0, "stall_long_scoreboard_pct": 67.6, "stall_wait_pct": 27.7,
        "stall_short_scoreboard_pct": 1.8}
    assert naive.notes == [
        "kernel naive_scan: grid (16, 1, 1), block (128, 1, 1)", "the grid's 16 blocks leave 116 of the 132 SMs idle",
        "warp stalls: long_scoreboard 68%, wait 28%, short_scoreboard 2%",
        "local memory: 537.0 MB loaded, 537.0 MB stored (no register spills: local arrays)",
        "theoretical occupancy limited by registers (12 blocks per SM)"]
    (best,) = parse_ncu_csv((DATA / "ncu-raw-h200-warp-chunks.csv").read_text(), "ncu 2025.3.1.0", "mamba370m-L4096")
    assert best.metrics["registers_per_thread"] == 125 and best.metrics["shared_bytes_per_block"] == 32768 + 2048
    assert best.metrics["sm_throughput_pct"] == 63.46 and best.metrics["local_store_bytes"] == 0
    assert [k for k in best.metrics if k.startswith("stall_")] == [
        "stall_wait_pct", "stall_short_scoreboard_pct", "stall_long_scoreboard_pct"]  # largest first, no "selected"
    assert best.notes[1:] == ["warp stalls: wait 36%, short_scoreboard 29%, long_scoreboard 14%",
                              "theoretical occupancy limited by registers (2 blocks per SM)"]


def test_one_profile_per_kernel_its_first_launch_with_the_count_noted():
    head, units, row = (DATA / "ncu-raw-h200-warp-chunks.csv").read_text().splitlines()[-3:]
    second = row.replace('"0","', '"1","', 1)
    other = row.replace('"0","', '"2","', 1).replace('"ss_warp_chunks"', '"fold"')
    profiles = parse_ncu_csv("\n".join([head, units, row, second, other]), "ncu", "w")
    assert [p.notes[0] for p in profiles] == ["kernel ss_warp_chunks: grid (256, 1, 1), block (256, 1, 1); launch 1 of 2 "
                                              "profiled", "kernel fold: grid (256, 1, 1), block (256, 1, 1)"]


def test_ncu_errors_and_an_empty_report_are_profile_errors():
    (p,) = parse_ncu_csv("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                         "permission to access NVIDIA GPU Performance Counters\n", "ncu", "w")
    assert p.error.startswith("ncu: ERR_NVGPUCTRPERM") and not p.metrics
    (p,) = parse_ncu_csv("==PROF== Disconnected from process 1\n==WARNING== No kernels were profiled.\n", "ncu", "w")
    assert p.error == "ncu: No kernels were profiled."
    (p,) = parse_ncu_csv("", "ncu", "w")
    assert p.error == "ncu: no launch of the candidate's kernels was profiled"


def test_a_missing_ncu_says_so(tmp_path):
    prof = NcuProfiler(None)
    assert prof.tool == "ncu" and "not installed" in prof.available()
    assert prof.read(tmp_path / "none.csv", None, "w")[0].error.startswith("ncu wrote no report")
    assert get_target("cuda").profiler().available() == (None if find_ncu() else prof.available())


@pytest.mark.cuda
@pytest.mark.skipif(find_ncu() is None, reason="Nsight Compute (ncu) is not installed")
def test_a_passing_kernel_is_profiled_under_ncu_on_the_gpu(task, tmp_path):
    """The naive kernel judged with profiling on: its evaluation carries ncu's profile of its largest workload."""
    from ksearch.eval.evaluator import EvalConfig, Evaluator
    from ksearch.protocol import TimingPlan

    judge = Evaluator(task, "cuda", config=EvalConfig(seeds=[3], timing=TimingPlan(warmup=1, min_repeats=3, max_repeats=3),
                                              profile=True, busy_wait_s=0))
    try:
        ev = judge.evaluate(judge.naive_candidate(), ["tiny", "mamba370m-L512"])
    finally:
        judge.close()
    assert ev.status is Status.PASSED, ev.message
    (p,) = ev.profiles
    assert not p.error, p.error
    assert p.tool.startswith("ncu 20") and p.workload == "mamba370m-L512"
    assert p.metrics["registers_per_thread"] > 0 and 0 < p.metrics["achieved_occupancy_pct"] <= 100
    assert "dram_throughput_pct" in p.metrics and "sm_throughput_pct" in p.metrics
    assert p.notes[0].startswith("kernel naive_scan: grid")
