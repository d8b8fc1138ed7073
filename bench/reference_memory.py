"""Peak memory and time of a task's NumPy reference through run_reference, with ``reference_inputs`` as the
definition says (``native``: the reference widens what it needs) and forced to ``float64`` (every input widened
first), each in a fresh process. Default: attention-decode at llama3-8b-b32-kv4k (537 MB of float16 K/V).

Peak resident memory is the process's ru_maxrss (Linux: KiB) after the calls, less the resident memory once
the inputs are drawn: what the reference adds. Prints a table; ``--out DIR`` writes it with the machine,
versions, date and command.

    python bench/reference_memory.py [--task attention-decode] [--workload llama3-8b-b32-kv4k] [--calls 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {src!r})
from ksearch.tasks import load_task
from ksearch.tasks.inputs import make_inputs
from ksearch.tasks.reference import run_reference
task, workload, mode, calls = json.load(sys.stdin)
t = load_task(task)
d = t.definition.model_copy(update={{"reference_inputs": mode}}) if mode else t.definition
inputs = make_inputs(d, t.workload(workload), seed=1)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
for _ in range(calls):
    t0 = time.perf_counter(); run_reference(d, inputs); times.append(time.perf_counter() - t0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"mode": d.reference_inputs, "inputs_gb": base / 2**20, "added_gb": (peak - base) / 2**20,
                  "times_s": times}}))
"""


def run(task: str, workload: str, mode: str | None, calls: int) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD.format(src=str(ROOT / "src"))], capture_output=True, text=True,
                       input=json.dumps([task, workload, mode, calls]), timeout=1800)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    return json.loads(r.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="attention-decode")
    ap.add_argument("--workload", default="llama3-8b-b32-kv4k")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    lines = [f"{args.task} at {args.workload}: run_reference, fresh process each", "",
             "| reference_inputs | resident after drawing inputs (GB) | added by the reference, peak (GB) | "
             "first call (s) | later calls (s) |", "| --- | ---: | ---: | ---: | --- |"]
    for mode in (None, "float64"):
        r = run(args.task, args.workload, mode, args.calls)
        label = r["mode"] + (" (the definition's)" if mode is None else " (forced)")
        lines.append(f"| {label} | {r['inputs_gb']:.2f} | {r['added_gb']:.2f} | {r['times_s'][0]:.2f} | "
                     f"{', '.join(f'{x:.2f}' for x in r['times_s'][1:])} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    if args.out:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        import numpy

        head = (f"# Reference memory: {args.task} at {args.workload} ({stamp})\n\n"
                f"- machine: {platform.node()}, {platform.machine()}; python {platform.python_version()}, "
                f"numpy {numpy.__version__}\n- command: `python {' '.join(sys.argv)}`\n\n")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"reference-memory-{stamp}.md").write_text(head + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
