"""``ksearch run``, ``ksearch resume``, ``ksearch runs list`` and ``ksearch show``."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ksearch.cli import signals
from ksearch.cli.options import (EXECUTOR_HELP, RAY_ADDRESS_HELP, STRATEGY_HELP, TASK_HELP, TIME_LIMIT_HELP,
                                 WORKERS_HELP, WORKLOADS_FILE_HELP, executor_settings, llm_settings, positive_seconds,
                                 refuse, strategy_kind, targets_help, workloads_args)
from ksearch.errors import LLMBudgetExhausted, LLMError, LLMUnavailable, StoreWriteError, storage_failure
from ksearch.llm.settings import infer_backend
from ksearch.records import FinalReport
from ksearch.report.summary import decision_path, summary_table, verdict_lines
from ksearch.report.tables import paired_text, wide_console
from ksearch.run.controller import RunConfig, StepReport
from ksearch.run.session import Session
from ksearch.search.strategy import StrategyConfig
from ksearch.store.runs import list_runs
from ksearch.targets import get_target, resolve_target
from ksearch.targets.base import OfflineChecks

err = wide_console(stderr=True)


def _drive(session: Session, as_json: bool, time_limit_s: float | None = None) -> None:
    """Run the search to its end with a progress bar, then print (or emit as JSON) the summary."""
    c = session.controller
    quiet = False  # progress goes to stderr with --json too: stdout carries only the JSON summary
    with Progress(TextColumn("[bold]{task.fields[phase]}"), BarColumn(), TextColumn("{task.fields[count]}"),
                  TextColumn("{task.fields[best]}"), TimeElapsedColumn(), TextColumn("{task.fields[now]}"),
                  console=err, disable=quiet, transient=False, refresh_per_second=4) as bar:
        job = bar.add_task("search", total=session.cfg.budget, phase="search", best="in-search best —", now="",
                           count=f"0/{session.cfg.budget}")
        rows: dict[str, object] = {}  # worker name -> its row (runs with several workers)
        t0, first = time.monotonic(), c.evaluations
        done_at: list[tuple[float, int]] = []  # (monotonic s, evaluations) at each step: the recent pace, for the ETA

        def progress(msg: str) -> None:
            bar.update(job, now=escape(msg[:70]))  # progress names the planner's nodes: never markup

        def counts() -> None:
            done = c.evaluations
            hours = (time.monotonic() - t0) / 3600
            rate = f" · {(done - first) / hours:.0f} evals/h" if done > first and hours > 0 else ""
            left = eta_s(done_at, session.cfg.budget - done, time_limit_s - (time.monotonic() - t0)
                         if time_limit_s else None)
            eta = "" if left is None else f" · ETA {_duration(left)} + final stage"
            bar.update(job, completed=done, count=f"{done}/{session.cfg.budget}",
                       best=f"in-search best {_best(c)}{rate}{eta}")

        def tick() -> None:  # one row per worker: its device, the node it judges and its judge's last line
            ex = c._executor
            if ex is None or ex.slots == 1:
                return
            for st in ex.states():
                if st.name not in rows:
                    rows[st.name] = bar.add_task(st.name, total=None, phase=f"  {st.name}", best=escape(st.device),
                                                 now="", count="")
                busy = st.job is not None
                what = f"{st.job.node_id}: {st.stage.removeprefix(st.job.node_id + ': ')}" if busy else st.stage
                bar.update(rows[st.name], total=None if busy else 1, completed=0 if busy else 1,
                           now=escape(f"{what[:60]} ({time.monotonic() - st.since:.0f} s)"))
            counts()

        c.on_tick = tick

        session.progress = progress
        session.evaluator.progress = progress
        c.progress = progress
        if not quiet:
            err.print(f"run [bold]{session.run_id}[/] · task {session.cfg.task} · target {session.cfg.target} · "
                      f"proposer {session.cfg.proposer} · budget {session.cfg.budget} · seed {session.cfg.seed}")
            err.print(f"[dim]{IN_SEARCH_NOTE}[/]", highlight=False)

        def on_step(r: StepReport) -> None:
            done_at.append((time.monotonic(), c.evaluations))
            counts()
            if not quiet:
                for line in step_lines(r, session.cfg.workers):
                    bar.console.print(line, highlight=False)

        try:  # Ctrl-C anywhere: the naive baseline, the search or the final measurements
            c.start()
            counts()
            if not quiet and (session.cfg.workers > 1 or session.cfg.executor != "local"):
                err.print(f"starting {session.cfg.workers} workers ({session.cfg.executor})")
            c.run(on_step, time_limit_s=time_limit_s)
            c.close()  # the workers: the final stage runs in this process, on one device
            for row in rows.values():
                bar.remove_task(row)  # type: ignore[arg-type]
            bar.update(job, phase="final", now="measuring naive, best and reference side by side")
            summary = session.finish()
        except KeyboardInterrupt:  # also one that landed inside pydantic's serializer (`unwrap_ctrl_c`)
            bar.stop()  # the live display ended first: what follows goes straight to stderr, after its last frame
            session.store.set_status("interrupted")
            err.print(f"\ninterrupted after {c.evaluations} evaluations; continue with "
                      f"[bold]ksearch resume {session.run_id}[/]")
            raise typer.Exit(signals.interrupt_status()) from None
        except LLMError as e:  # a limit, an endpoint that stayed down, or one that refused (a key, a model name)
            bar.stop()
            session.store.set_status("stopped")
            hint = " --max-cost USD / --max-tokens N" if isinstance(e, LLMBudgetExhausted) else ""
            fix = "" if isinstance(e, (LLMBudgetExhausted, LLMUnavailable)) else "once its cause is fixed, "
            err.print(f"\nstopped after {c.evaluations} evaluations: {escape(str(e))}\n{fix}continue with "
                      f"[bold]ksearch resume {session.run_id}{hint}[/]", highlight=False)
            if as_json:
                typer.echo(json.dumps({"run_id": session.run_id, "status": "stopped", "reason": str(e),
                                       "evaluations": c.evaluations}, indent=2))
            raise typer.Exit(3) from None
        except (StoreWriteError, OSError) as e:  # a full disk, a quota, permissions, the run's file removed
            if isinstance(e, OSError) and not storage_failure(e):
                raise
            bar.stop()
            _stopped_by_storage(session, e, as_json)
        bar.update(job, now="done")
    _print_summary(session, summary, as_json)
    if c.time_limited and not as_json:  # the bar's line is overwritten by the final stage: say it at the end
        err.print(f"stopped by the time limit ({time_limit_s:g} s) after {c.evaluations} of {session.cfg.budget} "
                  f"evaluations; continue with [bold]ksearch resume {session.run_id}[/]", highlight=False)


def _stopped_by_storage(session: Session, e: OSError | StoreWriteError, as_json: bool) -> None:
    """A run stopped by its storage: one line saying why and how to go on, exit 3 (resumable: every committed
    evaluation is in the store)."""
    try:
        session.store.set_status("stopped")
    except Exception:  # the same disk: the run reads as stopped anyway once no process holds its lock
        pass
    what = str(e) if isinstance(e, StoreWriteError) else f"{e.strerror or e}: {e.filename or ''}".rstrip(": ")
    how = "" if "ksearch resume" in what else \
        f"; once that is fixed, continue with [bold]ksearch resume {session.run_id}[/]"
    err.print(f"\nstopped: {escape(what)}{how}", highlight=False, soft_wrap=True)
    if as_json:
        typer.echo(json.dumps({"run_id": session.run_id, "status": "stopped", "reason": what}, indent=2))
    raise typer.Exit(3) from None


def step_lines(r: StepReport, workers: int = 1) -> list[str]:
    """The progress lines of one step (rich markup): seq, node, label, status, score, time, paired verdicts and
    why the node was chosen (its first clause, cut at 60 characters); a back-off's reason on a line of its own,
    whole (cut at the first ';' or at 60 characters, it lost the branch it switched to)."""
    score = f"{r.score:.2f}x" if r.score else r.evaluation.status.value
    note = "" if not r.reused else " (no kernel: nothing judged)" if not r.evaluation.candidate_id \
        else " (same kernel as before, not re-run)"
    # a back-off's head is two clauses ("backoff: branch A stagnated 5 evals; switching to B"): both
    why = "; ".join(r.decision.reason.split("; ")[:2 if r.decision.backoff else 1])
    ev = r.evaluation
    took = "" if r.reused or ev.wall_s is None else \
        f" {ev.wall_s:5.1f}s" + (f" (load {ev.load_s:.1f}s)" if ev.load_s else "")
    # labels are the planner's words (a model's, with the llm proposer): never markup
    on = f" [dim]({r.worker})[/]" if r.worker and workers > 1 else ""
    short = "" if r.decision.backoff else why[:60]
    lines = [f"  [{r.seq:>3}] {r.node_id:<5} {escape(f'{r.label[:26]:<26}')} {r.node_status:<9} {score:>8}{note}"
             f"{took}{_paired_note(ev, r.reused)}  [dim]{escape(short)}[/]{on}"]
    if r.decision.backoff:
        lines.append(f"        [yellow]{escape(why)}[/]")
    return lines


def _paired_note(ev, reused: bool) -> str:
    """The step's paired verdicts, e.g. `` vs parent 1.27x [1.11, 1.45] faster, vs best tie (under load)``."""
    if reused or not ev.paired:
        return ""
    same = {p.role: p for p in ev.paired}
    parts = []
    for role in ("parent", "best"):
        p = same.get(role)
        if p is None:
            continue
        if role == "best" and "parent" in same and same["parent"].candidate_id == p.candidate_id:
            parts[-1] = parts[-1].replace("vs parent", "vs parent (the best)")
            continue
        parts.append(f"vs {role} {paired_text(p, with_rounds=False)}")
    loaded = [r.load_cores for r in ev.workloads if r.load_cores is not None]
    busy = " [yellow](timed under load)[/]" if loaded and max(loaded) > 0.5 else ""
    return ("  " + ", ".join(escape(x) for x in parts) + busy) if parts else ""


