"""``ksearch ablate``: the context ablation, one ordinary run per ``--context`` level (`ksearch.run.ablate`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer
from rich.markup import escape

from ksearch.cli import signals
from ksearch.cli.options import TIME_LIMIT_HELP, llm_settings, positive_seconds, refuse, targets_help, workload_names
from ksearch.errors import SearchError
from ksearch.llm.settings import infer_backend
from ksearch.report.ablation import ablation_table, caption
from ksearch.report.tables import wide_console
from ksearch.run import ablate, ablate_results
from ksearch.run.controller import RunConfig
from ksearch.search.strategy import StrategyConfig
from ksearch.targets import resolve_target
from ksearch.tasks import builtin_names, load_task

err = wide_console(stderr=True)


def _config(task: str, target: str, budget: int, seed: int, timeout: float, workloads: str | None, stagnation: int,
            **llm) -> RunConfig:
    """The llm runs' shared configuration, as `ksearch run` builds it from the same options."""
    names = workload_names(workloads)
    if llm["command"] and llm["queue_dir"]:
        refuse("--command and --queue-dir are two backends (command, queue): give one")
    backend = llm.pop("backend")
    for flag, value, kind in (("--command", llm["command"], "command"), ("--queue-dir", llm["queue_dir"], "queue")):
        if value and backend and backend != kind:
            refuse(f"{flag} is for the {kind} backend, not --backend {backend}")
    backend = backend or ("command" if llm["command"] else "queue" if llm["queue_dir"]
                          else infer_backend(llm["model"] or llm["planner_model"], llm["base_url"]))
    if backend in ("command", "queue") and (llm["base_url"] or llm["api_key_env"]):
        refuse(f"--base-url and --api-key-env are for the openai and anthropic backends, not {backend}")
    for key in ("queue_dir", "prices_file"):  # absolute, so that a resume from another directory finds them
        llm[key] = str(Path(llm[key]).expanduser().absolute()) if llm[key] else None
    settings = llm_settings(backend=backend, **{k: v if v != "" or k == "model" else None for k, v in llm.items()})
    t = load_task(task)
    t.select(names)  # a bad workload now, not in every run
    if task not in builtin_names():
        task = str(Path(task).resolve())
    return RunConfig(task=task, target=resolve_target(target), budget=budget, seed=seed, proposer="llm",
                     timeout_s=timeout, workloads=names, llm=settings,
                     strategy=StrategyConfig(seed=seed, stagnation_window=stagnation))


