"""Nsight Compute (ncu) as the cuda target's profiler (`ksearch.targets.base.RunProfiler`).

The judge runs the candidate's own worker under ncu once, untimed (`ksearch.eval.profiling`): ncu starts the worker
program, profiles the launches of the candidate's kernels (a ``--kernel-name`` filter built from the launch plan:
the judge's own kernels, poisoning and summaries, are left out; at most `MAX_LAUNCHES`), with the clocks as found
(``--clock-control none``: the lent machines' rule, and the judge's timings run at the same clocks), and writes
the raw page of the sections in `SECTIONS` as CSV in base units to its log file when the worker exits.
`parse_ncu_csv` reads that file into one `Profile` per kernel (its first launch; the number of launches seen is
in a note):

- metrics (each where ncu reported it): ``registers_per_thread``, ``achieved_occupancy_pct``,
  ``theoretical_occupancy_pct``, ``dram_throughput_pct``, ``memory_throughput_pct`` (the busiest memory unit),
  ``sm_throughput_pct``, ``l1_hit_rate_pct``, ``l2_hit_rate_pct``, ``shared_bytes_per_block``,
  ``local_load_bytes`` and ``local_store_bytes`` (local-memory traffic, as measured: register spills and local
  arrays), ``spill_instructions`` (SASS instructions executed for register spilling: 0 means the local traffic
  is local arrays), ``block_threads``, ``grid_blocks``, ``waves_per_sm``, and ``stall_<reason>_pct`` for the
  `TOP_STALLS` largest warp-stall reasons (their share of the stalls of WarpStateStats; "selected" and
  "not_selected" are no stalls);
- notes: the kernel and its launch shape, the SMs a grid too small leaves idle, the top stall reasons, local
  memory traffic, what limits the occupancy, ncu's warnings (but the one about unmodified clocks).

Which names the installed ncu gives was read on the lent H200 (ncu 2025.3.1.0, 2026-12-02): tests/targets/data
holds two reports it wrote there (ncu-raw-h200-*.csv).
"""

from __future__ import annotations

import csv
import glob
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from ksearch.errors import PlanError
from ksearch.records import Candidate, Profile
from ksearch.tasks.definition import Definition

#: where ncu is looked for when it is not on PATH (CUDA's bin directory, Nsight Compute's own installs)
NCU_PLACES = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu")
#: the sections collected (ncu's names; each brings its metrics into the raw page)
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis")
#: local-memory traffic, not in the sections above (a regex: absent in an ncu that names it otherwise, never an error)
EXTRA_METRICS = r"regex:^l1tex__t_(bytes|sectors)_pipe_lsu_mem_local_op_(ld|st)\.sum$"
#: candidate kernel launches profiled at most (each is replayed once per pass of the sections' metrics)
MAX_LAUNCHES = 8
#: stall reasons noted and kept as metrics
TOP_STALLS = 3
NOTE_CHARS = 160

#: Profile metric -> the ncu metrics that give it, first found wins
METRICS: dict[str, tuple[str, ...]] = {
    "registers_per_thread": ("launch__registers_per_thread",),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "dram_throughput_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                            "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l1_hit_rate_pct": ("l1tex__t_sector_hit_rate.pct",),
    "l2_hit_rate_pct": ("lts__t_sector_hit_rate.pct",),
    "spill_instructions": ("sass__inst_executed_register_spilling",),
    "waves_per_sm": ("launch__waves_per_multiprocessor",),
    "block_threads": ("launch__block_size",),
    "grid_blocks": ("launch__grid_size",),
}
_SHARED = ("launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic")
_LOCAL = {"local_load_bytes": "ld", "local_store_bytes": "st"}
#: warps stalled per issue, by reason (WarpStateStats)
#: states that are no stall: the warp that issued, and warps ready to issue that the scheduler did not pick
_NOT_STALLS = ("selected", "not_selected")
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_([a-z_0-9]+?)_per_issue_active\.ratio$")
#: ncu's warnings that say nothing about the kernel (the clocks are left as found on purpose)
_QUIET = ("unmodified GPU clocks",)
_LIMITS = {"launch__occupancy_limit_registers": "registers", "launch__occupancy_limit_shared_mem": "shared memory",
           "launch__occupancy_limit_warps": "warps", "launch__occupancy_limit_blocks": "blocks per SM"}


