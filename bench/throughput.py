"""Evaluations per hour of a search with 1, 2, ... workers (issue 21), local processes or Ray, side by side.

Each configuration is one ordinary search (the patterns proposer, the same task, workloads, budget and seed) in a
home of its own: the naive kernel is measured first (not counted), then the clock runs from the first evaluation
sent to the last one committed. Evaluations per hour = evaluations / that time. The final stage is not run. The
configurations run one after another, in the order given, then again in reverse with ``--repeats 2`` (machines
warm up and caches fill: the second pass shows how much order matters).

    python bench/throughput.py --configs local:1,local:2,ray:2 --budget 16 -w tiny,small-b2
    python bench/throughput.py --target cuda --task selective-scan-fp16 --configs local:1,ray:1 --budget 8 \
        -w tiny,odd,mamba370m-L2048                                    (one GPU: the Ray path must work there)

Writes bench/results/throughput-<target>-<stamp>.{md,json} (machine, versions, load, date, command) and prints
the table. ``--out DIR`` writes there instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_selective_scan_search import machine  # noqa: E402

from ksearch.hardware.load import measure_load  # noqa: E402
from ksearch.run.controller import RunConfig  # noqa: E402
from ksearch.run.session import Session  # noqa: E402
from ksearch.search.strategy import StrategyConfig  # noqa: E402


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended and been waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def one(task: str, target: str, workloads: list[str] | None, budget: int, seed: int, executor: str, workers: int,
        home: Path) -> dict:
    """One search of ``budget`` evaluations: its evaluations per hour, best score and workers' shares."""
    os.environ["KSEARCH_HOME"] = str(home)
    cfg = RunConfig(task=task, target=target, budget=budget, seed=seed, workloads=workloads, workers=workers,
                    executor=executor, strategy=StrategyConfig(seed=seed))
    load_before = measure_load(0.5).busy_cores
    with Session.create(cfg) as s:
        c = s.controller
        t0 = time.monotonic()
        c.start()
        t_naive = time.monotonic() - t0
        by_worker: dict[str, int] = {}
        steps = []

        def on_step(r):
            if not r.reused and r.worker:
                by_worker[r.worker] = by_worker.get(r.worker, 0) + 1
            steps.append(time.monotonic())

        t1 = time.monotonic()
        _ = c.executor  # the workers start here (processes, or a Ray cluster and its actors): timed apart
        start_s = time.monotonic() - t1
        cpu0 = _cpu_s()
        t1 = time.monotonic()
        c.run(on_step)
        search_s = time.monotonic() - t1
        c.close()  # local hosts exit here: their CPU time (and their workers') is counted once they are waited for
        cpu_s = _cpu_s() - cpu0
        evaluations, best = c.evaluations, c.state.best_score
        evs = [ev for _, _, ev in s.store.evaluations()]
        wall = sorted(ev.wall_s for ev in evs if ev.wall_s)
        waited = sorted(ev.waited_s or 0.0 for ev in evs)
        loads = sorted(ev.load_s or 0.0 for ev in evs)
        faults = len(s.store.faults())
        run_id = s.run_id
    return {"executor": executor, "workers": workers, "evaluations": evaluations, "search_s": round(search_s, 2),
            "evals_per_hour": round(evaluations / search_s * 3600, 1) if search_s > 0 else None,
            "naive_s": round(t_naive, 2), "best_score": best, "by_worker": by_worker, "faults": faults,
            "median_evaluation_s": round(wall[len(wall) // 2], 2) if wall else None,
            "median_busy_wait_s": round(waited[len(waited) // 2], 2) if waited else None,
            "median_worker_load_s": round(loads[len(loads) // 2], 2) if loads else None,
            "workers_start_s": round(start_s, 2),
            "cpu_s_per_evaluation": round(cpu_s / evaluations, 2) if executor == "local" and evaluations else None,
            "load_before_cores": round(load_before, 2), "run_id": run_id}


def markdown(result: dict) -> str:
    lines = [f"# Search throughput: {result['task']} on {result['target']}, {result['date']}", "",
             f"Command: `{result['command']}`", "", f"Machine: {json.dumps(result['machine'])}", "",
             f"Budget {result['budget']} evaluations, seed {result['seed']}, workloads "
             f"{', '.join(result['workloads'] or ['all'])}; the patterns proposer. Time: from the first evaluation sent "
             "to the last committed, once the workers have started (the naive baseline, the workers' start and the "
             "final stage are not counted; the start is its own column).", "",
             "| pass | executor | workers | workers' start s | evaluations | search s | evaluations per hour | vs 1 "
             "worker | median s per evaluation | of which worker start and kernel load | median s waiting for a quiet "
             "machine | CPU s per evaluation | per "
             "worker | best score | faults | others' load before (cores) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in result["rows"]:
        base = next((b for b in result["rows"] if b["pass"] == r["pass"] and b["workers"] == 1), None)
        ratio = f"{r['evals_per_hour'] / base['evals_per_hour']:.2f}x" if base and base["evals_per_hour"] else "-"
        best = f"{r['best_score']:.2f}x" if r["best_score"] else "-"
        lines.append(f"| {r['pass']} | {r['executor']} | {r['workers']} | {r['workers_start_s']} | "
                     f"{r['evaluations']} | {r['search_s']} | {r['evals_per_hour']} | {ratio} | "
                     f"{r['median_evaluation_s']} | {r['median_worker_load_s']} | {r['median_busy_wait_s']} | "
                     f"{r['cpu_s_per_evaluation'] or '-'} | "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(r['by_worker'].items()))} | {best} | {r['faults']} | "
                     f"{r['load_before_cores']} |")
    lines += ["", "vs 1 worker: against the 1-worker row of the same pass (the first 1-worker configuration). The best "
              "score is each run's own (in-run paired verdicts; with several workers a CPU worker owns a share of "
              "the cores, so kernels are judged on fewer cores than with one). CPU s per evaluation: this process and the "
              "local hosts with everything they started (compiler, judge workers), per evaluation; not measured for "
              "Ray (its actors are not our children)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="selective-scan")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("-w", "--workloads", default="tiny,small-b2")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="local:1,local:2,ray:2", help="executor:workers, comma-separated")
    ap.add_argument("--repeats", type=int, default=1, help="passes over the configurations (the second reversed)")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
    workloads = [w for w in args.workloads.split(",") if w] or None
    hardware = Path(os.environ.get("KSEARCH_HOME", Path.home() / ".cache" / "ksearch")) / "hardware"
    rows = []
    for p in range(args.repeats):
        for executor, workers in (configs if p % 2 == 0 else configs[::-1]):
            home = Path(tempfile.mkdtemp(prefix="ksearch-throughput-"))
            if hardware.is_dir():  # the measured spec, not probed again per configuration
                shutil.copytree(hardware, home / "hardware")
            print(f"pass {p + 1}: {executor} x{workers} ...", flush=True)
            row = one(args.task, args.target, workloads, args.budget, args.seed, executor, workers, home)
            row["pass"] = p + 1
            rows.append(row)
            print(f"  {row['evaluations']} evaluations in {row['search_s']} s: {row['evals_per_hour']} per hour",
                  flush=True)
            shutil.rmtree(home, ignore_errors=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    info = machine()
    try:
        import ray

        info["ray"] = ray.__version__
    except ImportError:
        pass
    result = {"date": stamp, "command": "python bench/throughput.py " + " ".join(sys.argv[1:]), "machine": info,
              "task": args.task, "target": args.target, "workloads": workloads, "budget": args.budget,
              "seed": args.seed, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"throughput-{args.target}-{stamp}"
    path.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    path.with_suffix(".md").write_text(md)
    print(md)
    print(f"written: {path}.md, {path}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
