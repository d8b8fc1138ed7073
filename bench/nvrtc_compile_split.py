"""How long the cuda worker's NVRTC compile takes as one program or with the kernels dealt into several programs
compiled at once (ksearch.targets.cuda_runtime.compile_module's strategy), on this machine's CPUs, without a GPU.

Compiles the attention-decode cuda pack's default render (13 template instances: every head_dim x group bucket
of decode_split, and decode_combine) for sm_90 with the NVRTC of the nvidia-cuda-nvrtc wheel (tests/nvrtc.py,
the test extras), with the options CuPy's RawModule adds. Each measurement runs in a fresh process (a cold
NVRTC, as in a new worker), median of ``--repeats``. Prints a table; ``--out DIR`` writes it with the machine,
versions, date and command.

    python bench/nvrtc_compile_split.py [--repeats 3] [--out bench/results]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTS = ["-std=c++17", "-ftz=true", "--device-as-default-execution-space"]   # what CuPy's RawModule(code=) adds

_CHILD = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path[:0] = [{root!r}, {src!r}]
from tests.nvrtc import nvrtc_compile
src, names, programs = json.load(sys.stdin)
groups = [names[i::programs] for i in range(programs)]
t0 = time.perf_counter()
with ThreadPoolExecutor(programs) as pool:
    results = list(pool.map(lambda g: nvrtc_compile(src, {opts!r}, names=g), groups))
assert all(ok for ok, _ in results), [log[:500] for ok, log in results if not ok]
print(time.perf_counter() - t0)
"""


def decode_default() -> tuple[str, list[str]]:
    from ksearch.knowledge import load_pack
    from ksearch.targets.cuda import combined_source
    from ksearch.targets.cuda_launch import parse_plan
    from ksearch.tasks import load_task

    d = load_task("attention-decode").definition
    k = load_pack("attention-decode", "cuda").render(d, {"family": "split-kv"}, {})
    return combined_source(k.candidate()), parse_plan(k.launch, d).kernel_names()


def time_compile(src: str, names: list[str], programs: int) -> float:
    code = _CHILD.format(root=str(ROOT), src=str(ROOT / "src"), opts=OPTS)
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps([src, names, programs]), capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"the compile failed: {r.stderr[-2000:]}")
    return float(r.stdout.strip())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    sys.path[:0] = [str(ROOT), str(ROOT / "src")]
    from tests.nvrtc import nvrtc_status

    if nvrtc_status() is not None:
        raise SystemExit(f"no NVRTC here: {nvrtc_status()} (pip install -e '.[test]')")
    src, names = decode_default()
    cpus = len(os.sched_getaffinity(0))
    from ksearch.targets.cuda_runtime import COMPILE_THREADS

    dealt = max(1, min(len(names), COMPILE_THREADS, cpus))
    variants = [("one program (CuPy's RawModule)", 1), (f"dealt into {dealt} (compile_module here)", dealt)]
    if len(names) != dealt:
        variants.append((f"one program a kernel ({len(names)})", len(names)))
    lines = [f"attention-decode cuda default: {len(names)} kernels; {cpus} usable CPUs; fresh process each, "
             f"median of {args.repeats}", "", "| programs (compiled at once) | s | runs (s) |", "| --- | ---: | --- |"]
    for label, programs in variants:
        runs = [time_compile(src, names, programs) for _ in range(args.repeats)]
        lines.append(f"| {label} | {statistics.median(runs):.2f} | {', '.join(f'{x:.2f}' for x in runs)} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    if args.out:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        head = (f"# NVRTC compile of the decode default, one program or dealt ({stamp})\n\n"
                f"- machine: {platform.node()}, {platform.processor() or platform.machine()}, {cpus} usable CPUs\n"
                f"- python {platform.python_version()}, NVRTC from the nvidia-cuda-nvrtc wheel\n"
                f"- command: `python {' '.join(sys.argv)}`\n\n")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"nvrtc-compile-split-{stamp}.md").write_text(head + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