def find_ncu() -> str | None:
    """The ncu executable: on PATH, else in `NCU_PLACES` (the newest install), else None."""
    found = shutil.which("ncu")
    if found:
        return found
    for place in NCU_PLACES:
        hits = sorted(glob.glob(place))
        if hits:
            return hits[-1]
    return None


@lru_cache(maxsize=4)
def ncu_version(path: str) -> str:
    """``2025.3.1.0`` from ``ncu --version`` ("?" when it does not answer in 30 s)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    m = re.search(r"Version (\S+)", out)
    return m[1] if m else "?"


def kernel_filter(candidate: Candidate, definition: Definition) -> str:
    """ncu's ``--kernel-name`` for the plan's kernels: their function names (a name expression's template arguments
    and namespaces dropped: ncu's default ``--kernel-name-base function``)."""
    from ksearch.targets.cuda_launch import parse_plan

    try:
        names = parse_plan(candidate.launch, definition).kernel_names()
    except PlanError:
        names = []
    bases = [m[1] for n in names if (m := re.match(r"^\s*(?:[A-Za-z_]\w*\s*::\s*)*([A-Za-z_]\w*)", n))]
    return "regex:^(" + "|".join(dict.fromkeys(bases)) + ")$" if bases else "regex:.*"


class NcuProfiler:
    """`RunProfiler` through Nsight Compute (see the module docstring). ``path``: the ncu executable (None: not
    installed here; `available` says so)."""

    def __init__(self, path: str | None = None):
        self.path = path
        self.tool = f"ncu {ncu_version(path)}" if path else "ncu"

    def available(self) -> str | None:
        if self.path is None:
            return "Nsight Compute (ncu) is not installed here (not on PATH, nor in /usr/local/cuda/bin): no profile"
        return None

    def command(self, candidate: Candidate, definition: Definition, report: Path) -> list[str]:
        assert self.path is not None, "command() of an available profiler only"
        sections = [arg for s in SECTIONS for arg in ("--section", s)]
        return [self.path, "--target-processes", "all", "--clock-control", "none", "--csv", "--page", "raw",
                "--print-units", "base", "--log-file", str(report), *sections, "--metrics", EXTRA_METRICS,
                "--kernel-name", kernel_filter(candidate, definition), "--launch-count", str(MAX_LAUNCHES)]

    def read(self, report: Path, candidate: Candidate, workload: str) -> list[Profile]:
        if not report.is_file():
            return [Profile(tool=self.tool, workload=workload, error="ncu wrote no report (its log file is missing)")]
        return parse_ncu_csv(report.read_text(errors="replace"), self.tool, workload)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS - 3] + "..."


def parse_ncu_csv(text: str, tool: str, workload: str | None) -> list[Profile]:
    """One Profile per kernel in ncu's raw CSV page (``--csv --page raw``, as its log file holds it, among its
    ``==PROF==`` / ``==WARNING==`` / ``==ERROR==`` lines); a single Profile with ``error`` when no kernel row is
    there (ncu's errors, or that no launch matched)."""
    lines = text.splitlines()
    errors = [ln.split("==ERROR==", 1)[1].strip() for ln in lines if "==ERROR==" in ln]
    warnings = [ln.split("==WARNING==", 1)[1].strip() for ln in lines if "==WARNING==" in ln]
    rows = list(csv.reader(ln for ln in lines if ln.startswith('"')))
    header = next((r for r in rows if "Kernel Name" in r), None)
    data = [dict(zip(header, r)) for r in rows if header is not None and r is not header and len(r) == len(header)]
    data = [r for r in data if r.get("ID", "").strip().isdigit()]  # the units row has no ID
    if not data:
        why = "; ".join(errors) or "; ".join(warnings) or "no launch of the candidate's kernels was profiled"
        return [Profile(tool=tool, workload=workload, error=f"ncu: {why}"[:600])]
    launches: dict[str, list[dict[str, str]]] = {}
    for row in data:
        launches.setdefault(row.get("Kernel Name", "?"), []).append(row)
    return [_profile(name, rows_of[0], len(rows_of), len(data), tool, workload, warnings)
            for name, rows_of in launches.items()]


