"""Where one GPU evaluation's wall time goes: the search's evaluation of a pack kernel (all workloads, 3 seeds,
timing as `ksearch run` does it), cold and then warm, with a cProfile of the warm one (controller side; the
worker is a child process, so its time shows as waiting in the worker requests).

    python bench/gpu/eval_profile.py [--family warp-chunks] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from ksearch.eval.evaluator import EvalConfig, Evaluator  # noqa: E402
from ksearch.records import Candidate  # noqa: E402
from ksearch.targets.base import spec_for_target  # noqa: E402
from ksearch.knowledge import load_pack  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="selective-scan-fp16")
    ap.add_argument("--family", default="warp-chunks")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    task = load_task(args.task)
    t0 = time.perf_counter()
    hw = spec_for_target("cuda")
    print(f"hardware spec: {time.perf_counter() - t0:.2f} s")
    k = load_pack(args.task, "cuda").render(task.definition, {"family": args.family}, {})
    cand = Candidate(target="cuda", sources=dict(k.sources), launch=k.launch, compile_flags=list(k.compile_flags))
    ev = Evaluator(task, "cuda", hw, EvalConfig(seeds=[1, 2, 3]), lambda msg: print(f"  {time.perf_counter() - t0:7.2f} s  {msg}"))
    for label in ("cold", "warm", "profiled"):
        prof = cProfile.Profile() if label == "profiled" else None
        t1 = time.perf_counter()
        if prof:
            prof.enable()
        res = ev.evaluate(cand, None, timing=True, with_speedup=False)
        if prof:
            prof.disable()
        print(f"{label}: {time.perf_counter() - t1:.2f} s, {res.status.value}, compile {res.compile_s}, "
              + ", ".join(f"{w.workload} {w.median_ms}" for w in res.workloads))
        if prof:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(args.top)
            print(s.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