def ablate_command(
    task: str = typer.Argument(None, help="Built-in task name, task directory or definition file (not with "
                                          "--resume)."),
    contexts: str = typer.Option("none,hardware,full", help="Context levels, comma-separated: one llm run each "
                                                            "(none, hardware, full: see `ksearch run --context`)."),
    offline: bool = typer.Option(False, "--offline", help="Also one run with the offline patterns proposer."),
    budget: int = typer.Option(10, min=1, help="Candidate evaluations per run."),
    target: str = typer.Option("cpu", help=f"Where kernels run: {targets_help()}."),
    workloads: str | None = typer.Option(None, "--workloads", "-w",
                                         help="Comma-separated workload names (default: all)."),
    seed: int = typer.Option(0, help="Seed of every run (strategy tie breaks, correctness inputs)."),
    timeout: float = typer.Option(60.0, help="Seconds one kernel call may take before it is killed.",
                                  callback=positive_seconds),
    stagnation: int = typer.Option(5, min=1, help="Evaluations without a new best before backing off."),
    time_limit: float | None = typer.Option(None, "--time-limit", min=1.0, help="Per run: " + TIME_LIMIT_HELP),
    model: str = typer.Option("", help="The model for planner and coder."),
    planner_model: str = typer.Option("", help="The planner's model, if not --model."),
    coder_model: str = typer.Option("", help="The coder's model, if not --model."),
    backend: str = typer.Option("", help="openai, anthropic, command or queue (as `ksearch run --backend`)."),
    base_url: str = typer.Option("", help="The endpoint of an openai or anthropic backend."),
    api_key_env: str = typer.Option("", help="The environment variable holding the key."),
    command: str = typer.Option("", help="Command backend: the program that answers a prompt on stdin."),
    queue_dir: str = typer.Option("", help="Queue backend: each run's prompts appear in QUEUE_DIR/<level>/."),
    max_cost: float | None = typer.Option(None, min=0.0, help="Per run: stop it (resumable) after this many USD."),
    max_tokens: int | None = typer.Option(None, min=1, help="Per run: stop it (resumable) after this many tokens."),
    llm_timeout: float = typer.Option(300.0, help="Seconds one llm call may take in all, connect to last byte "
                                                   "(each retry as long; a queue waits this long).",
                                      callback=positive_seconds),
    prices: str = typer.Option("", help="A YAML price table over the built-in one."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Runs at once (each in its own process)."),
    name: str = typer.Option("", help="The ablation's id (default: <task>-ablate-<date>-<hex>); an existing one "
                                      "with the same settings is resumed."),
    resume: str = typer.Option("", help="Resume ablation ID: unfinished runs are resumed, finished ones kept; its "
                                        "settings are the saved ones."),
    output: Path | None = typer.Option(None, "--output", "-o", help="The results' Markdown file (a .json beside "
                                                                    "it); default: under the ablation directory."),
) -> None:
    """One ordinary run per context level (and one offline with --offline), same task, target, workloads, seed,
    budget and judge; at the end every run's best kernel re-timed beside the naive kernel in one judge session,
    and one table."""
    if resume:
        if task is not None:
            refuse("--resume takes the saved task and settings: give no TASK")
        ab = ablate.load(resume)
    else:
        if task is None:
            refuse("give TASK (or --resume ID)")
        try:
            levels = ablate.parse_levels(contexts)
        except SearchError as e:
            refuse(str(e))
        cfg = _config(task, target, budget, seed, timeout, workloads, stagnation, backend=backend, model=model,
                      planner_model=planner_model, coder_model=coder_model, base_url=base_url,
                      api_key_env=api_key_env, command=command, queue_dir=queue_dir, context="full",
                      max_cost_usd=max_cost, max_tokens=max_tokens, timeout_s=llm_timeout, prices_file=prices)
        cmdline = "ksearch " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["ablate"] \
            else "ksearch ablate " + shlex.quote(task)
        ab = ablate.new_ablation(cfg, levels, offline, name or None, command=cmdline)
        if name and ablate.exists(name):
            old = ablate.load(name)
            if old.config != ab.config or old.contexts != ab.contexts or old.offline != ab.offline:
                refuse(f"ablation {name} exists with other settings: resume it with --resume {name}, or give "
                       "another --name")
            ab = old
    held = ablate.lock(ab.id)
    try:
        _go(ab, jobs, time_limit, output)
    finally:
        held.close()


def _go(ab: ablate.Ablation, jobs: int, time_limit: float | None, output: Path | None) -> None:
    todo = run_runs(ab, jobs, time_limit, f"ksearch ablate --resume {ab.id}")
    result = ablate_results.stored_results(ab) if not todo else None
    if result is None:
        try:
            with err.status("re-timing every run's best kernel beside the naive kernel", spinner="dots") as status:
                result = ablate_results.results(ab, lambda m: status.update(escape(m[:100])))
        except SearchError as e:  # the naive kernel failed the re-time's check: the runs are kept
            refuse(f"{e}; the runs are kept: `ksearch ablate --resume {ab.id}` re-times them")
    md, js = ablate_results.write_results(ab, result, output)
    out = wide_console()
    out.print(ablation_table(result))
    out.print(f"[dim]{escape(caption(result))}[/]", highlight=False)
    for note in [*(f"{r.label}: {r.error}" for r in result.rows if r.error), *result.notes]:
        out.print(f"[yellow]{escape(note)}[/]", highlight=False)
    out.print(f"results: {md} and {js.name}", highlight=False)
    unfinished_exit(result, f"ksearch ablate --resume {ab.id}")


def unfinished_exit(result, again: str) -> None:
    """Exit 3 saying which runs did not finish, when some did not."""
    unfinished = [r for r in result.rows if r.status not in ablate.DONE]
    if unfinished:
        err.print(f"{len(unfinished)} of {len(result.rows)} runs did not finish "
                  f"({', '.join(f'{r.label}: {r.status}' for r in unfinished)}); continue with "
                  f"[bold]{again}[/]", highlight=False)
        raise typer.Exit(3)


def run_runs(ab: ablate.Ablation, jobs: int, time_limit: float | None, again: str) -> list[ablate.AblationRun]:
    """Start or resume the manifest's unfinished runs, printing their steps; returns the runs that were to do.
    Ctrl-C: exit 130 saying how to go on (``again``)."""
    ablate.refresh(ab)
    todo = ablate.todo(ab)
    err.print(f"{'comparison' if ab.variants else 'ablation'} [bold]{ab.id}[/] · task {escape(ab.task)} · target "
              f"{ab.config.target} · budget "
              f"{ab.config.budget} per run · seed {ab.config.seed} · {len(ab.runs)} runs, {len(todo)} to go"
              + (f", {min(jobs, len(todo))} at once" if todo and jobs > 1 else ""), highlight=False)
    for r in ab.runs:
        state = "done" if r not in todo else "resume" if r.run_id else "start"
        rc = ab.config_for(r.label)
        where = f"prompts in {r.queue_dir}/" if r.queue_dir else \
            f"strategy {rc.strategy.kind}, seed {rc.seed}, proposer {rc.proposer}" if ab.variants else \
            "offline: patterns proposer" if r.label == ablate.OFFLINE else f"backend {ab.config.llm.backend}"
        err.print(f"  {r.label:<12} {state:<7} {r.run_id or '':<40} {escape(where)}", highlight=False, soft_wrap=True)

    def on_event(ev: dict) -> None:
        label = escape(ev["label"])
        if ev["kind"] == "step":
            err.print(f"  {label:<12} {escape(ev['text'])}", highlight=False)
        elif ev["kind"] == "started":
            err.print(f"[bold]{label}[/]: run {ev['run_id']}", highlight=False)
        elif ev["kind"] == "failed":
            err.print(f"[red]{label}: the run did not start: {escape(ev['error'])}[/]", highlight=False)
        elif ev["kind"] == "ended":
            why = f": {escape(ev['error'])}" if ev.get("error") else ""
            err.print(f"[bold]{label}[/]: run {ev['run_id']} {ev['status']}{why}", highlight=False)

    try:
        ablate.run_all(ab, todo, jobs, on_event, time_limit)
    except KeyboardInterrupt:
        err.print(f"\ninterrupted; what the runs committed is kept: continue with [bold]{again}[/]")
        raise typer.Exit(signals.interrupt_status()) from None
    return todo
