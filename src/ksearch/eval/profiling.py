"""Profiler and compiler evidence on a passing candidate, for the prompts (`EvalConfig.profile`).

Two sources, each the target's answer (`ksearch.targets.base.Target`):

- `Target.compile_report`: what the compiler says of the candidate's code (the cpu target: its vectorizer's
  report), from a build whose extra flags change no code;
- `Target.profiler`: a profiler (cuda: Nsight Compute) that runs the candidate's worker once, on the largest bench
  workload of the evaluation (`profiled_workload`), after its checks and timing are done: a fresh worker of its
  own (`ksearch.eval.profiled_worker`, the judge's worker program started by the profiler), one untimed call on
  the inputs of the evaluation's first seed, then the worker's end, when the profiler writes its report.

Nothing here decides anything: the profiled call's outputs are not read, its times are not kept, and every
failure (the tool missing, a timeout, a report that does not parse, a worker that dies under the profiler) is a
`Profile` whose ``error`` says so, never the candidate's status.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ksearch.errors import ProtocolViolation, WorkerDied, WorkerTimeout
from ksearch.eval.casedata import shared_dir
from ksearch.eval.profiled_worker import PROFILER_FILE
from ksearch.protocol import CallRequest, ErrorReply, LoadRequest
from ksearch.records import Candidate, Profile
from ksearch.tasks.definition import Definition, Workload

if TYPE_CHECKING:
    from ksearch.eval.evaluator import Evaluator
    from ksearch.targets.base import RunProfiler

#: the program a profiled worker runs (`ksearch.eval.profiled_worker`)
PROFILED_WORKER_MODULE = "ksearch.eval.profiled_worker"
#: characters of an error kept in a Profile
ERROR_CHARS = 600


def profiled_workload(definition: Definition, workloads: list[Workload]) -> Workload:
    """The workload a profiler runs: the largest (in bytes moved, `Definition.cost_of`) of the bench workloads
    among ``workloads`` (all of them when none is a bench workload). ``workloads`` must not be empty."""
    bench = [w for w in workloads if w.purpose == "bench"] or list(workloads)
    return max(bench, key=lambda w: definition.bytes_of(w))


def profiles(judge: Evaluator, candidate: Candidate, artifact: Path, workloads: list[Workload]) -> list[Profile]:
    """Every profile of a passing candidate (its build ``artifact``) judged on ``workloads``: the compiler's report,
    then the profiler's (one per kernel that ran), each as the target gives it; [] when the target has neither."""
    out: list[Profile] = []
    try:
        report = judge.target.compile_report(candidate, judge.definition, judge.config.compile_timeout_s)
    except Exception as e:  # a target's bug must not cost the verdict
        report = Profile(tool="compiler report", error=f"{type(e).__name__}: {e}"[:ERROR_CHARS])
    if report is not None:
        out.append(report)
    try:
        profiler = judge.target.profiler()
    except Exception as e:
        return [*out, Profile(tool="profiler", error=f"{type(e).__name__}: {e}"[:ERROR_CHARS])]
    if profiler is not None and workloads:
        wl = profiled_workload(judge.definition, workloads)
        judge.progress(f"profile {candidate.id} on {wl.label} ({profiler.tool})")
        out.extend(run_profiler(judge, profiler, candidate, artifact, wl, judge.config.profile_timeout_s))
    return out


def run_profiler(judge: Evaluator, profiler: RunProfiler, candidate: Candidate, artifact: Path, wl: Workload,
                 timeout_s: float) -> list[Profile]:
    """The candidate's worker run under ``profiler``: loaded, called once on ``wl``, ended; the profiler's report
    read (`RunProfiler.read`). Everything within ``timeout_s`` (then a Profile with the error says it timed out)."""
    why = profiler.available()
    if why is not None:
        return [Profile(tool=profiler.tool, workload=wl.label, error=why)]
    scratch = shared_dir()
    try:
        error = _profiled_call(judge, profiler, candidate, artifact, wl, timeout_s, scratch)
        if error:
            return [Profile(tool=profiler.tool, workload=wl.label, error=error[:ERROR_CHARS])]
        return profiler.read(scratch / "profile.report", candidate, wl.label)
    except Exception as e:  # infrastructure (no scratch space, a report that does not parse): never the verdict
        return [Profile(tool=profiler.tool, workload=wl.label, error=f"{type(e).__name__}: {e}"[:ERROR_CHARS])]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _profiled_call(judge: Evaluator, profiler: RunProfiler, candidate: Candidate, artifact: Path, wl: Workload,
                   timeout_s: float, scratch: Path) -> str:
    """Load and call the candidate once under the profiler; "" when the worker ended normally, else why not."""
    scratch.mkdir(parents=True, exist_ok=True)
    argv = profiler.command(candidate, judge.definition, scratch / "profile.report")
    (scratch / PROFILER_FILE).write_text(json.dumps({"argv": argv}))
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise WorkerTimeout(f"no answer within {timeout_s:g} s")
        return rest

    stage = "starting the worker and loading the kernel"
    worker = judge.start_worker(scratch, artifact, 1, module=PROFILED_WORKER_MODULE)
    try:
        evict = judge.evict_library()
        loaded = worker.request(LoadRequest(target=judge.target.name, artifact=str(artifact),
                                           evict=str(evict) if evict is not None else None, candidate=candidate,
                                           definition=judge.definition.model_dump(mode="json")), left())
        if isinstance(loaded, ErrorReply):
            return f"the kernel did not load under {profiler.tool}: {loaded.error}"
        seeds = judge.config.seeds
        inputs, in_dir = judge.inputs(wl, seeds[0] if seeds else judge.timing_seed(0))
        args, _ = judge.write_args(inputs, in_dir, judge.definition.axis_values(wl), scratch)
        stage = "in the profiled call"
        reply = worker.request(CallRequest(args=args), left())
        if isinstance(reply, ErrorReply):
            return f"the profiled call failed under {profiler.tool}: {reply.error}"
        if worker.proc.stdin is not None:  # the worker's loop ends; the profiler writes its report as it exits
            worker.proc.stdin.close()
        stage = "after the call, before it exited (its report is written then)"
        worker.proc.wait(timeout=left())
    except (WorkerTimeout, subprocess.TimeoutExpired):
        # where it was stopped: a profiler that hangs after the call and one too slow (a busy machine) to load
        # the kernel read alike without it
        return f"{profiler.tool} did not finish within {timeout_s:g} s (stopped {stage})"
    except (WorkerDied, ProtocolViolation) as e:
        tail = worker.stderr_tail(400)
        return f"the worker failed under {profiler.tool}: {e}" + (f"; its stderr: {tail}" if tail else "")
    finally:
        worker.close()
    if worker.proc.returncode not in (0, None):
        tail = worker.stderr_tail(400)
        return f"{profiler.tool} exited with {worker.proc.returncode}" + (f": {tail}" if tail else "")
    return ""
