"""What one search step costs the judge on big workloads: a copy of a kernel judged beside two references (as a
search judges a candidate beside its parent and the best), on the four Mamba-370m bench workloads of selective-scan.

The first evaluation computes the reference outputs of every timing set (cached for the run); the ones after it are
what a search step costs. ``--profile`` prints where the last one's time goes (cProfile, 30 lines).

    python bench/step_cost.py [--candidate best/candidate.json] [--evaluations 3] [--profile]

Without ``--candidate`` the naive kernel is judged (slow at these sizes: ~0.7 s a call at L 4096). The figures in
docs/evaluation.md ("Cost": 13.1 s, then 7.0 s a step) came from this script with a searched best kernel's
candidate.json, at commits 125dc41 and 7444874, on a quiet 2-core Intel Xeon VM; it prints, it records nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.records import Candidate
from ksearch.eval.timing import Reference
from ksearch.tasks import load_task

WORKLOADS = ["mamba370m-L512", "mamba370m-L1024", "mamba370m-L2048", "mamba370m-L4096"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", help="a candidate JSON (a run's best/candidate.json)")
    ap.add_argument("--evaluations", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    task = load_task("selective-scan")
    judge = Evaluator(task, "cpu", None, EvalConfig())
    base = Candidate.model_validate_json(open(args.candidate).read()) if args.candidate else judge.naive_candidate()
    src_name = next(iter(base.sources))
    for i in range(args.evaluations):
        copy = Candidate(target="cpu", sources={**base.sources, src_name: base.sources[src_name] + f"\n/* {i} */\n"},
                         compile_flags=base.compile_flags, entry_point=base.entry_point)
        prof = cProfile.Profile() if args.profile and i == args.evaluations - 1 else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        ev = judge.evaluate(copy, WORKLOADS, references=[Reference("parent", base), Reference("best", base)])
        if prof:
            prof.disable()
        print(f"evaluation {i + 1}: {time.perf_counter() - t0:.2f} s, {ev.status.value}, rounds "
              + ", ".join(f"{w.workload} {w.repeats}" for w in ev.workloads), flush=True)
        if prof:
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    judge.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
