"""Benchmark of the main job: `ksearch run selective-scan --budget 40` on this machine's CPU.

Runs the search in a fresh KSEARCH_HOME (hardware ceilings measured anew), times the whole run, and checks
issue 3's targets: under 15 minutes; at L = 4096 the best kernel >= 5x the naive kernel and >= 20x the NumPy
token-by-token loop, with its % of the roofline floor. Prints a table and records the result with machine,
versions, date and command under bench/results/.

    python bench/cpu_selective_scan_search.py [--budget 40] [--seed 0] [--task selective-scan]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent


def machine() -> dict:
    info = {"platform": platform.platform(), "python": sys.version.split()[0], "cores": os.cpu_count()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cc = subprocess.run(["cc", "--version"], capture_output=True, text=True)
    info["cc"] = cc.stdout.splitlines()[0] if cc.stdout else "?"
    import numpy

    info["numpy"] = numpy.__version__
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=HERE)
    info["ksearch_commit"] = (commit.stdout.strip() or "?") + ("+uncommitted changes" if dirty.stdout.strip() else "")
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="selective-scan")
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="ksearch-bench-")
    cmd = [sys.executable, "-m", "ksearch", "run", args.task, "--budget", str(args.budget), "--seed",
           str(args.seed), "--json"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, KSEARCH_HOME=home))
    wall_s = time.monotonic() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        return p.returncode
    summary = json.loads(p.stdout)
    hw = json.loads(subprocess.run([sys.executable, "-m", "ksearch", "hardware", "show", "--json"],
                                   capture_output=True, text=True, env=dict(os.environ, KSEARCH_HOME=home)).stdout)
    rows = summary["workloads"]
    last = next((w for w in rows if w["name"].endswith("L4096")), rows[-1])
    checks = {
        "wall time < 15 min": wall_s < 900,
        f"{last['name']}: best >= 5x naive": (last["speedup_vs_naive"] or 0) >= 5,
        f"{last['name']}: best >= 20x numpy token loop": (last["speedup_vs_reference"] or 0) >= 20,
    }
    lines = [f"# `ksearch run {args.task} --budget {args.budget} --seed {args.seed}` on the CPU", "",
             f"- date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
             f"- command: `python bench/cpu_selective_scan_search.py --task {args.task} --budget {args.budget} "
             f"--seed {args.seed}` (runs `{' '.join(cmd[1:])}` in a fresh KSEARCH_HOME)",
             f"- machine: {json.dumps(machine())}",
             f"- measured ceilings: {hw['memory_bandwidth_gbs']:.1f} GB/s, "
             f"{hw['peak_flops']['float32'] / 1e9:.0f} GFLOP/s fp32, {hw['exp_rate_per_s'] / 1e9:.1f} G exp/s",
             f"- run {summary['run_id']}: {summary['evaluations']} evaluations in {wall_s / 60:.1f} min; "
             f"best node {summary['best_node_id']} (candidate {summary['best_candidate_id']})", "",
             "Medians measured side by side at the end of the run, on fresh inputs:", "",
             "| workload | naive ms | best ms | numpy token loop ms | best vs naive | best vs numpy | % of floor "
             "| floor ms (bound) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for w in rows:
        f = lambda x, fmt: "—" if x is None else format(x, fmt)  # noqa: E731
        lines.append(f"| {w['name']} | {f(w['naive_ms'], '.4g')} | {f(w['best_ms'], '.4g')} | "
                     f"{f(w['reference_ms'], '.4g')} | {f(w['speedup_vs_naive'], '.1f')}x | "
                     f"{f(w['speedup_vs_reference'], '.1f')}x | {f(w['pct_of_floor'], '.1f')} | "
                     f"{f(w['floor_ms'], '.3g')} ({w['bound']}) |")
    lines += ["", "Targets (issue 3):", ""] + [f"- [{'x' if ok else ' '}] {k}" for k, ok in checks.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = HERE / "results" / f"cpu-{args.task}-search-{stamp}"
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "wall_s": wall_s, "checks": checks,
                                                    "machine": machine(), "hardware": hw, "command": cmd},
                                                   indent=2))
    print(f"recorded {out}.md and .json")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
