"""``ksearch export``: a run's best kernel (or a candidate file) in the form another ecosystem takes.

Formats (`FORMATS`; docs/export.md): ``mlx`` (an MLX function module, `ksearch.export.mlx`), ``kernelbench`` (a
``ModelNew`` module, `ksearch.export.kernelbench`), ``gpumode`` (a ``submission.py`` with ``custom_kernel``,
`ksearch.export.gpumode`), ``flashinfer-bench`` (a Solution JSON and Traces in a dataset layout,
`ksearch.export.flashinfer`). A format with no counterpart for the kernel's target raises ExportError in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ksearch.errors import ExportError
from ksearch.export.kernel import write_text
from ksearch.export.mlx import module_source
from ksearch.records import Candidate, FinalMeasurements
from ksearch.tasks.definition import Definition, Workload

__all__ = ["FORMATS", "export_candidate", "export_run", "module_source"]


@dataclass(frozen=True)
class Format:
    """An export format: ``default_name(op_type)``: the file (or directory) written when no ``--out`` is given;
    ``source``: the module's text for (candidate, definition, provenance), None for a format that writes a
    directory of records (flashinfer-bench)."""

    default_name: Callable[[str], str]
    source: Callable[[Candidate, Definition, dict], str] | None
    summary: str


def _kernelbench(c: Candidate, d: Definition, p: dict) -> str:
    from ksearch.export.kernelbench import module_source as source

    return source(c, d, p)


def _gpumode(c: Candidate, d: Definition, p: dict) -> str:
    from ksearch.export.gpumode import module_source as source

    return source(c, d, p)


FORMATS: dict[str, Format] = {
    "mlx": Format(lambda op: f"{op}_mlx.py", module_source, "an MLX function module (mlx-metal, mlx-cuda)"),
    "kernelbench": Format(lambda op: "model_new.py", _kernelbench, "a KernelBench ModelNew module (cpu, triton)"),
    "gpumode": Format(lambda op: "submission.py", _gpumode, "a GPU MODE submission.py with custom_kernel (cpu, "
                                                            "triton)"),
    "flashinfer-bench": Format(lambda op: "flashinfer-bench", None, "a flashinfer-bench Solution and Traces in a "
                                                                    "dataset layout (triton)"),
}


def _format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; formats: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def default_path(fmt: str, definition: Definition, where: Path) -> Path:
    """Where ``fmt`` writes under the directory ``where`` when no path is given. Raises ExportError for an unknown
    format."""
    return Path(where) / _format(fmt).default_name(definition.op_type)


def export_candidate(candidate: Candidate, definition: Definition, out: Path, provenance: dict, fmt: str = "mlx",
                     workloads: list[Workload] | None = None, final: FinalMeasurements | None = None) -> Path:
    """Write ``candidate`` in format ``fmt`` at ``out`` (a file; flashinfer-bench: a directory, and the path returned
    is its Solution's); returns the path. ``workloads`` and ``final`` (a run's final measurements) give
    flashinfer-bench its Traces. Raises ExportError: an unknown format, a kernel the format has no counterpart for,
    a path that cannot be written."""
    form = _format(fmt)
    if form.source is None:
        from ksearch.export.flashinfer import write

        return write(candidate, definition, Path(out), provenance, workloads, final)
    return write_text(Path(out), form.source(candidate, definition, provenance))


def export_run(run: str, out: Path | None = None, fmt: str = "mlx") -> Path:
    """Write the best kernel of ``run`` (id, prefix or directory) in format ``fmt``; default path under
    ``<run dir>/best/`` (`FORMATS`). Raises ExportError (no best kernel yet, a format with no counterpart for the
    run's target) or StoreError."""
    from ksearch.store.runs import open_run
    from ksearch.tasks import load_task

    _format(fmt)
    store = open_run(run)
    try:
        info = store.run()
        cfg = info["config"]
        final = store.final()
    finally:
        store.close()
    best = store.path.parent / "best" / "candidate.json"
    if not best.is_file():
        if info.get("status") in ("finished", "exhausted"):  # over: resuming it writes no best kernel
            raise ExportError(f"run {info['id']} is {info['status']} with no best kernel ({best} is missing: no "
                              "candidate passed); nothing to export")
        raise ExportError(f"run {info['id']} has no best kernel yet ({best} is missing): finish it with "
                          f"`ksearch resume {info['id']}`")
    candidate = Candidate.model_validate_json(best.read_text())
    task = load_task(cfg.get("task") or info["task"], workloads=cfg.get("workloads_file"))
    if final is not None and final.best_candidate_id != candidate.id:
        final = None  # measurements of another kernel: no traces rather than wrong ones
    return export_candidate(candidate, task.definition, out or default_path(fmt, task.definition, best.parent),
                            {"run": info["id"], "task": task.definition.name,
                             "node": getattr(candidate, "node_id", None), "candidate": candidate.id},
                            fmt, task.workloads, final)