#: what the progress line's number is, said once at the start of a run
IN_SEARCH_NOTE = ("'in-search best': the geometric mean speedup over the naive kernel across the bench workloads, "
                  "one timing each, that steers the search; the result is the final table, every speedup "
                  "re-measured side by side at the end")


def eta_s(done_at: list[tuple[float, int]], left: int, time_left_s: float | None = None,
          recent: int = 5) -> float | None:
    """Seconds until the search's last evaluation: evaluations ``left`` x the recent time per evaluation (over the
    last ``recent`` steps of ``done_at``, ``(monotonic s, evaluations done)`` each; with several workers this is
    wall time per completed evaluation), capped by the time limit's ``time_left_s``; None before two steps or
    with nothing left. The final stage (the side-by-side measurements) is not in it."""
    if left <= 0 or len(done_at) < 2:
        return None
    (t0, n0), (t1, n1) = done_at[-min(len(done_at), recent + 1)], done_at[-1]
    if n1 <= n0:
        return None
    eta = left * (t1 - t0) / (n1 - n0)
    return max(0.0, min(eta, time_left_s)) if time_left_s is not None else eta


def _duration(s: float) -> str:
    """``45 s``, ``12 min``, ``2.5 h``."""
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _best(c) -> str:
    s = c.state.best_score
    return "—" if s is None else f"{s:.2f}x ({c.state.best_node_id})"


