"""``ksearch export --format flashinfer-bench``: the kernel as a flashinfer-bench Solution, its timings as Traces.

Written in the layout of a flashinfer-bench dataset (a ``TraceSet`` root, https://github.com/flashinfer-ai/
flashinfer-bench, Apache-2.0), under the output directory:

- ``solutions/<op_type>/<definition>/<solution name>.json``: a ``Solution`` (``name``, ``definition``, ``author``
  ``ksearch``, ``spec`` {``language``, ``target_hardware``, ``entry_point`` ``<file>::<function>``,
  ``destination_passing_style``}, ``sources`` [{``path``, ``content``}], ``description``);
- ``traces/<op_type>/<definition>.jsonl``: one ``Trace`` per workload the run's final stage measured the kernel on
  (passing): the workload (its ``uuid``, var ``axes``, every input's ``random`` / ``scalar`` / ``safetensors`` spec),
  ``evaluation`` {``status`` PASSED, ``environment`` {``hardware``, ``libs``}, ``timestamp``, ``correctness``
  {max errors}, ``performance`` {``latency_ms``: the median, ``reference_latency_ms`` and ``speedup_factor``: against
  the run's reference baseline where it was timed, else 0, flashinfer-bench's default, and the log says so}}.

Only a kernel with a counterpart goes out: a triton module (``language`` ``triton``; ksearch's ``run(inputs...,
outputs...)`` on torch CUDA tensors is flashinfer-bench's destination-passing style). A C kernel for the cpu target
is refused (flashinfer-bench's ``cpp`` solutions are bound through TVM-FFI or torch, not a C ABI), as are a CUDA
kernel whose launch plan is data (its Solution needs a host launcher export does not write yet) and MLX kernels.
The field names and rules are flashinfer-bench 0.1.2's (``flashinfer_bench.data``: ``solution.py``, ``trace.py``,
``workload.py``); tests/export/test_flashinfer_export.py validates the files with that package's own models.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ksearch import __version__
from ksearch.errors import ExportError
from ksearch.export.kernel import kernel_kind, write_text
from ksearch.records import Candidate, FinalMeasurements, Status
from ksearch.tasks.definition import Definition, Workload


def solution(candidate: Candidate, definition: Definition, provenance: dict) -> dict:
    """The Solution record (a dict, JSON-ready) for ``candidate``. Raises ExportError for a kernel with no
    flashinfer-bench counterpart (see the module docstring) or a candidate that is not one Python file."""
    kind = kernel_kind(candidate)
    if kind != "torch":
        raise ExportError(f"--format flashinfer-bench: a {candidate.target} kernel has no flashinfer-bench Solution "
                          "form (export writes triton modules; a C kernel has no counterpart there, a CUDA kernel's "
                          "launch plan needs a host launcher export does not write yet)")
    if len(candidate.sources) != 1:
        raise ExportError(f"a triton solution is one Python file; the candidate has {sorted(candidate.sources)}")
    digest = hashlib.sha256(json.dumps(candidate.sources, sort_keys=True).encode()).hexdigest()[:10]
    where = ", ".join(f"{k} {v}" for k, v in provenance.items() if v is not None)
    return {
        "name": f"{definition.name}_ksearch_{candidate.target}_{digest}",
        "definition": definition.name,
        "author": "ksearch",
        "spec": {"language": "triton", "target_hardware": ["cuda"],
                 "entry_point": f"{next(iter(candidate.sources))}::{candidate.entry_point}",
                 "dependencies": [], "destination_passing_style": True},
        "sources": [{"path": p, "content": t} for p, t in candidate.sources.items()],
        "description": f"found by ksearch {__version__} ({where})",
    }


def _workload(definition: Definition, wl: Workload) -> dict:
    """A ksearch workload as flashinfer-bench's Workload: every input listed (unlisted ones are random in both)."""
    inputs = {n: wl.inputs[n].model_dump(mode="json") if n in wl.inputs else {"type": "random"}
              for n in definition.inputs}
    var = {k: v for k, v in wl.axes.items() if getattr(definition.axes.get(k), "type", "var") == "var"}
    return {"uuid": wl.uuid, "axes": var, "inputs": inputs}


def traces(definition: Definition, workloads: list[Workload], final: FinalMeasurements | None, name: str) -> list[dict]:
    """One Trace record per workload the final stage measured ``final.best`` on and passed (none without one)."""
    if final is None or final.best is None:
        return []
    best = final.best
    by_label = {w.workload: w for w in best.workloads}
    out = []
    for wl in workloads:
        res = by_label.get(wl.label)
        if res is None or res.status is not Status.PASSED or res.median_ms is None:
            continue
        ref = final.reference.get(wl.label)
        ref_ms = ref.median_ms if ref is not None and ref.status is Status.PASSED and ref.median_ms else None
        log = (f"ksearch: median of {res.repeats} timed calls; speedup over the naive kernel "
               f"{res.speedup_vs_naive if res.speedup_vs_naive is not None else 'not measured'}; ")
        log += (f"reference: {final.reference_name}" if ref_ms else
                "the reference was not timed here: reference_latency_ms and speedup_factor are 0")
        out.append({
            "definition": definition.name, "workload": _workload(definition, wl), "solution": name,
            "evaluation": {
                "status": "PASSED", "timestamp": best.timestamp, "log": log,
                "environment": {"hardware": best.hardware or "unknown", "libs": {"ksearch": __version__}},
                "correctness": {"max_relative_error": res.max_rel_err or 0.0,
                                "max_absolute_error": res.max_abs_err or 0.0},
                "performance": {"latency_ms": res.median_ms, "reference_latency_ms": ref_ms or 0.0,
                                "speedup_factor": (ref_ms / res.median_ms) if ref_ms else 0.0},
            }})
    return out


def write(candidate: Candidate, definition: Definition, out: Path, provenance: dict,
          workloads: list[Workload] | None = None, final: FinalMeasurements | None = None) -> Path:
    """Write the Solution (and the Traces of ``final``'s measurements of ``workloads``) under the directory ``out``;
    returns the Solution's path. Raises ExportError (see `solution`; a path that cannot be written)."""
    sol = solution(candidate, definition, provenance)
    op = definition.op_type or "op"
    for what, part in (("op_type", op), ("name", definition.name)):
        if part in (".", "..") or "/" in part or "\\" in part or "\0" in part:
            raise ExportError(f"the definition's {what} {part!r} is not one path component: its files would be "
                              f"written outside {out}")
    path = write_text(Path(out) / "solutions" / op / definition.name / f"{sol['name']}.json",
                      json.dumps(sol, indent=2) + "\n")
    records = traces(definition, workloads or [], final, sol["name"])
    if records:
        write_text(Path(out) / "traces" / op / f"{definition.name}.jsonl",
                   "".join(json.dumps(r) + "\n" for r in records))
    return path

