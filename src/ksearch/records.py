"""Records that cross process boundaries or are saved: candidates and their evaluations.

A candidate is content-addressed: its id is the hash of target + sources + entry point + compile flags +
launch plan, which is the compile-cache key, the store key and the dedup key.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field


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
    median_ms: float | None = None
    min_ms: float | None = None
    spread: float | None = None  # (p75 - p25) / median of the timed repeats
    #: interval of the median time, ms (order statistics, ~95%; the whole range below 6 repeats)
    ci_ms: list[float] | None = None
    repeats: int = 0
    floor_ms: float | None = None
    bound: str | None = None  # which roofline term bounds the floor: memory | compute | exp
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
    timestamp: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def result(self, workload: str) -> WorkloadResult | None:
        return next((r for r in self.workloads if r.workload == workload), None)

    def paired_with(self, role: str) -> Paired | None:
        """The summary comparison with the reference of this role, or None."""
        return next((p for p in self.paired if p.role == role and p.ratio is not None), None)
