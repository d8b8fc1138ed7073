"""What the judge's defenses cost: one cached-build evaluation of the naive kernel on ``tiny``, as the judge runs it
and with layers switched off, the static checks alone, and one search step (a copy of the naive kernel judged
beside its parent and the best, paired rounds); with ``--against REV``, the same evaluation by the judge of another
commit, interleaved with this one's in one run (docs/evaluation.md, "Cost").

Each configuration is evaluated ``--repeats`` times in turn (interleaved, so load drifts hit them alike) after one
warm-up evaluation that fills the build cache; prints medians and records them with machine and command under
bench/results/. ``--against`` checks the commit out in a temporary git worktree and runs its judge in a process of
its own (its ``Evaluator`` on the same task, workload, seeds and hardware spec), one evaluation per request,
alternating with this tree's.

    python bench/judge_cost.py [--repeats 15] [--workload tiny] [--against 3a6ff1b]
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

from ksearch.eval import static_checks  # noqa: E402
from ksearch.eval.evaluator import EvalConfig, Evaluator  # noqa: E402
from ksearch.jail.sandbox import Policy  # noqa: E402
from ksearch.eval.timing import Reference  # noqa: E402
from ksearch.hardware.cache import load_or_measure  # noqa: E402
from ksearch.hardware.load import measure_load  # noqa: E402
from ksearch.targets import get_target  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402

CONFIGS = {
    "judge as it runs (static checks, namespaces, seccomp)": {},
    "without static checks": {"static_checks": False},
    "without static checks and namespaces": {"static_checks": False, "sandbox": Policy(namespaces="off")},
}
SEARCH_STEP = "a search step: a copy judged beside its parent and the best (paired rounds)"
AGAINST = "the same evaluation by the judge of {rev}"

#: the other commit's judge, as a process: one evaluation per line read, its wall ms printed
_OTHER = """
import sys, time
from ksearch.eval.evaluator import EvalConfig, Evaluator
import json
from ksearch.hardware.spec import HardwareSpec, Measurement
from ksearch.tasks import load_task
raw = json.load(open(sys.argv[2]))  # this tree's spec, cut to the fields the other commit's record knows
raw = {k: v for k, v in raw.items() if k in HardwareSpec.model_fields}
raw["measured"] = {k: {f: x for f, x in m.items() if f in Measurement.model_fields}
                   for k, m in raw.get("measured", {}).items() if k.split(".")[0] in HardwareSpec.model_fields}
hw = HardwareSpec.model_validate(raw)
ev = Evaluator(load_task("selective-scan"), "cpu", hw, EvalConfig(seeds=[1, 2, 3]))
naive = ev.naive_candidate()
assert ev.evaluate(naive, [sys.argv[1]]).status.passed
print("ready", flush=True)
for line in sys.stdin:
    t0 = time.perf_counter()
    res = ev.evaluate(naive, [sys.argv[1]])
    print(1e3 * (time.perf_counter() - t0) if res.status.passed else "FAILED " + res.message[:200], flush=True)
"""


def _other_judge(rev: str, workload: str, spec_path: Path, tmp: Path) -> subprocess.Popen:
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, cwd=HERE,
                               check=True).stdout.strip())
    tree = tmp / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=root, check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    proc = subprocess.Popen([sys.executable, "-c", _OTHER, workload, str(spec_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=tmp)
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise SystemExit(f"the judge of {rev} did not start: {line!r}")
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--workload", default="tiny")
    ap.add_argument("--against", help="a git revision whose judge is timed beside this one's")
    args = ap.parse_args()
    task = load_task("selective-scan")
    hw = load_or_measure()
    judges = {name: Evaluator(task, "cpu", hw, EvalConfig(seeds=[1, 2, 3], **kw)) for name, kw in CONFIGS.items()}
    naive = next(iter(judges.values())).naive_candidate()
    copy = naive.model_copy(update={"sources": {"kernel.c": naive.sources["kernel.c"] + "\n/* a copy */\n"}})
    step = Evaluator(task, "cpu", hw, EvalConfig(seeds=[1, 2, 3]))
    refs = [Reference("parent", naive), Reference("best", copy.model_copy(update={"compile_flags": ["-O2"]}))]
    times: dict[str, list[float]] = {name: [] for name in [*judges, SEARCH_STEP]}
    for ev in judges.values():  # warm-up: build cache, reference outputs, input files
        assert ev.evaluate(naive, [args.workload]).status.passed
    assert step.evaluate(copy, [args.workload], references=refs).status.passed
    other = None
    with tempfile.TemporaryDirectory(prefix="ksearch-judge-cost-") as tmp:
        if args.against:
            spec = Path(tmp) / "spec.json"
            spec.write_text(hw.model_dump_json())
            other = _other_judge(args.against, args.workload, spec, Path(tmp))
            times[AGAINST.format(rev=args.against)] = []
        loads = []
        try:
            for _ in range(args.repeats):
                loads.append(measure_load(0.2).busy_cores)
                for name, ev in judges.items():
                    t0 = time.perf_counter()
                    res = ev.evaluate(naive, [args.workload])
                    times[name].append(1e3 * (time.perf_counter() - t0))
                    assert res.status.passed, res.message
                t0 = time.perf_counter()
                res = step.evaluate(copy, [args.workload], references=refs)
                times[SEARCH_STEP].append(1e3 * (time.perf_counter() - t0))
                assert res.status.passed, res.message
                if other is not None:
                    other.stdin.write("go\n")
                    other.stdin.flush()
                    line = other.stdout.readline().strip()
                    if line.startswith("FAILED") or not line:
                        raise SystemExit(f"the judge of {args.against}: {line!r}")
                    times[AGAINST.format(rev=args.against)].append(float(line))
        finally:
            if other is not None:
                other.kill()
                subprocess.run(["git", "worktree", "remove", "--force", str(Path(tmp) / "tree")], cwd=HERE,
                               capture_output=True)
    rules, expand = static_checks.rules_for("cpu"), getattr(get_target("cpu"), "expand", None)
    checks_ms = []
    for i in range(args.repeats):  # a new candidate each time: the expansion is kept per content
        fresh = naive.model_copy(update={"sources": {"kernel.c": naive.sources["kernel.c"] + f"\n/* {i} */\n"}})
        t0 = time.perf_counter()
        static_checks.check(fresh, rules, expand)
        checks_ms.append(1e3 * (time.perf_counter() - t0))
    result = {name: round(statistics.median(t), 1) for name, t in times.items()}
    result["static checks alone (a new candidate)"] = round(statistics.median(checks_ms), 1)
    for name, ms in result.items():
        print(f"{ms:8.1f} ms  {name}")
    ratio = None
    if args.against:
        base = times[AGAINST.format(rev=args.against)]
        now = times["judge as it runs (static checks, namespaces, seccomp)"]
        ratio = round(statistics.median(n / b for n, b in zip(now, base)), 3)
        step_ratio = round(statistics.median(n / b for n, b in zip(times[SEARCH_STEP], base)), 3)
        print(f"paired per repeat: this judge / {args.against}'s = {ratio}x; a search step / {args.against}'s "
              f"evaluation = {step_ratio}x")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = HERE / "results" / f"judge-cost-{stamp}.json"
    record = {"median_ms": result, "repeats": args.repeats, "workload": args.workload, "machine": machine(),
              "others_busy_cores_median": round(statistics.median(loads), 2), "date": stamp,
              "command": "python bench/judge_cost.py " + " ".join(sys.argv[1:])}
    if args.against:
        record["against"] = {"revision": args.against, "ratio_median": ratio, "search_step_ratio_median": step_ratio}
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"recorded in {out.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
