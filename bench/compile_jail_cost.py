"""What the compile jail costs (docs/evaluation.md, "The compile jail"): the static checks' preprocessor run and
the build of the selective-scan naive kernel, the old way (the compiler run directly by the controller) and in
the jail, plus the static checks with a jailed `expand` and with `expand`'s in-memory result.

Every round runs each configuration once on a source no round shares (so nothing is cached), interleaved so that
load drifts hit them alike; prints medians and quartiles, and the jail's cost as the median of the per-round
differences (paired), and records them with machine and command under bench/results/.

    python bench/compile_jail_cost.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_selective_scan_search import machine  # noqa: E402

from ksearch import config  # noqa: E402
from ksearch.eval import static_checks  # noqa: E402
from ksearch.records import Candidate  # noqa: E402
from ksearch.targets import cpu  # noqa: E402
from ksearch.targets.cpu import BASE_FLAGS, CpuTarget  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    task = load_task("selective-scan")
    target, rules, cc = CpuTarget(), static_checks.rules_for("cpu"), config.c_compiler()
    names = ["plain cc -E", "jailed cc -E (expand)", "plain build", "jailed build",
             "static checks, jailed expand", "static checks, expand kept"]
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.repeats + 1):  # round 0 warms the page cache and is dropped
        source = task.naive_sources["cpu"] + f"\n// round {i} {time.time_ns()}\n"
        c = Candidate(target="cpu", sources={"kernel.c": source})
        got: dict[str, float] = {}
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "kernel.c").write_text(source)
            t = time.perf_counter()
            subprocess.run([cc, *BASE_FLAGS, "-E", "kernel.c"], cwd=d, capture_output=True, check=True)
            got["plain cc -E"] = time.perf_counter() - t
            t = time.perf_counter()
            subprocess.run([cc, *BASE_FLAGS, "-o", "kernel.so", "kernel.c", "-lm"], cwd=d, capture_output=True,
                           check=True)
            got["plain build"] = time.perf_counter() - t
        cpu._EXPANDED.clear()
        t = time.perf_counter()
        assert target.expand(c) is not None
        got["jailed cc -E (expand)"] = time.perf_counter() - t
        cpu._EXPANDED.clear()
        t = time.perf_counter()
        static_checks.check(c, rules, target.expand)
        got["static checks, jailed expand"] = time.perf_counter() - t
        t = time.perf_counter()
        static_checks.check(c, rules, target.expand)
        got["static checks, expand kept"] = time.perf_counter() - t
        t = time.perf_counter()
        built = target.compile(c, task.definition)
        got["jailed build"] = time.perf_counter() - t
        assert built.ok and not built.cached, built.log
        built.artifact.unlink()
        if i:
            for n in names:
                times[n].append(got[n])
    out = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "machine": machine(),
           "load_1min": os.getloadavg()[0], "repeats": args.repeats, "results_ms": {}}
    for n in names:
        ms = sorted(x * 1e3 for x in times[n])
        q = statistics.quantiles(ms, n=4)
        out["results_ms"][n] = {"median": round(statistics.median(ms), 1), "q1": round(q[0], 1),
                                "q3": round(q[2], 1)}
        print(f"{n:30s} median {statistics.median(ms):7.1f} ms  (quartiles {q[0]:.1f}-{q[2]:.1f})")
    for jailed, plain in (("jailed cc -E (expand)", "plain cc -E"), ("jailed build", "plain build")):
        diff = sorted((a - b) * 1e3 for a, b in zip(times[jailed], times[plain]))  # paired: the same round
        q = statistics.quantiles(diff, n=4)
        out["results_ms"][f"{jailed} - {plain}"] = {"median": round(statistics.median(diff), 1),
                                                     "q1": round(q[0], 1), "q3": round(q[2], 1)}
        print(f"{jailed} - {plain}: median {statistics.median(diff):.1f} ms per round (quartiles {q[0]:.1f}-{q[2]:.1f})")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = HERE / "results" / f"compile-jail-cost-{stamp}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"recorded in {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