def _profile(name: str, row: dict[str, str], n: int, total: int, tool: str, workload: str | None,
             warnings: list[str]) -> Profile:
    """The Profile of one kernel's first profiled launch (``n`` of its launches seen, ``total`` profiled in all)."""
    values = {k: v for k, v in ((k, _number(v)) for k, v in row.items()) if v is not None}
    metrics: dict[str, float] = {}
    for out, names in METRICS.items():
        got = next((values[m] for m in names if m in values), None)
        if got is not None:
            metrics[out] = got
    if any(m in values for m in _SHARED):
        metrics["shared_bytes_per_block"] = sum(values.get(m, 0.0) for m in _SHARED)
    for out, op in _LOCAL.items():
        b = values.get(f"l1tex__t_bytes_pipe_lsu_mem_local_op_{op}.sum")
        s = values.get(f"l1tex__t_sectors_pipe_lsu_mem_local_op_{op}.sum")
        if b is not None or s is not None:
            metrics[out] = b if b is not None else 32.0 * (s or 0.0)  # a sector: 32 bytes
    stalls = {m[1]: v for k, v in values.items() if (m := _STALL.match(k)) and m[1] not in _NOT_STALLS}
    total_stall = sum(stalls.values())
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP_STALLS] if total_stall > 0 else []
    for reason, v in top:
        metrics[f"stall_{reason}_pct"] = round(100.0 * v / total_stall, 1)
    shape = f"grid {row.get('Grid Size', '?')}, block {row.get('Block Size', '?')}"
    seen = f"; launch 1 of {n} profiled" if n > 1 else ""
    cap = f" (ncu stopped at {MAX_LAUNCHES} launches)" if total >= MAX_LAUNCHES else ""
    notes = [_cut(f"kernel {name}: {shape}{seen}{cap}")]
    sms, blocks = values.get("device__attribute_multiprocessor_count"), metrics.get("grid_blocks")
    if sms and blocks is not None and blocks < sms:
        notes.append(_cut(f"the grid's {blocks:g} blocks leave {sms - blocks:g} of the {sms:g} SMs idle"))
    if top:
        notes.append(_cut("warp stalls: " + ", ".join(f"{r} {100.0 * v / total_stall:.0f}%" for r, v in top)))
    local = metrics.get("local_load_bytes", 0.0) + metrics.get("local_store_bytes", 0.0)
    if local > 0:
        spills = metrics.get("spill_instructions")
        why = "" if spills is None else \
            " (no register spills: local arrays)" if spills == 0 else f" ({spills:g} register-spill instructions)"
        notes.append(_cut(f"local memory: {metrics.get('local_load_bytes', 0.0) / 1e6:.1f} MB loaded, "
                          f"{metrics.get('local_store_bytes', 0.0) / 1e6:.1f} MB stored{why}"))
    limits = {label: values[m] for m, label in _LIMITS.items() if m in values}
    if limits:
        least = min(limits.values())
        which = [label for label, v in limits.items() if v == least]
        notes.append(_cut(f"theoretical occupancy limited by {' and '.join(which)} ({least:g} blocks per SM)"))
    notes += [_cut(f"ncu: {w}") for w in dict.fromkeys(warnings) if not any(q in w for q in _QUIET)][:2]
    return Profile(tool=tool, workload=workload, metrics=metrics, notes=notes)
