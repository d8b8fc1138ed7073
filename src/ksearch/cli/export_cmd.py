"""``ksearch export``: write a run's best mlx kernel (or a candidate file) as an importable MLX function."""

from __future__ import annotations

from pathlib import Path

import typer




def export_command(
    run: str = typer.Argument("", help="Run id (or a unique prefix, or its directory) whose best kernel to export."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Module to write (default: <run>/best/<op>_mlx.py)."),
    candidate: Path | None = typer.Option(None, help="Export this candidate.json (a run's best/candidate.json, a "
                                                     "rendered pack kernel) instead of a run's best; needs --task."),
    task: str = typer.Option("", help="With --candidate: the task the kernel computes."),
) -> None:
    """Write the best kernel of RUN (target mlx-metal or mlx-cuda) as a Python module with an MLX function
    (e.g. selective_scan(u, delta, A, B, C, D, z, delta_bias) -> (out, last_state)); see docs/mlx-target.md."""
    from ksearch.errors import ExportError
    from ksearch.records import Candidate
    from ksearch.export import export_candidate, export_run
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
        path = export_candidate(cand, t.definition, out or Path(f"{t.definition.op_type}_mlx.py"),
                                {"candidate_file": str(candidate.resolve()), "task": t.definition.name,
                                 "candidate": cand.id})
    elif run:
        path = export_run(run, out)
    else:
        raise ExportError("give a RUN, or --candidate FILE --task TASK")
    typer.echo(f"wrote {path}")
