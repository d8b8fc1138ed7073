"""How often the judge calls an unchanged kernel different, the smallest speedup it detects, and what an
evaluation costs, at three machine loads: none, busy loops on every core (1x), and two per core (2x).

The loops are started by this script as processes that are not its descendants (the judge's load meter then counts
them as other processes'), and the judge times anyway (no waiting: busy_wait_s=0, as a user who runs a search on a
busy machine past the wait gets). Every trial is one evaluation as a search makes it: the candidate judged beside
its reference kernel in paired rounds (`ksearch.eval.timing`), the verdict read from the evaluation.

- identical: the task's naive kernel with a comment added, beside the naive kernel. A verdict other than tie is a
  false difference; the rate is reported with its exact (Clopper-Pearson) 95% interval. For contrast, the rule the
  search used before (a candidate regressed when its median was above its parent's, both measured alone) is
  applied to the same rounds: that is a coin flip.
- detection: the naive kernel beside a copy that does its first k of 64 channels twice (true speedup 1 + k/64: 1.6%
  to 33%); the smallest speedup found faster in every trial (and in at least 90%) is reported.

    python bench/noise.py [--workload small-b2] [--identical 100] [--detect 10] [--loads 0,1,2]
    python bench/noise.py --render bench/results/noise-<date>.json   # the .md again from a recorded result

Prints a table and writes bench/results/noise-<date>.json and .md with the machine, versions, date and command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_selective_scan_search import machine  # noqa: E402

from ksearch.eval.evaluator import EvalConfig, Evaluator  # noqa: E402
from ksearch.protocol import TimingPlan  # noqa: E402
from ksearch.records import Candidate  # noqa: E402
from ksearch.eval.timing import Reference  # noqa: E402
from ksearch.hardware.load import measure_load  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402

LOOP = "for (int64_t d = 0; d < dim; d++) {"
DOUBLED = "for (int64_t d = 0; d < dim; d++) for (int rep = 0; rep < (d < {k} ? 2 : 1); rep++) {{"
CHANNELS = (1, 3, 6, 13, 21)  # of small-b2's 64: speedups 1.016, 1.047, 1.094, 1.203, 1.328

_DETACH = """
import os
pid = os.fork()
if pid == 0:
    os.setsid()
    os.closerange(0, 3)
    while True: pass
print(pid, flush=True)
"""


@contextlib.contextmanager
def busy_loops(n: int):
    """``n`` CPU-bound loops that are not our descendants (each in its own session); killed on exit."""
    pids: list[int] = []
    try:
        for _ in range(n):
            out = subprocess.run([sys.executable, "-c", _DETACH], capture_output=True, text=True, check=True)
            pids.append(int(out.stdout.split()[0]))
        time.sleep(0.2)
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of a rate k/n (by bisection on the binomial tails)."""
    from math import comb

    def tail_ge(p):  # P(X >= k)
        return sum(comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))

    def tail_le(p):  # P(X <= k)
        return sum(comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))

    a = (1 - conf) / 2

    def solve(f, target, increasing):
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (f(mid) < target) == increasing:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(tail_ge, a, True)
    high = 1.0 if k == n else solve(tail_le, a, False)
    return low, high


def trial(judge: Evaluator, candidate: Candidate, reference: Candidate, workload: str) -> dict:
    t0 = time.perf_counter()
    ev = judge.evaluate(candidate, [workload], references=[Reference("parent", reference)])
    wall = time.perf_counter() - t0
    if not ev.status.passed:
        return {"status": ev.status.value, "message": ev.message[:300], "wall_s": wall}
    r = ev.workloads[0]
    p = r.paired[0]
    return {"status": "PASSED", "verdict": p.verdict, "ratio": p.ratio, "lo": p.lo, "hi": p.hi, "rounds": p.n,
            "median_ms": r.median_ms, "reference_ms": p.reference_ms, "load_cores": r.load_cores, "wall_s": wall,
            # the old rule: the candidate's median against its parent's, as if each had been timed alone
            "median_rule_slower": bool(r.median_ms > p.reference_ms) if p.reference_ms else None}


