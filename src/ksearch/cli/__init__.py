"""The ``ksearch`` command: one thin module per verb over the importable API."""

from __future__ import annotations

import sys

import typer

from ksearch.errors import KsearchError

app = typer.Typer(help="ksearch: world-model-guided search for fast kernels, judged on the real device.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("ksearch")
        except PackageNotFoundError:  # run from a source tree that was never installed
            v = "unknown (not installed)"
        typer.echo(f"ksearch {v} (python {sys.version.split()[0]})")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print ksearch's version and exit.")) -> None:
    """ksearch: world-model-guided search for fast kernels, judged on the real device."""


def _register() -> None:
    from ksearch.cli import (ablate_cmd, compare_cmd, eval_cmd, export_cmd, knowledge_cmd, report_cmd, run_cmd,
                             show_cmd, tasks_cmd)

    app.command("run")(run_cmd.run_command)
    app.command("resume")(run_cmd.resume_command)
    app.add_typer(run_cmd.runs_app, name="runs")
    app.command("show")(show_cmd.show_command)
    app.command("report")(report_cmd.report_command)
    app.command("ablate")(ablate_cmd.ablate_command)
    app.command("compare")(compare_cmd.compare_command)
    app.command("eval")(eval_cmd.eval_command)
    app.command("export")(export_cmd.export_command)
    app.add_typer(tasks_cmd.app, name="tasks")
    app.add_typer(knowledge_cmd.app, name="knowledge")
    from ksearch.cli_hardware import app as hardware_app

    app.add_typer(hardware_app, name="hardware",
                  help="The local device's spec and measured ceilings, and the catalog of other hardware.")


_register()


def main() -> None:
    """Entry point: user errors print one readable message and exit 2, never a traceback.

    Ctrl-C never reaches here: typer turns KeyboardInterrupt into exit status 130 inside ``app()``, so the
    commands that have something to say about it (run, resume, eval, ablate) catch it themselves; SIGTERM raises
    it too (`ksearch.cli.signals`), and those commands then exit 143.
    """
    from ksearch.cli import signals

    try:
        try:
            with signals.sigterm_interrupts():  # SIGTERM stops a command as Ctrl-C does (exit 143)
                app()
        except OSError as e:  # a full disk, a quota, permissions, a read-only home: one line, never a traceback
            from ksearch.errors import StoreWriteError, storage_failure

            if not storage_failure(e):
                raise
            raise StoreWriteError(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None
    except KsearchError as e:
        from rich.console import Console
        from rich.markup import escape

        # the message is plain text (it may quote a config table such as [keys], or a server's words): escaped,
        # and kept on one line however narrow the terminal
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(2)
