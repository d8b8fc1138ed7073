"""``ksearch export``: write a run's best kernel (or a candidate file) as an MLX function, a KernelBench ModelNew, a
GPU MODE submission.py or a flashinfer-bench Solution with its Traces (docs/export.md)."""

from __future__ import annotations

from pathlib import Path

import typer


def export_command(
    run: str = typer.Argument("", help="Run id (or a unique prefix, or its directory) whose best kernel to export."),
    fmt: str = typer.Option("mlx", "--format", "-f",
                            help="mlx (an MLX function module), kernelbench (a ModelNew module), gpumode (a "
                                 "submission.py with custom_kernel) or flashinfer-bench (a Solution JSON and Traces "
                                 "in a dataset layout)."),
    out: Path | None = typer.Option(None, "--out", "-o",
                                    help="File to write (flashinfer-bench: a directory). Default, under <run>/best/: "
                                         "<op>_mlx.py, model_new.py, submission.py, flashinfer-bench/; with "
                                         "--candidate the same names in the current directory."),
    candidate: Path | None = typer.Option(None, help="Export this candidate.json (a run's best/candidate.json, a "
                                                     "rendered pack kernel) instead of a run's best; needs --task."),
    task: str = typer.Option("", help="With --candidate: the task the kernel computes."),
) -> None:
    """Write the best kernel of RUN in the form another ecosystem takes. Which targets each format takes: mlx:
    mlx-metal, mlx-cuda; kernelbench and gpumode: cpu, triton; flashinfer-bench: triton. Another pair exits 2
    saying so. See docs/export.md (and docs/mlx-target.md for the MLX function)."""
    from ksearch.errors import ExportError
    from ksearch.export import default_path, export_candidate, export_run
    from ksearch.records import Candidate
    from ksearch.tasks import load_task

    if candidate is not None:
        if run or not task:
            raise ExportError("--candidate takes --task TASK and no RUN")
        try:
            cand = Candidate.model_validate_json(candidate.read_text())
        except OSError as e:
            raise ExportError(f"cannot read {candidate}: {e.strerror}") from None
        except ValueError as e:
            raise ExportError(f"{candidate} is not a candidate.json: {str(e).splitlines()[0]}") from None
        t = load_task(task)
        path = export_candidate(cand, t.definition, out or default_path(fmt, t.definition, Path(".")),
                                {"candidate_file": str(candidate.resolve()), "task": t.definition.name,
                                 "candidate": cand.id}, fmt, t.workloads)
    elif run:
        path = export_run(run, out, fmt)
    else:
        raise ExportError("give a RUN, or --candidate FILE --task TASK")
    typer.echo(f"wrote {path}")