def level(judge, task, workload: str, identical: int, detect: int, loops: int) -> dict:
    naive_src = task.naive_sources["cpu"]
    naive = Candidate(target="cpu", sources={"kernel.c": naive_src})
    out: dict = {"busy_loops": loops}
    with busy_loops(loops):
        out["load_before"] = measure_load(0.5).describe()
        same = [trial(judge, Candidate(target="cpu", sources={"kernel.c": naive_src + f"\n/* copy {i} */\n"}),
                      naive, workload) for i in range(identical)]
        detected = {}
        for k in CHANNELS:
            slow = Candidate(target="cpu", sources={"kernel.c": naive_src.replace(LOOP, DOUBLED.format(k=k))})
            runs = [trial(judge, Candidate(target="cpu", sources={"kernel.c": naive_src + f"\n/* fast {k} {i} */\n"}),
                          slow, workload) for i in range(detect)]
            detected[k] = runs
    passed = [t for t in same if t["status"] == "PASSED"]
    wrong = sum(t["verdict"] not in ("tie", None) for t in passed)
    coin = sum(bool(t["median_rule_slower"]) for t in passed)
    lo, hi = clopper_pearson(wrong, len(passed)) if passed else (math.nan, math.nan)
    out["identical"] = {"trials": len(same), "passed": len(passed), "judged_different": wrong,
                        "rate": wrong / len(passed) if passed else None, "rate_95": [lo, hi],
                        "median_rule_called_slower": coin,
                        "rounds_median": statistics.median(t["rounds"] for t in passed) if passed else None,
                        "load_cores_median": statistics.median(t["load_cores"] for t in passed) if passed else None,
                        "wall_s_median": statistics.median(t["wall_s"] for t in same)}
    rows = []
    for k, runs in detected.items():
        ok = [t for t in runs if t["status"] == "PASSED"]
        rows.append({"channels_doubled": k, "true_speedup": 1 + k / 64, "trials": len(runs),
                     "found_faster": sum(t["verdict"] == "faster" for t in ok),
                     "found_slower": sum(t["verdict"] == "slower" for t in ok),
                     "ratio_median": statistics.median(t["ratio"] for t in ok) if ok else None,
                     "wall_s_median": statistics.median(t["wall_s"] for t in runs)})
    out["detection"] = rows
    out["smallest_detected_every_time"] = smallest_detected(rows, 1.0)
    out["smallest_detected_90pct"] = smallest_detected(rows, 0.9)
    out["trials"] = {"identical": same, "detection": {str(k): v for k, v in detected.items()}}
    return out


def smallest_detected(rows: list[dict], share: float) -> float | None:
    """The smallest true speedup from which on every larger one too was found faster in at least ``share`` of its
    trials (None: not even the largest)."""
    found = None
    for r in sorted(rows, key=lambda r: -r["true_speedup"]):
        if r["found_faster"] < share * r["trials"]:
            break
        found = r["true_speedup"]
    return found


def markdown(result: dict) -> str:
    lines = [f"# Judge noise: {result['date']}", "", f"Command: `{result['command']}`", "",
             f"Machine: {result['machine']}", "", f"Workload: {result['workload']} (naive ~"
             f"{result['naive_ms']:.3g} ms per call); paired rounds as a search times them (TimingPlan defaults: "
             "99.9% intervals, 1% margin, 11 rounds at least, busy_wait_s=0).", "",
             "| load | others' cores while timing (median) | identical judged different | 95% interval | old rule "
             "(median vs median) said slower | rounds (median) | s per evaluation | smallest speedup found faster "
             "every time, and every larger one (>= 90%) | faster kernels judged slower |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, lv in result["levels"].items():
        i = lv["identical"]
        every, most = smallest_detected(lv["detection"], 1.0), smallest_detected(lv["detection"], 0.9)
        wrong = sum(r["found_slower"] for r in lv["detection"])
        tried = sum(r["trials"] for r in lv["detection"])
        lines.append(f"| {name} ({lv['busy_loops']} busy loops) | {i['load_cores_median']} | {i['judged_different']} of "
                     f"{i['passed']} ({100 * (i['rate'] or 0):.1f}%) | {100 * i['rate_95'][0]:.1f}-"
                     f"{100 * i['rate_95'][1]:.1f}% | {i['median_rule_called_slower']} of {i['passed']} | "
                     f"{i['rounds_median']} | {i['wall_s_median']:.2f} | {every and round(every, 3)} "
                     f"({most and round(most, 3)}) | {wrong} of {tried} |")
    lines += ["", "Detection (candidate: the naive kernel; reference: it with k of 64 channels done twice):", "",
              "| load | k | true speedup | found faster | found slower | median ratio | s per evaluation |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, lv in result["levels"].items():
        for r in lv["detection"]:
            lines.append(f"| {name} | {r['channels_doubled']} | {r['true_speedup']:.3f} | {r['found_faster']} of "
                         f"{r['trials']} | {r['found_slower']} | {r['ratio_median']:.3f} | {r['wall_s_median']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="small-b2")
    ap.add_argument("--identical", type=int, default=100, help="trials of an unchanged kernel per load")
    ap.add_argument("--detect", type=int, default=10, help="trials per speedup per load")
    ap.add_argument("--loads", default="0,1,2", help="busy loops per core, comma-separated")
    ap.add_argument("--render", metavar="JSON", help="write the .md of a recorded result again (nothing is timed)")
    args = ap.parse_args()
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
        return 0
    task = load_task("selective-scan")
    cores = len(os.sched_getaffinity(0))
    judge = Evaluator(task, "cpu", None, EvalConfig(seeds=[1, 2, 3], timing=TimingPlan(flush_bytes=1 << 20),
                                                    busy_wait_s=0.0))
    naive_ms = judge.measure_naive(task.select([args.workload])).workloads[0].median_ms
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    result = {"date": stamp, "command": "python bench/noise.py " + " ".join(sys.argv[1:]), "machine": machine(),
              "workload": args.workload, "naive_ms": naive_ms, "levels": {}}
    for per_core in (int(x) for x in args.loads.split(",")):
        name = f"{per_core}x cores" if per_core else "no load"
        print(f"{name}: {args.identical} identical, {args.detect} x {len(CHANNELS)} detection trials", flush=True)
        result["levels"][name] = level(judge, task, args.workload, args.identical, args.detect, per_core * cores)
    judge.close()
    md = markdown(result)
    print(md)
    out = HERE / "results" / f"noise-{stamp}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(md)
    print(f"recorded in {out.relative_to(HERE.parent)}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
