"""Records that cross process boundaries or are saved: candidates and their evaluations, what a run's final stage
measured and the report made of it.

A candidate is content-addressed: its id is the hash of target + sources + entry point + compile flags +
launch plan, which is the compile-cache key, the store key and the dedup key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator


class Status(str, Enum):
    """Outcome of evaluating a candidate (on one workload, or overall: the first non-PASSED one)."""

    PASSED = "PASSED"
    COMPILE_ERROR = "COMPILE_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    TIMEOUT = "TIMEOUT"
    REJECTED = "REJECTED"
    SKIPPED = "SKIPPED"  # not run because an earlier workload already failed

    @property
    def passed(self) -> bool:
        return self is Status.PASSED


class Candidate(BaseModel):
    """One kernel: its sources, how to build and launch it, and where it came from.

    ``sources`` maps file names to contents; ``entry_point`` is the function the target calls;
    ``compile_flags`` are added to the target's own flags; ``launch`` is the target's launch plan (grid,
    block, ... for GPU targets; empty for the CPU). ``parent_id`` and ``node_id`` link it to the search.
    """

    target: str
    sources: dict[str, str]
    entry_point: str = "run"
    compile_flags: list[str] = Field(default_factory=list)
    launch: dict[str, Any] = Field(default_factory=dict)
    parent_id: str | None = None
    node_id: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def id(self) -> str:
        """16 hex digits of SHA-256 over what determines the binary and its launch (not provenance)."""
        key = json.dumps(
            {"target": self.target, "sources": self.sources, "entry_point": self.entry_point,
             "compile_flags": self.compile_flags, "launch": self.launch},
            sort_keys=True,
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]


class Paired(BaseModel):
    """The candidate against one reference kernel timed interleaved with it: paired rounds on the same fresh
    inputs, in one session on one device (see `ksearch.eval.timing`).

    ``role``: what the reference is to the candidate (``parent``, ``best``, ``naive``); ``ratio``: reference time /
    candidate time, the geometric mean over rounds (and over the timed workloads in an Evaluation's summary), > 1:
    the candidate is faster; ``lo``, ``hi``: its ``confidence`` interval (None: unbounded, too few rounds);
    ``verdict``: ``faster`` | ``slower`` | ``tie`` (a difference inside the interval, or under the plan's
    ``min_effect``, is a tie); ``reference_ms``: the reference's median time in this session (per workload);
    ``note``: why there is no comparison (the reference failed in this session, ...).
    """

    role: str
    candidate_id: str
    ratio: float | None = None
    lo: float | None = None
    hi: float | None = None
    n: int = 0
    confidence: float = 0.999
    verdict: str | None = None
    reference_ms: float | None = None
    note: str = ""


class WorkloadResult(BaseModel):
    """What happened on one workload. Errors are over all checked calls (worst case); times in ms."""

    workload: str
    status: Status
    message: str = ""
    checks: int = 0  # calls whose outputs were compared with the reference
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    #: the share of the tolerance the worst element took over the checked calls: max |got - want| / (atol + rtol
    #: |want|) (1.0: at the tolerance); None when not computed
    tolerance_used: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    spread: float | None = None  # (p75 - p25) / median of the timed repeats
    #: interval of the median time, ms (order statistics, ~95%; the whole range below 6 repeats)
    ci_ms: list[float] | None = None
    repeats: int = 0
    floor_ms: float | None = None
    bound: str | None = None  # which roofline term bounds the floor: memory | compute | exp
    #: where the floor's bytes and FLOPs come from (`ksearch.tasks.definition.WorkloadCost.source`: the task's cost
    #: model, torch's FLOP counter on the reference, or bytes only); None without a floor
    floor_source: str | None = None
    achieved_gbs: float | None = None
    pct_of_floor: float | None = None  # 100 * floor / median; 100 = at the floor
    speedup_vs_naive: float | None = None
    #: the judge's wall-clock seconds on this workload: inputs, reference, checked calls, timing (where the
    #: search's time goes; a worker's start and the kernel's load are in the Evaluation's load_s)
    wall_s: float | None = None
    #: whose clock decided the times: ``controller`` (the judge's own, around each call; cpu) or ``device events``
    clock: str | None = None
    #: whether its calls are long enough for the judge's clock to resolve (cpu: 10 empty round trips); an
    #: unresolved workload's comparisons are reported but do not decide the evaluation's combined verdicts
    resolved: bool | None = None
    #: the candidate against its reference kernels on this workload (empty when it was timed alone)
    paired: list[Paired] = Field(default_factory=list)
    #: timed rounds whose outputs were compared with the reference of their inputs (every round's are)
    verified_rounds: int = 0
    #: CPU cores busy with other processes while this workload was timed (None: not measured)
    load_cores: float | None = None


class Profile(BaseModel):
    """What a profiler or compiler report says about one candidate (`EvalConfig.profile`; never part of the
    verdict or the timing: the profiled run is a separate, untimed one).

    ``tool``: the tool and its version ("gcc 12.2.0 -fopt-info-vec", "ncu 2025.3.1"); ``workload``: the workload
    profiled (None for a compile-time report); ``metrics``: name (its unit in the name: ``_pct``, ``_bytes``,
    ``_per_thread``; a bare name is a count) -> value, e.g. ``achieved_occupancy_pct``, ``dram_throughput_pct``,
    ``sm_throughput_pct``, ``registers_per_thread``, ``local_store_bytes``, ``loops_vectorized``,
    ``loops_not_vectorized``; ``notes``: short lines from the tool ("kernel.c:41:5: loop vectorized using 32 byte
    vectors", "stall long_scoreboard 38%"), candidate-influenced text (source lines, kernel names) that a prompt
    fences as untrusted; ``error``: why profiling did not work (never the kernel's failure; the verdict stands).
    """

    tool: str
    workload: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    error: str = ""


class Evaluation(BaseModel):
    """The judge's verdict on one candidate over a set of workloads."""

    candidate_id: str
    task: str
    target: str
    hardware: str = ""
    status: Status
    message: str = ""
    compile_log: str = ""
    compile_s: float | None = None
    #: the judge's wall-clock seconds for the whole evaluation (static checks, compile, every workload)
    wall_s: float | None = None
    #: of which starting workers and loading the kernel into them (imports, NVRTC, Triton's module import)
    load_s: float | None = None
    workloads: list[WorkloadResult] = Field(default_factory=list)
    #: the candidate against each reference kernel over the timed workloads (geometric mean of the ratios)
    paired: list[Paired] = Field(default_factory=list)
    #: workers killed or stopped from outside the judge (the OOM killer, a signal from another process): the
    #: workload was judged again on a fresh worker; said here, never blamed on the candidate
    infra_faults: list[str] = Field(default_factory=list)
    #: seconds spent waiting for a busy machine to quieten before timing
    waited_s: float | None = None
    #: what the sandbox enforced on the worker (see `ksearch.jail.jail.enter`); empty when none ran
    sandbox: dict[str, Any] = Field(default_factory=dict)
    #: profiler and compiler reports of a passing candidate (`Profile`; with `EvalConfig.profile` only; empty
    #: otherwise, and in evaluations stored before profiles existed)
    profiles: list[Profile] = Field(default_factory=list)
    timestamp: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def result(self, workload: str) -> WorkloadResult | None:
        return next((r for r in self.workloads if r.workload == workload), None)

    def paired_with(self, role: str) -> Paired | None:
        """The summary comparison with the reference of this role, or None."""
        return next((p for p in self.paired if p.role == role and p.ratio is not None), None)


# -- the final stage: what it measured (saved) and the report made of it (saved, printed, `--json`) ------------


class HiddenWorkloads(BaseModel):
    """The best kernel checked on workloads it never saw (sizes drawn with a secret seed, no larger than the run's
    check workloads): ``axes``, one mapping of axis name to size per drawn workload (empty when none could be
    drawn); ``evaluation``, the judge's verdict on them (untimed; SKIPPED with the reason when none were drawn)."""

    axes: list[dict[str, int]] = Field(default_factory=list)
    evaluation: Evaluation


class FinalMeasurements(BaseModel):
    """What the final stage of a run measured, side by side on fresh inputs (saved in the run store as the
    ``final`` baseline; a second finish of the same best kernel reuses it).

    ``naive``: the naive kernel on the bench workloads; ``best``: the best kernel, timed beside the naive kernel
    (its status is its final verdict: fresh inputs, then the hidden workloads), None without a best kernel;
    ``hidden``: its check on hidden workloads (with ``best`` only); ``reference``: workload name -> the
    reference baseline's timing (``reference_name``; empty when no baseline runs here); ``reference_notes``:
    baselines skipped and why, workloads the timed one failed.

    Raises (on validation) ValueError when ``best``, ``best_candidate_id`` and ``hidden`` disagree.
    """

    best_candidate_id: str | None = None
    naive: Evaluation
    best: Evaluation | None = None
    hidden: HiddenWorkloads | None = None
    reference: dict[str, WorkloadResult] = Field(default_factory=dict)
    reference_name: str = "reference"
    reference_notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _best_agrees(self) -> FinalMeasurements:
        if (self.best is None) != (self.best_candidate_id is None):
            raise ValueError(f"best_candidate_id is {self.best_candidate_id!r} but the best kernel's evaluation is "
                             f"{'missing' if self.best is None else 'there'}")
        if self.best is not None and self.best.candidate_id != self.best_candidate_id:
            raise ValueError(f"the best kernel's evaluation is of candidate {self.best.candidate_id!r}, not "
                             f"best_candidate_id {self.best_candidate_id!r}")
        if self.hidden is not None and self.best is None:
            raise ValueError("hidden workloads checked without a best kernel")
        return self


class WorkloadTimes(BaseModel):
    """One bench workload's row of the final report: times are medians in ms from the final side-by-side
    measurement; None where there is nothing to say (no best kernel, no reference baseline, no roofline floor).

    ``speedup_vs_naive``: naive time / best time, the paired ratio where the best kernel was timed beside the naive
    kernel (else the two medians' ratio), with ``speedup_vs_naive_interval`` its (lo, hi) interval (None: unbounded
    or not paired); ``best_spread``: (p75 - p25) / median of the best kernel's repeats; ``load_cores``: CPU cores
    busy with other processes while it was timed; ``speedup_vs_reference``: reference ms / best ms;
    ``pct_of_floor``, ``naive_pct_of_floor``: 100 * floor / median (100 = at the roofline floor, ``floor_ms``,
    bounded by ``bound``: memory | compute | exp; ``floor_source``: where its bytes and FLOPs come from, as
    `WorkloadResult.floor_source`).
    """

    name: str
    naive_ms: float
    best_ms: float | None = None
    reference_ms: float | None = None
    speedup_vs_naive: float | None = None
    speedup_vs_naive_interval: tuple[float, float] | None = None
    best_spread: float | None = None
    load_cores: float | None = None
    speedup_vs_reference: float | None = None
    pct_of_floor: float | None = None
    naive_pct_of_floor: float | None = None
    floor_ms: float | None = None
    bound: str | None = None
    floor_source: str | None = None


class HiddenVerdict(BaseModel):
    """The best kernel's result on the hidden workloads: the judge's ``status`` and ``message`` over them, and
    their ``axes`` (one mapping of axis name to size per workload; empty when none could be drawn)."""

    status: Status
    message: str = ""
    axes: list[dict[str, int]] = Field(default_factory=list)


class FinalReport(BaseModel):
    """A finished run's report: the object `ksearch run --json` prints, the final table's rows, and what the run
    store keeps (`ksearch.store.db.Store.put_report`). Built by `FinalReport.build`, rendered by
    `ksearch.report.summary`.

    ``status``: the run's (finished, interrupted, ...); ``evaluations``: candidates judged; ``best_source``: the
    best kernel's first source file under the run directory's ``best/`` (None without a best kernel or where the
    report is rebuilt from the store); ``best_candidate``: the run directory's ``best/candidate.json``, the judged
    kernel whole (its sources, entry point, compile flags and launch plan: the source file alone may build another
    kernel); ``reproduce``: the one command that judges that kernel again (``ksearch eval TASK
    RUN_DIR/best/candidate.json --target TARGET``, with the run's workloads); ``reference_baseline``: the name of the baseline timed as the reference;
    ``workloads``: one row per bench workload the naive kernel was timed on. With a best kernel: ``best_status``
    and ``best_message``, its final verdict (fresh inputs, then the hidden workloads), and ``hidden_workloads``
    (when they were checked). ``reference_notes``: baselines skipped and why, workloads the baseline failed.

    Serialized (``model_dump``, ``model_dump_json``) without ``best_status`` and ``best_message`` when there is no
    best kernel, ``reference_notes`` when empty and ``hidden_workloads`` when None, as the summary always was;
    ``FinalReport.model_validate`` of that is equal to the report.

    Raises (on validation) ValueError when ``best_status`` and ``best_message`` are not given together, or
    ``hidden_workloads`` without them.
    """

    run_id: str
    task: str
    target: str
    status: str
    evaluations: int = Field(ge=0)
    best_candidate_id: str | None = None
    best_node_id: str | None = None
    best_source: str | None = None
    best_candidate: str | None = None
    reproduce: str | None = None
    reference_baseline: str
    workloads: list[WorkloadTimes] = Field(default_factory=list)
    best_status: Status | None = None
    best_message: str | None = None
    reference_notes: list[str] = Field(default_factory=list)
    hidden_workloads: HiddenVerdict | None = None

    @model_validator(mode="after")
    def _best_verdict_whole(self) -> FinalReport:
        if (self.best_status is None) != (self.best_message is None):
            raise ValueError(f"best_status ({self.best_status!r}) and best_message ({self.best_message!r}) go "
                             "together")
        if self.hidden_workloads is not None and self.best_status is None:
            raise ValueError("hidden_workloads without a best kernel's verdict (best_status)")
        return self

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if self.best_status is None:
            out.pop("best_status", None)
            out.pop("best_message", None)
        if not self.reference_notes:
            out.pop("reference_notes", None)
        if self.hidden_workloads is None:
            out.pop("hidden_workloads", None)
        return out

    @classmethod
    def build(cls, run: Mapping[str, Any], evaluations: int, best_node_id: str | None, final: FinalMeasurements,
              best_source: str | None = None, best_candidate: str | None = None,
              reproduce: str | None = None) -> FinalReport:
        """The report of a run from its store's row ``run`` (``id``, ``task``, ``target``, ``status``), the number
        of ``evaluations``, the best node's id and the final stage's measurements. A workload the naive kernel was
        not timed on has no row.

        Raises:
            KeyError: ``run`` lacks one of its four keys.
        """
        best = final.best
        rows = []
        for r in final.naive.workloads:
            if r.median_ms is None:
                continue
            b = best.result(r.workload) if best else None
            ref = final.reference.get(r.workload)
            ref_ms = ref.median_ms if ref else None
            best_ms = b.median_ms if b else None
            paired = next((p for p in b.paired if p.role == "naive" and p.ratio), None) if b else None
            rows.append(WorkloadTimes(
                name=r.workload, naive_ms=r.median_ms, best_ms=best_ms, reference_ms=ref_ms,
                # timed beside the naive kernel (paired rounds) where it was; else the two medians' ratio
                speedup_vs_naive=paired.ratio if paired else (r.median_ms / best_ms) if best_ms else None,
                speedup_vs_naive_interval=(paired.lo, paired.hi) if paired and paired.lo and paired.hi else None,
                best_spread=b.spread if b else None, load_cores=b.load_cores if b else None,
                speedup_vs_reference=(ref_ms / best_ms) if best_ms and ref_ms else None,
                pct_of_floor=b.pct_of_floor if b else None, naive_pct_of_floor=r.pct_of_floor,
                floor_ms=r.floor_ms, bound=r.bound, floor_source=r.floor_source))
        hidden = final.hidden
        return cls(run_id=run["id"], task=run["task"], target=run["target"], status=run["status"],
                   evaluations=evaluations, best_candidate_id=final.best_candidate_id, best_node_id=best_node_id,
                   best_source=best_source, best_candidate=best_candidate, reproduce=reproduce,
                   reference_baseline=final.reference_name, workloads=rows,
                   best_status=best.status if best else None, best_message=best.message if best else None,
                   reference_notes=list(final.reference_notes),
                   hidden_workloads=HiddenVerdict(status=hidden.evaluation.status, message=hidden.evaluation.message,
                                                  axes=hidden.axes) if hidden is not None else None)
