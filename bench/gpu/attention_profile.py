"""Where an attention candidate's GPU time goes, kernel by kernel (CUDA only; run on the GPU machine).

For each candidate (a `ksearch knowledge render` output or a run's best/candidate.json, cuda or triton target) and
each bench workload: the median call time by CUDA events with the L2 flushed and the launch covered (the same
`Timer` as bench/gpu/attention_h200.py), then the mean GPU duration of every kernel the call launches (torch.profiler,
CUPTI), and the rest: call time less the kernels' sum (launch gaps between the kernels, and the scratch zeroing the
launch plan asks for). Also a torch copy moving the call's bytes, timed the same way.

Prints one Markdown table; --out writes it with the machine, versions, date and command.

    python3 bench/gpu/attention_profile.py --task attention-decode \
        --workloads llama3-8b-b1-kv16k,llama3-8b-b8-kv4k d-default.json d-pf-w3.json [--out DIR]

Errors: a candidate that fails to compile or launch gets an error row; the others still run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_h200 import (candidate_impl, copy_ms, load_tasks, task_dtype, to_device,  # noqa: E402
                            versions)
from selective_scan_h200 import Timer  # noqa: E402


def _profile(fn, reps: int) -> dict:
    """{kernel name: (GPU microseconds in all, launches)} over ``reps`` calls of fn, by torch.profiler (CUPTI)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        out[e.key] = (us if us is not None else getattr(e, "cuda_time_total", 0.0), e.count)
    return out


def kernel_times(fn, flush, reps: int, flush_kernels: dict) -> dict:
    """Mean GPU microseconds per call of each kernel fn launches, the L2 flush before each call taken off:
    ``flush_kernels`` is `_profile(flush, n)` per flush (a candidate's own float fill, e.g. zeroed scratch, can be
    the flush's kernel: it keeps what is left of that kernel's time and launches)."""
    out = {}
    for name, (us, count) in _profile(lambda: (flush(), fn()), reps).items():
        f_us, f_count = flush_kernels.get(name, (0.0, 0))
        us, count = us - reps * f_us, count - reps * f_count
        if count >= reps and us > 0:
            out[name] = {"us": us / reps, "launches": count / reps}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("candidates", nargs="+", type=Path)
    ap.add_argument("--task", default="attention-decode")
    ap.add_argument("--workloads", default="", help="comma-separated bench workloads (default: all of the task's)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    from ksearch.tasks.inputs import make_inputs

    tasks = load_tasks([args.task], [w for w in args.workloads.split(",") if w] or None, tiny=False)
    task, bench, _ = tasks[args.task]
    d = task.definition
    dtype = task_dtype(d)
    timer = Timer()
    flush = lambda: timer.flush_buf.fill_(1.0)  # noqa: E731
    flush_kernels = {k: (us / 10, n / 10) for k, (us, n) in _profile(flush, 10).items()}   # per flush
    copy_gib = copy_ms(2 * 2**30, timer, reps=10)
    copy_bps = 2 * 2**30 / (copy_gib * 1e-3)
    lines = [f"copy bandwidth (2 GiB torch copy): {copy_bps / 1e12:.2f} TB/s", "",
             "| workload | candidate | call us | % copy BW | % same-size copy | kernels (mean us each) | rest us |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: |"]
    workdir = Path("/tmp/ks-profile")
    workdir.mkdir(exist_ok=True)
    impls = {}
    for path in args.candidates:   # compiled once, on first use; a candidate that does not load is an error row
        try:
            impls[path] = candidate_impl(args.task, path, workdir, dtype)
        except Exception as e:  # noqa: BLE001
            impls[path] = e
    for w in bench:
        axes, cost = d.axis_values(w), d.cost_of(w)
        q, k, v = to_device(make_inputs(d, w, seed=1), "cuda", dtype, dtype)
        same_us = copy_ms(cost.bytes, timer) * 1e3
        lines.append(f"| {w.name} | same-size torch copy ({cost.bytes / 1e6:.0f} MB) | {same_us:.1f} | "
                     f"{100 * cost.bytes / (same_us * 1e-6) / copy_bps:.1f} | 100.0 | | |")
        for path in args.candidates:
            name = path.stem
            try:
                impl = impls[path]
                if isinstance(impl, Exception):
                    raise impl
                p = impl.prepare(args.task, d, axes, q, k, v)
                t = timer(p.fn, reps=args.reps, warmup=3)
                us = t["median_ms"] * 1e3
                ks = kernel_times(p.fn, flush, args.reps, flush_kernels)
                kern = "; ".join(f"{n.split('(')[0][:48]} {x['us']:.1f}" + (f" x{x['launches']:.0f}" if x["launches"] != 1 else "")
                                 for n, x in sorted(ks.items(), key=lambda kv: -kv[1]["us"]))
                rest = us - sum(x["us"] for x in ks.values())
                lines.append(f"| {w.name} | {name} | {us:.1f} | {100 * cost.bytes / (us * 1e-6) / copy_bps:.1f} | "
                             f"{100 * same_us / us:.1f} | {kern} | {rest:.1f} |")
                del p
            except Exception as e:  # noqa: BLE001
                lines.append(f"| {w.name} | {name} | error | | | {type(e).__name__}: {str(e).splitlines()[0][:160]} | |")
            torch.cuda.synchronize()
            print(lines[-1], flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        head = (f"# {args.task}: per-kernel GPU time on {torch.cuda.get_device_name(0)} ({stamp})\n\n"
                f"versions: {json.dumps(versions())}\n\ncommand: `python3 {' '.join(sys.argv)}`\n\n")
        (args.out / f"attention-profile-{stamp}.md").write_text(head + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
