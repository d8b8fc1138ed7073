"""What the judge's defenses cost: one cached-build evaluation of the naive kernel on ``tiny``, as the judge runs it
and with layers switched off, plus the static checks alone (docs/evaluation.md, "Cost").

Each configuration is evaluated ``--repeats`` times in turn (interleaved, so load drifts hit them alike) after
one warm-up evaluation that fills the build cache; prints medians and records them with machine and command
under bench/results/.

    python bench/judge_cost.py [--repeats 15] [--workload tiny]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_selective_scan_search import machine  # noqa: E402

from ksearch.eval import static_checks  # noqa: E402
from ksearch.eval.evaluator import EvalConfig, Evaluator  # noqa: E402
from ksearch.eval.sandbox import Policy  # noqa: E402
from ksearch.hardware.cache import load_or_measure  # noqa: E402
from ksearch.targets import get_target  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402

CONFIGS = {
    "judge as it runs (static checks, namespaces, seccomp)": {},
    "without static checks": {"static_checks": False},
    "without static checks and namespaces": {"static_checks": False, "sandbox": Policy(namespaces="off")},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--workload", default="tiny")
    args = ap.parse_args()
    task = load_task("selective-scan")
    hw = load_or_measure()
    judges = {name: Evaluator(task, "cpu", hw, EvalConfig(seeds=[1, 2, 3], **kw)) for name, kw in CONFIGS.items()}
    naive = next(iter(judges.values())).naive_candidate()
    times: dict[str, list[float]] = {name: [] for name in judges}
    for ev in judges.values():  # warm-up: build cache, reference outputs, input files
        assert ev.evaluate(naive, [args.workload]).status.passed
    for _ in range(args.repeats):
        for name, ev in judges.items():
            t0 = time.perf_counter()
            res = ev.evaluate(naive, [args.workload])
            times[name].append(1e3 * (time.perf_counter() - t0))
            assert res.status.passed, res.message
    rules, expand = static_checks.rules_for("cpu"), getattr(get_target("cpu"), "expand", None)
    checks_ms = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        static_checks.check(naive, rules, expand)
        checks_ms.append(1e3 * (time.perf_counter() - t0))
    result = {name: round(statistics.median(t), 1) for name, t in times.items()}
    result["static checks alone"] = round(statistics.median(checks_ms), 1)
    for name, ms in result.items():
        print(f"{ms:8.1f} ms  {name}")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = HERE / "results" / f"judge-cost-{stamp}.json"
    out.write_text(json.dumps({"median_ms": result, "repeats": args.repeats, "workload": args.workload,
                               "machine": machine(), "date": stamp,
                               "command": "python bench/judge_cost.py " + " ".join(sys.argv[1:])}, indent=2) + "\n")
    print(f"recorded in {out.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