def _print_summary(session: Session, report: FinalReport, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json"), indent=2))
        return
    out = wide_console()
    out.print(summary_table(report))
    for line in verdict_lines(report):
        out.print(line, highlight=False)
    if report.workloads and session.controller.state.best_score:
        out.print(f"[bold]The result is this table[/] (each speedup re-measured at the end beside the naive kernel, "
                  f"paired rounds, 99.9% interval). The in-search best, {_best(session.controller)}, was the "
                  f"geometric mean over the bench workloads of one timing each during the search: it steered the "
                  f"search and is not the result.", highlight=False)
    tree = session.controller.tree
    if report.best_node_id:
        out.print("\n[bold]Path to the best kernel[/]")
        for line in decision_path(tree, report.best_node_id):
            out.print("  " + line, highlight=False, markup=False)
        kept = f" (built with the flags and launch plan in {report.best_candidate})" if report.best_candidate else ""
        out.print(f"\nbest kernel source: [bold]{report.best_source}[/]{kept}")
        if report.reproduce:
            out.print(f"judge it again exactly: [bold]{escape(report.reproduce)}[/]", highlight=False)
    elif report.evaluations:
        out.print("[yellow]no candidate beat the naive kernel[/]")
    else:  # e.g. a model that never answered with edits that validate: say so, not "none beat the naive"
        calls = f" (its calls: ksearch show {report.run_id} --llm)" if session.cfg.proposer == "llm" else ""
        out.print(f"[yellow]no candidate was judged: the proposer gave none to judge{calls}[/]", highlight=False)
    out.print(f"{report.evaluations} evaluations · run {report.run_id} · "
              f"`ksearch show {report.run_id}` for the whole tree")


def run_command(
    task: str = typer.Argument("selective-scan", help=TASK_HELP),
    target: str = typer.Option("cpu", help=f"Where kernels run: {targets_help()} (docs/cuda-target.md, "
                                            "docs/triton-target.md, docs/mlx-target.md)."),
    budget: int = typer.Option(40, min=1, help="Candidate evaluations to spend (the naive baseline not counted)."),
    seed: int = typer.Option(0, help="Seed of the strategy's tie breaks and the correctness inputs."),
    proposer: str = typer.Option("", help="Who writes edits and kernels: patterns (offline, from the knowledge "
                                          "packs; the default) or llm (a language model: implied by --model, "
                                          "--command or --queue-dir)."),
    timeout: float = typer.Option(60.0, help="Seconds one kernel call may take before it is killed.",
                                  callback=positive_seconds),
    workloads: str | None = typer.Option(None, "--workloads", "-w",
                                         help="Comma-separated workload names (default: all), "
                                              "or a workloads file (as --workloads-file)."),
    workloads_file: str = typer.Option("", "--workloads-file", help=WORKLOADS_FILE_HELP),
    time_limit: float | None = typer.Option(None, "--time-limit", min=1.0, help=TIME_LIMIT_HELP),
    stagnation: int = typer.Option(5, min=1, help="Evaluations without a new best before backing off to "
                                                   "a competing branch."),
    strategy: str = typer.Option("worldmodel", help=STRATEGY_HELP),
    model: str = typer.Option("", help="llm proposer: the model for planner and coder (implies --proposer llm)."),
    planner_model: str = typer.Option("", help="llm proposer: the planner's model, if not --model."),
    coder_model: str = typer.Option("", help="llm proposer: the coder's model, if not --model."),
    backend: str = typer.Option("", help="llm proposer: openai (any OpenAI-compatible endpoint), anthropic, "
                                         "command or queue (default: anthropic for claude-* on Anthropic's "
                                         "API, else openai)."),
    base_url: str = typer.Option("", help="llm proposer: the endpoint (e.g. http://localhost:8000/v1 for vLLM, "
                                          "https://generativelanguage.googleapis.com/v1beta/openai/ for Gemini)."),
    api_key_env: str = typer.Option("", help="llm proposer: the environment variable holding the key "
                                             "(default: the provider's usual one)."),
    command: str = typer.Option("", help="llm proposer, command backend: the program that reads a prompt on "
                                         "stdin and writes the reply on stdout."),
    queue_dir: str = typer.Option("", help="llm proposer, queue backend: where prompts are written and reply "
                                           "files are read."),
    context: str = typer.Option("full", help="llm proposer: what prompts carry: none (the task), hardware "
                                             "(+ the hardware spec) or full (+ knowledge pack and world model)."),
    max_cost: float | None = typer.Option(None, min=0.0, help="llm proposer: stop (resumable) after this many "
                                                               "USD of calls."),
    max_tokens: int | None = typer.Option(None, min=1, help="llm proposer: stop (resumable) after this many "
                                                             "tokens."),
    llm_timeout: float = typer.Option(300.0, help="llm proposer: seconds one call may take in all, connect to last "
                                                   "byte (each retry as long; a queue waits this long).",
                                      callback=positive_seconds),
    prices: str = typer.Option("", help="llm proposer: a YAML price table over the built-in one "
                                        "(USD per million input/output tokens per model)."),
    workers: int = typer.Option(1, min=1, help=WORKERS_HELP),
    executor: str = typer.Option("local", help=EXECUTOR_HELP),
    ray_address: str = typer.Option("", help=RAY_ADDRESS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as one JSON object."),
) -> None:
    """Search for a faster kernel for TASK, guided by the world model; resumable with `ksearch resume`.

    TASK may come from flashinfer-bench: `ksearch run DATASET/NAME` loads definition NAME of a flashinfer-bench
    dataset (definitions/<op_type>/NAME.json, its workloads/<op_type>/NAME.jsonl and the safetensors blobs they
    name); `ksearch run def.json --workloads-file w.jsonl` a definition file with workloads from elsewhere. A
    search needs a naive kernel for the target (naive.<target>.<ext>: `ksearch tasks import SRC -o DIR` writes a
    task folder to put it in) and, with the default patterns proposer, a knowledge pack for the task; without
    one, run it with a model: --model MODEL (or --proposer llm --backend command --command CMD, or --backend queue
    --queue-dir DIR)."""
    executor_settings(workers, executor, ray_address)
    names, workloads_file_ = workloads_args(workloads, workloads_file)
    llm = None
    implied = any((model, planner_model, coder_model, command, queue_dir)) or backend in ("command", "queue")
    if proposer and proposer != "llm" and implied:
        refuse(f"--model, --planner-model, --coder-model, --command, --queue-dir and --backend command|queue are "
               f"for the llm proposer, not --proposer {proposer}")
    if command and queue_dir:
        refuse("--command and --queue-dir are two backends (command, queue): give one")
    for flag, value, kind in (("--command", command, "command"), ("--queue-dir", queue_dir, "queue")):
        if value and backend and backend != kind:
            refuse(f"{flag} is for the {kind} backend, not --backend {backend}")
    wants_llm = proposer == "llm" or implied
    if wants_llm:
        proposer = "llm"
        chosen = backend or ("command" if command else "queue" if queue_dir else "")
        if chosen in ("command", "queue") and (base_url or api_key_env):
            refuse(f"--base-url and --api-key-env are for the openai and anthropic backends, not {chosen}")
        if base_url and not re.match(r"https?://[^/\s]+", base_url, re.I):  # a resume could not correct it
            refuse(f"--base-url must be an http:// or https:// URL (e.g. http://localhost:8000/v1), not {base_url!r}")
        # saved absolute, like a task path, so that `ksearch resume` from another directory finds them
        queue_dir, prices = (str(Path(p).expanduser().absolute()) if p else "" for p in (queue_dir, prices))
        llm = llm_settings(backend=backend or ("command" if command else "queue" if queue_dir
                                               else infer_backend(model or planner_model, base_url)),
                           model=model, planner_model=planner_model or None, coder_model=coder_model or None,
                           base_url=base_url or None, api_key_env=api_key_env or None, command=command or None,
                           queue_dir=queue_dir or None, context=context, max_cost_usd=max_cost,
                           max_tokens=max_tokens, timeout_s=llm_timeout, prices_file=prices or None)
    elif any((backend, base_url, api_key_env, prices)) or max_cost is not None or max_tokens is not None or \
            context != "full" or llm_timeout != 300.0:
        refuse("--backend, --base-url, --api-key-env, --prices, --max-cost, --max-tokens, --context and "
               "--llm-timeout are for the llm proposer: give --model (or --proposer llm)")
    else:
        proposer = proposer or "patterns"
    target = resolve_target(target)
    if proposer == "patterns":
        _pack_or_hint(task, workloads_file_, target)
    offline = get_target(target).checks_without_device
    if offline is not None and proposer == "patterns":
        why = get_target(target).available()
        if why:
            _checked_without_device(task, target, offline, names, why)
    cfg = RunConfig(task=task, target=target, budget=budget, seed=seed, proposer=proposer, timeout_s=timeout,
                    workloads=names, workloads_file=workloads_file_, llm=llm,
                    strategy=StrategyConfig(seed=seed, stagnation_window=stagnation, kind=strategy_kind(strategy),
                                            # evolve and random with a model: no planner, improvements of parents
                                            spawn=proposer == "llm" and strategy != "worldmodel"),
                    **executor_settings(workers, executor, ray_address))
    with Session.create(cfg) as session:
        try:
            _drive(session, as_json, time_limit)
        except typer.Exit:  # stopped on purpose (Ctrl-C, an llm limit, the storage): resumable
            raise
        except Exception:  # it could not start (the naive kernel failed its check, ...): nothing left behind
            session.discard_if_unstarted()
            raise


def _pack_or_hint(task: str, workloads_file: str | None, target: str) -> None:
    """The patterns proposer needs a knowledge pack for the task on the target: without one, refuse (exit 2)
    saying how to run the task with a model instead."""
    from ksearch.errors import KnowledgeError
    from ksearch.knowledge.pack import load_pack
    from ksearch.tasks import load_task

    t = load_task(task, workloads=workloads_file)
    if get_target(target).naive_candidate(t) is None:
        return  # the session says that first: no search starts without a naive kernel
    try:
        load_pack(t.name, target)
    except KnowledgeError as e:
        if not str(e).startswith("no knowledge pack"):
            raise
        refuse(f"{e}. The patterns proposer (the default) composes kernels from a knowledge pack, and none covers "
               f"task {t.name!r} on {target}: run it with a model instead, e.g. `ksearch run {shlex.quote(task)} --target "
               f"{target} --model MODEL` (--backend openai|anthropic with --base-url/--api-key-env for an endpoint, "
               "--backend command --command CMD for a program that answers a prompt on stdin, or --backend queue "
               "--queue-dir DIR to answer the prompts yourself)")


def _checked_without_device(task: str, target: str, offline: OfflineChecks, names: list[str] | None,
                            why: str) -> None:
    """A target whose device is absent here and whose ``checks_without_device`` says so (``--target mlx-metal``
    where MLX has no Metal device): generate and statically check what the search would start from
    (`ksearch.search.static_pass`), print it, then stop (exit 2) saying what the judge needs."""
    from ksearch.search.static_pass import check_candidates
    from ksearch.tasks import load_task

    t = load_task(task)
    checked = check_candidates(t, target, names)
    out = wide_console()
    table = Table(title=f"{t.name} · {target} · candidates checked without a {offline.kernels} device",
                  title_justify="left")
    for col in ("candidate", "files", "compile step, static rules and limits, launches"):
        table.add_column(col)
    for c in checked:
        table.add_row(c.label, ", ".join(sorted(c.candidate.sources)), "ok" if c.problem is None else c.problem)
    out.print(table)
    bad = sum(c.problem is not None for c in checked)
    refuse(f"{len(checked)} {offline.kernels} candidates generated, {len(checked) - bad} pass every check made "
           f"before a device is needed ({bad} do not). Judging them needs {offline.device}: {why}. No run was "
           f"created; {offline.elsewhere.format(task=task)}.")


def resume_command(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or its directory)."),
    budget: int | None = typer.Option(None, min=1, help="Raise the run's budget (evaluations in total)."),
    max_cost: float | None = typer.Option(None, min=0.0, help="llm proposer: the run's new cost limit (USD)."),
    max_tokens: int | None = typer.Option(None, min=1, help="llm proposer: the run's new token limit."),
    time_limit: float | None = typer.Option(None, "--time-limit", min=1.0, help=TIME_LIMIT_HELP),
    workers: int | None = typer.Option(None, min=1, help="Change the run's workers (default: as it was started)."),
    executor: str | None = typer.Option(None, help="Change the run's executor: local or ray."),
    ray_address: str | None = typer.Option(None, help="Change the Ray cluster the run joins."),
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as one JSON object."),
) -> None:
    """Continue an interrupted (or stopped) run where its last committed evaluation left off; evaluations that
    were in flight are judged first."""
    limits = {k: v for k, v in (("max_cost_usd", max_cost), ("max_tokens", max_tokens)) if v is not None}
    placement: dict = {k: v for k, v in (("workers", workers), ("executor", executor)) if v is not None}
    if ray_address is not None or executor == "local":  # a run moved off Ray leaves its address behind
        placement["ray_address"] = ray_address or None
    with Session.resume(run, budget=budget, llm_limits=limits, placement=placement) as session:
        if not as_json:
            err.print(f"resuming {session.run_id} at {session.store.evaluation_count()} of {session.cfg.budget} "
                      "evaluations")
        _drive(session, as_json, time_limit)


runs_app = typer.Typer(help="Runs kept under $KSEARCH_HOME/runs.", no_args_is_help=True)


@runs_app.command("list")
def runs_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List runs, newest first."""
    rows = list_runs()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    t = Table(title="Runs")
    # the id is what every other command takes: never cut; the task name may fold, the time is to the minute
    t.add_column("id", no_wrap=True, min_width=max((len(r["id"]) for r in rows), default=2))
    t.add_column("task", overflow="fold")
    for col in ("target", "status", "evals", "best", "updated"):
        t.add_column(col, no_wrap=True)
    for r in rows:
        best = r.get("best_score")
        updated = (r.get("updated_at") or "")[:16].replace("T", " ")
        t.add_row(r["id"], r.get("task", ""), r.get("target", ""), r.get("status", ""), str(r.get("evaluations", "")),
                  "—" if best is None else f"{best:.2f}x", updated)
    out = wide_console()
    out.print(t)
    for r in rows:
        if r.get("error"):
            out.print(f"{r['id']}: {r['error']}", highlight=False, markup=False)


def _register_check() -> None:
    from ksearch.cli.check_cmd import check_command

    runs_app.command("check")(check_command)


_register_check()
