"""Profile cuda candidates through the judge on the device machine and keep each raw Nsight Compute report.

    python3 bench/gpu/profile_capture.py OUT_DIR

Judges, with `EvalConfig.profile` on, the selective-scan-fp16 naive cuda kernel and the searched best kernel of
bench/results/gpu-selective-scan-search-h200-20261130-best-candidate.json on tiny + mamba370m-L4096 (the profile
runs on the largest, L4096), copies the report ncu wrote (``ncu-<name>.csv``) and the evaluation (``eval-<name>.json``)
to OUT_DIR, and prints a line per profile and the seconds each evaluation took with and without profiling.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate
from ksearch.targets import cuda_profile
from ksearch.tasks import load_task

ROOT = Path(__file__).resolve().parents[2]
BEST = ROOT / "bench/results/gpu-selective-scan-search-h200-20261130-best-candidate.json"
WORKLOADS = ["tiny", "mamba370m-L4096"]


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    task = load_task("selective-scan-fp16")
    kept: dict[str, Path] = {}
    read = cuda_profile.NcuProfiler.read

    def keep(self, report, candidate, workload):
        if report.is_file():
            name = candidate.meta.get("role") or candidate.meta.get("family") or candidate.id
            kept[name] = out / f"ncu-{name}.csv"
            shutil.copyfile(report, kept[name])
        return read(self, report, candidate, workload)

    cuda_profile.NcuProfiler.read = keep  # type: ignore[method-assign]
    plan = TimingPlan(warmup=1, min_repeats=5, max_repeats=5)
    cands = {"naive": None, "warp-chunks": Candidate.model_validate(json.loads(BEST.read_text()))}
    judge = Evaluator(task, "cuda", config=EvalConfig(seeds=[3], timing=plan, busy_wait_s=0))  # one reference cache
    try:
        for profile in (False, True):
            judge.config.profile = profile
            for name, cand in cands.items():
                cand = cand or judge.naive_candidate()
                t0 = time.perf_counter()
                ev = judge.evaluate(cand, WORKLOADS)
                took = time.perf_counter() - t0
                print(f"{name:12s} profile={profile!s:5s} {ev.status.value} {took:6.1f} s  "
                      f"median L4096 {ev.workloads[-1].median_ms if ev.workloads else None} ms  {ev.message[:200]}")
                if profile:
                    (out / f"eval-{name}.json").write_text(ev.model_dump_json(indent=1))
                    for p in ev.profiles:
                        print(f"   {p.tool} {p.workload} error={p.error[:300]!r}")
                        print(f"   metrics {json.dumps(p.metrics)}")
                        for n in p.notes:
                            print(f"   note {n}")
    finally:
        judge.close()
    print("kept", {k: str(v) for k, v in kept.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
