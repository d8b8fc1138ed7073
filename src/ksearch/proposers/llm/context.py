"""What the llm proposer's prompts carry, as plain data for the templates in ``prompts/``, and the renderer.

Context levels (``--context``), each adding to the one before (for ablations):

- ``none``: the task (a compact definition: axes, inputs and outputs with shapes and dtypes, the reference,
  tolerances, the cost model, the workloads; the target's calling convention and its static rules) and the
  node or action at hand (with the per-workload times measured on it and its parent);
- ``hardware``: + the hardware spec (bandwidth, FLOP/s and exp ceilings, cores / SMs, SIMD or warp width,
  caches, shared memory and threads per block where present), the roofline floor of every timed workload,
  every measured time as % of its floor, and the translation layer's hard limits (catalog figures the static
  rules enforce) and concept map CUDA -> target (`translation_view`);
- ``full``: + the knowledge pack of the target (families, decisions, choices with their descriptions and
  priors, knobs), the translation layer's code patterns and assertions with their checks, + the world-model view (the planner's analysis on the root, the active path root -> node with
  ratings and measured results, the competing siblings along it, the frontier of open actions).

`Views` builds each part once per proposer (task, hardware, pack) or per call (tree views); `render` fills a
template. Everything here is deterministic: the same inputs give the same prompt text (snapshot-tested).

Text a candidate controls (the judge's messages, compiler output, a kernel's stderr quoted in them) reaches a
template only as a `ksearch.llm.untrusted.Untrusted`, which the environment writes as a fenced block of data
(`untrusted.finalize`) and refuses to format any other way; the system prompts say once what such a block is
(``prompts/_untrusted.j2``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import jinja2

from ksearch.errors import ConfigError, HardwareError, KnowledgeError, TargetError, TaskError
from ksearch.llm import untrusted
from ksearch.search.strategy import SearchState, StrategyConfig, cooling
from ksearch.search.worldmodel import PASSING, ROOT_ID, Node, NodeStatus, Tree
from ksearch.targets import get_target

LEVELS = ("none", "hardware", "full")
PROMPTS_DIR = Path(__file__).parent / "prompts"

#: frontier actions listed in a world-model view (the best rated; the rest are counted)
FRONTIER_LINES = 30
#: longest description of a pack entry kept in a prompt (characters)
PACK_TEXT = 180
#: the most characters the translation section's entries may take in a prompt (concept rows, limits, patterns
#: with sketches, assertions); over it, sketches go first, then notes are cut shorter, then rows are dropped
TRANSLATION_CHARS = 7000
#: lines of a pattern's sketch kept in a prompt
SKETCH_LINES = 4
#: a prediction within this factor of the measured speedup counts as met when no paired interval was measured
PREDICTION_BAND = 1.1
#: nodes listed in the compact tree every planner prompt carries (the rest are counted)
TREE_LINES = 80
#: a kernel is shown to the planner as a diff from its parent's when the diff is at most this share of the file
DIFF_SHARE = 0.6


def check_level(level: str) -> str:
    """``level`` if it is one of LEVELS. Raises ConfigError naming the value otherwise."""
    if level not in LEVELS:
        raise ConfigError(f"unknown prompt context {level!r}; known: {', '.join(LEVELS)}")
    return level


def _g(x: Any, digits: int = 3) -> str:
    """A number in short form: 4 significant digits for floats, as is for ints; "-" for None."""
    if x is None:
        return "-"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits + 1}g}"


def _si(x: float, unit: str) -> str:
    """A count with an SI prefix: (1.712e7, "B") -> "17.12 MB"; a unit with a leading space keeps it apart:
    (8e9, " exp/s") -> "8 G exp/s"."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


def _short(text: str | None, limit: int = PACK_TEXT) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % (size // 4) == 0:
            return f"{n / size:g} {unit}"
    return f"{n} B"


#: the prefix of a template name that stands for a target's own section (``target:<name>``: its prompt_template)
TARGET_TEMPLATE = "target:"


def _target_template(name: str) -> tuple[str, str, Any] | None:
    """Jinja's loader for ``target:<name>``: the text of target ``name``'s `Target.prompt_template` (None: no such
    template, which ``{% include ... ignore missing %}`` skips)."""
    if not name.startswith(TARGET_TEMPLATE):
        return None
    try:
        path = get_target(name[len(TARGET_TEMPLATE):]).prompt_template
    except TargetError:
        return None
    if path is None:
        return None
    return path.read_text(), str(path), lambda: True


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(PROMPTS_DIR)),
                                    jinja2.FunctionLoader(_target_template)]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, autoescape=False,
        finalize=untrusted.finalize,
    )
    env.globals["quoted"] = {"open": untrusted.OPEN_MARK, "close": untrusted.CLOSE_MARK,
                             "prefix": untrusted.LINE_PREFIX, "digits": untrusted.ID_DIGITS}
    env.filters["g"] = _g
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True)
    return env


_ENV: jinja2.Environment | None = None


def render(template: str, **ctx: Any) -> str:
    """Fill ``prompts/<template>`` (StrictUndefined: a missing variable is an error, not an empty string);
    runs of blank lines are folded to one and the text ends with one newline."""
    global _ENV
    if _ENV is None:
        _ENV = _environment()
    text = _ENV.get_template(template).render(**ctx)
    lines, blank = [], False
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            if blank or not lines:
                continue
            blank = True
        else:
            blank = False
        lines.append(line)
    return "\n".join(lines).rstrip() + "\n"


# -- the task ---------------------------------------------------------------------------------------------


def abi(definition, target: str) -> str:
    """The entry point's calling convention for a target, as code (a C prototype, the signature MLX generates
    around a body, a Python call): the target's own answer (`ksearch.targets.base.Target.abi`)."""
    return get_target(target).abi(definition)


def run_workloads(task, names: list[str] | None) -> list:
    """The run's workloads (``names``: its selection, None for all of the task's), in the task's order."""
    if not names:
        return list(task.workloads)
    wanted = set(names)
    return [w for w in task.workloads if w.label in wanted]


def task_view(task, target: str, workloads: list[str] | None = None) -> dict[str, Any]:
    """The task as the prompts show it (see the module docstring, level none); ``workloads``: the run's selection
    (only those are listed; None: all)."""
    d = task.definition
    axes = []
    for name, ax in d.axes.items():
        if ax.type == "const":
            axes.append({"name": name, "kind": "const", "range": f"= {ax.value}", "description": ax.description or ""})
        else:
            lo = "" if ax.min is None else f"{ax.min}"
            hi = "" if ax.max is None else f"{ax.max}"
            rng = f"{lo}..{hi}" if (lo or hi) else "any"
            axes.append({"name": name, "kind": "var", "range": rng, "description": ax.description or ""})

    def tensors(specs) -> list[dict[str, str]]:
        return [{"name": n, "shape": "scalar" if s.shape is None else "[" + ", ".join(s.shape) + "]",
                 "dtype": s.dtype, "description": _short(s.description, 120)} for n, s in specs.items()]

    out_dtypes = sorted({s.dtype for s in d.outputs.values()})
    tolerance = [{"dtype": dt, "rtol": _g(d.tolerance_for(dt).rtol), "atol": _g(d.tolerance_for(dt).atol)}
                 for dt in out_dtypes]
    listed: list[dict[str, str]] = []
    for w in run_workloads(task, workloads):
        try:
            cost = d.cost_of(w)
            work = f"{_si(cost.bytes, 'B')}, {_si(cost.flops, 'FLOP')}, {_si(cost.transcendentals, ' exp')}"
        except TaskError:
            work = ""
        listed.append({"name": w.label, "purpose": w.purpose,
                          "axes": " ".join(f"{k}={v}" for k, v in w.axes.items()), "work": work,
                          "dists": ", ".join(f"{k} ~ {d.describe()}" for k, d in w.distributions.items())})
    return {
        "name": d.name,
        "description": " ".join((d.description or "").split()),
        "axes": axes,
        "inputs": tensors(d.inputs),
        "outputs": tensors(d.outputs),
        "constraints": list(d.constraints),
        "tolerance": tolerance,
        "cost": {"bytes": d.cost.bytes or "every input read once, every output written once",
                 "flops": d.cost.flops, "transcendentals": d.cost.transcendentals},
        "reference": d.reference.strip("\n"),
        "reference_backend": d.reference_backend,
        "workloads": listed,
        "target": target,
        "abi": abi(d, target),
        "naive_file": get_target(target).naive_file,
        "reply_format": get_target(target).reply_format,
        "flags_help": get_target(target).flags_help,
    }


def rules_view(target: str) -> list[dict[str, str]]:
    """The target's static rules (what the judge rejects before compiling), one line each."""
    from ksearch.eval.static_checks import rules_for

    return [{"id": r.id, "why": _short(r.why, 160)} for r in rules_for(get_target(target).rule_family)]


# -- the hardware -----------------------------------------------------------------------------------------


def hardware_view(spec, task, workloads: list[str] | None = None) -> dict[str, Any]:
    """The hardware spec as labelled lines, and the roofline floor of each timed workload of the run
    (``workloads``: its selection, None for all)."""
    from ksearch.hardware.roofline import roofline

    gpu = spec.kind == "gpu"
    facts: list[tuple[str, str]] = [
        ("device", f"{spec.model or spec.name} ({spec.kind}{', ' + spec.vendor if spec.vendor else ''})"),
        ("SMs" if gpu else "cores", str(spec.cores)),
        ("max resident threads" if gpu else "hardware threads", str(spec.threads)),
        ("memory bandwidth", f"{_g(spec.memory_bandwidth_gbs)} GB/s"),
    ]
    for dt, rate in sorted(spec.peak_flops.items()):
        facts.append((f"peak {dt}", _si(rate, "FLOP/s")))
    if spec.exp_rate_per_s:
        facts.append(("exp rate", _si(spec.exp_rate_per_s, " exp/s")))
    if gpu:
        facts.append(("warp width", f"{spec.simd_width} threads"))
    else:
        isa = ", ".join(spec.simd_isa) if spec.simd_isa else "none detected"
        bits = f"{spec.simd_width_bits}-bit, " if spec.simd_width_bits else ""
        facts.append(("SIMD", f"{bits}{spec.simd_width} float32 lanes; ISA: {isa}"))
    if spec.shared_memory_per_block_bytes:
        facts.append(("shared memory per block", _bytes(spec.shared_memory_per_block_bytes)))
    if spec.max_threads_per_block:
        facts.append(("max threads per block", str(spec.max_threads_per_block)))
    for c in spec.caches:
        if c.kind == "instruction":
            continue
        shared = f" (shared by {c.shared_by_cores} cores)" if c.shared_by_cores > 1 else ""
        facts.append((f"L{c.level} {c.kind} cache", f"{_bytes(c.size_bytes)}{shared}"))
    floors = []
    for w in run_workloads(task, workloads):
        if w.purpose != "bench":
            continue
        try:
            cost = task.definition.cost_of(w)
            roof = roofline(cost.bytes, cost.flops, cost.transcendentals, spec, dtype=cost.flops_on)
        except (TaskError, ValueError, HardwareError):  # e.g. a spec without the dtype's peak: no floor
            continue
        floors.append({"name": w.label, "floor_ms": _g(roof.floor_s * 1e3), "bound": roof.bound,
                       "memory_ms": _g(roof.memory_s * 1e3), "compute_ms": _g(roof.compute_s * 1e3),
                       "exp_ms": _g(roof.exp_s * 1e3)})
    return {"name": spec.name, "facts": [{"label": k, "value": v} for k, v in facts], "floors": floors}


def floor_ms(spec, task, workload_name: str) -> float | None:
    """The roofline floor of one workload in ms, or None when it cannot be computed."""
    from ksearch.hardware.roofline import floor_s

    if spec is None:
        return None
    try:
        cost = task.definition.cost_of(task.workload(workload_name))
        return floor_s(cost.bytes, cost.flops, cost.transcendentals, spec, dtype=cost.flops_on) * 1e3
    except (TaskError, ValueError, HardwareError):  # unknown workload, a spec without the dtype's peak
        return None


# -- the knowledge pack -----------------------------------------------------------------------------------


def pack_view(task, target: str, spec) -> dict[str, Any] | None:
    """The target's knowledge pack, compact: families, decisions with their choices and knobs (descriptions cut
    to PACK_TEXT characters), restricted to what the hardware supports; None when the target has no pack."""
    from ksearch.knowledge.pack import load_pack

    try:
        pack = load_pack(task.name, target)
    except KnowledgeError:
        return None
    flags = list(getattr(spec, "simd_isa", None) or [])
    if spec is not None and getattr(spec, "kind", "") == "cpu":
        pack = pack.applicable(flags)

    def prior(a) -> str:
        return f"difficulty {a.difficulty}, prior rating {_g(a.rating)}"

    families = [{"id": f.id, "title": f.title, "text": _short(f.description), "prior": prior(f)} for f in pack.families]
    decisions = []
    for d in pack.decisions:
        choices = []
        for c in d.choices:
            knobs = [f"{k} in {json.dumps(v.values)} (default {json.dumps(v.default)})" for k, v in c.knobs.items()]
            only = f" [families: {', '.join(c.families)}]" if c.families else ""
            choices.append({"id": c.id, "title": c.title, "text": _short(c.description), "prior": prior(c),
                            "knobs": knobs, "only": only, "flags": list(c.compile_flags)})
        default = d.default if isinstance(d.default, str) else ", ".join(f"{k}: {v}" for k, v in d.default.items())
        decisions.append({"id": d.id, "title": d.title, "default": default, "choices": choices})
    return {"name": pack.name, "description": _short(pack.description, 400), "families": families,
            "decisions": decisions}


# -- the translation layer --------------------------------------------------------------------------------


def limits_view(target: str) -> list[dict[str, str]]:
    """The hard limits of the target's kernels as the judge's static rules hold them (bytes, threads), each with
    its value and source from the hardware catalog (`static_checks.Limit.resolved`); [] for a target without."""
    from ksearch.eval.static_checks import limits_for

    return [{"name": name.replace("_", " "), "value": f"{lim.value}{' ' + lim.unit if lim.unit else ''}",
             "source": _short(re.sub(r"\s*<[^>]*>", "", lim.source), 120)}
            for name, lim in limits_for(get_target(target).limit_family).items()]


def _check_text(checks) -> str:
    return "; ".join(str(c) for c in checks) if checks else "no check yet"


def translation_view(target: str, level: str) -> dict[str, Any] | None:
    """The translation layer for the run's target, compact (at most TRANSLATION_CHARS characters of entries).

    Level ``hardware``: the hard limits (catalog figures the static rules enforce) and, for a GPU target, the
    concept map's rows (CUDA concept, the target's form, hard limits on both sides, what breaks in a naive port,
    the static rule that catches it; a cpu kernel is written in the CPU's own terms, so the cpu target gets no
    rows). Level ``full``: + the code patterns (description and the target's sketch) and the
    assertions with their checks. For target cuda, which no map leads to, the rows are the limits only and the
    patterns and assertions are CUDA's own (`translation.own_knowledge`). None at level ``none``, or when there
    is nothing to show.
    """
    from ksearch.eval.static_checks import rules_for
    from ksearch.knowledge.translation import SOURCE, map_for_target, own_knowledge

    if level == "none":
        return None
    tmap = map_for_target(target)
    limits = limits_view(target)
    concepts = []
    # a cpu kernel is written in the CPU's own terms (cores, SIMD lanes, caches): CUDA's concepts (warps, shared
    # memory, blocks) have no counterpart to carry over, so the concept rows are for GPU targets only
    if tmap is not None and get_target(target).hardware_kind == "gpu":
        for c in tmap.concepts:
            lims = "; ".join(f"{lim.name}: CUDA {lim.cuda}, {tmap.target} {lim.target}" for lim in c.limits)
            concepts.append({"concept": c.concept, "equivalent": c.equivalent, "limits": lims, "note": c.note,
                             "check": c.check or ""})
    patterns: list[dict[str, Any]] = []
    assertions: list[dict[str, str]] = []
    if level == "full":
        side = tmap.target if tmap is not None else target
        if tmap is not None:
            pats, asserts = tmap.patterns, tmap.assertions
        elif get_target(target).limit_family == SOURCE:  # its kernels are the source side's (cuda, mlx-cuda)
            pats, asserts = own_knowledge(target)
        else:  # neither the end of a map nor its source (null)
            pats, asserts = [], []
        for p in pats:
            sketch = [ln.rstrip() for ln in p.sketches.get(side, "").strip("\n").splitlines()]
            patterns.append({"id": p.id, "title": p.title, "text": p.description,
                             "sketch": sketch[:SKETCH_LINES] + (["..."] if len(sketch) > SKETCH_LINES else [])})
        assertions = [{"id": a.id, "property": _short(a.property, 200), "checks": _check_text(a.checks)}
                      for a in asserts]
    if not (limits or concepts or patterns or assertions):
        return None
    view = {"title": tmap.title if tmap is not None else f"{target}'s own limits, patterns and assertions (the source side of the maps)",
            "source": tmap.source if tmap is not None else target, "target": tmap.target if tmap else target,
            "show": f"ksearch knowledge show --from cuda --to {tmap.target}" if tmap is not None else "",
            "limits": limits, "concepts": concepts, "patterns": patterns, "assertions": assertions, "dropped": 0,
            # whether the judge's own static rules hold the limits (cpu, cuda, mlx-*), or only the device does
            # (triton: Triton reports 'out of resource' when it compiles)
            "limits_checked": any(r.measure for r in rules_for(get_target(target).rule_family))}
    return _within_budget(view)


def translation_size(view: dict[str, Any]) -> int:
    """Characters the translation section's entries take (the measure TRANSLATION_CHARS bounds)."""
    n = sum(len(x["name"]) + len(x["value"]) + len(x["source"]) + 8 for x in view["limits"])
    n += sum(len(c["concept"]) + len(c["equivalent"]) + len(c["limits"]) + len(c["note"]) + len(c["check"]) + 20
             for c in view["concepts"])
    n += sum(len(p["title"]) + len(p["text"]) + sum(len(ln) + 5 for ln in p["sketch"]) + 8 for p in view["patterns"])
    n += sum(len(a["property"]) + len(a["checks"]) + 20 for a in view["assertions"])
    return n


def _within_budget(view: dict[str, Any]) -> dict[str, Any]:
    """Fit the view to TRANSLATION_CHARS: notes and descriptions to PACK_TEXT, then without sketches, then notes
    to 80 characters, then the last concept rows and patterns dropped (counted in ``dropped``)."""
    for c in view["concepts"]:
        c["note"] = _short(c["note"])
    for p in view["patterns"]:
        p["text"] = _short(p["text"])
    if translation_size(view) > TRANSLATION_CHARS:
        for p in view["patterns"]:
            p["sketch"] = []
    if translation_size(view) > TRANSLATION_CHARS:
        for c in view["concepts"]:
            c["note"] = _short(c["note"], 80)
    while translation_size(view) > TRANSLATION_CHARS and (view["concepts"] or view["patterns"]):
        (view["patterns"] or view["concepts"]).pop()
        view["dropped"] += 1
    return view


# -- the world model --------------------------------------------------------------------------------------


def speedup_over_parent(tree: Tree, node: Node) -> float | None:
    """The node's measured score over its parent's (None unless both are measured)."""
    if node.evaluation is None or not node.evaluation.passed or node.parent_id is None:
        return None
    parent = tree.parent_score(node.id)
    return node.evaluation.score / parent if parent else None  # type: ignore[operator]


def paired_words(ev) -> str:
    """What the judge found timing the node's kernel beside its parent and the best (paired rounds on the same
    inputs, 99.9% intervals of reference time / this kernel's time), e.g. ``; timed beside its parent: 1.27x
    [1.11-1.45], faster; beside the best: tie``; "" when it was not timed beside them."""
    parts = []
    for role, label, verdict in (("parent", "its parent", ev.vs_parent), ("best", "the best", ev.vs_best)):
        iv = ev.intervals.get(role)
        if verdict is None or not iv:
            continue
        ratio, lo, hi = iv
        span = f" [{_g(lo)}-{_g(hi)}]" if lo is not None and hi is not None else ""
        parts.append(f"beside {label}: {_g(ratio)}x{span}, {'a tie (within the interval)' if verdict == 'tie' else verdict}")
    return ("; timed " + "; ".join(parts)) if parts else ""


def status_word(tree: Tree, node: Node) -> str:
    """A node's status as prompts show it: ``being judged`` for an open node whose kernel is in flight."""
    return "being judged" if node.status == NodeStatus.OPEN and node.id in tree.in_flight else node.status.value


def node_line(tree: Tree, node: Node) -> dict[str, Any]:
    """One node as a dict of short strings (what tree views list)."""
    a = node.action
    ev = node.evaluation
    if ev is None:
        result = ""
    elif ev.passed:
        vs = speedup_over_parent(tree, node)
        result = f"measured {_g(ev.score)}x naive" + (f", {_g(vs)}x its parent" if vs is not None else "")
        result += paired_words(ev)
    else:
        result = f"failed: {ev.status}"
    return {
        "id": node.id,
        "parent": node.parent_id or "",
        "status": status_word(tree, node),
        "decision": node.decision,
        "choice": node.choice,
        "title": a.title if a else node.label,
        "description": a.description if a else "",
        "difficulty": a.difficulty if a else 1,
        "expected": _g(a.expected_speedup) if a and a.expected_speedup else "",
        "rating": _g(node.rating),
        "confidence": _g(node.confidence),
        "impacts": (f"memory bandwidth {_g(node.impacts.memory_bandwidth)}, register pressure "
                    f"{_g(node.impacts.register_pressure)}, hw fit {_g(node.impacts.hw_fit)}"
                    + (f"; {_short(node.impacts.notes, 300)}" if node.impacts.notes else "")),
        "result": result,
        "payload": {k: v for k, v in node.payload.items() if k != "analysis"},
    }


def node_view(tree: Tree, node_id: str) -> dict[str, Any]:
    """The node at hand: its line, its parent's line, and its prediction against its result."""
    node = tree[node_id]
    view = node_line(tree, node)
    view["parent_line"] = node_line(tree, tree[node.parent_id]) if node.parent_id else None
    measured = speedup_over_parent(tree, node)
    predicted = node.action.expected_speedup if node.action else None
    view["measured_vs_parent"] = _g(measured) if measured is not None else ""
    gap = ""
    iv = (node.evaluation.intervals.get("parent") if node.evaluation else None) or []
    lo, hi = (iv[1], iv[2]) if len(iv) == 3 else (None, None)
    if measured is not None and predicted:
        ratio = measured / predicted
        inside = lo is not None and hi is not None and lo <= predicted <= hi
        if inside:
            gap = (f"predicted {_g(predicted)}x over the parent, measured {_g(measured)}x: as predicted (inside the "
                   f"measured interval {_g(lo)}-{_g(hi)})")
        elif lo is not None or abs(math.log2(ratio)) >= math.log2(PREDICTION_BAND):
            gap = (f"predicted {_g(predicted)}x over the parent, measured {_g(measured)}x: "
                   f"{'better' if ratio > 1 else 'worse'} than predicted by {_g(ratio if ratio > 1 else 1 / ratio)}x")
        else:
            gap = (f"predicted {_g(predicted)}x over the parent, measured {_g(measured)}x: as predicted (within "
                   f"{_g(100 * (PREDICTION_BAND - 1))}%)")
    elif predicted and node.status == NodeStatus.FAILED:
        gap = f"predicted {_g(predicted)}x over the parent; the kernel failed"
    view["prediction_gap"] = gap
    return view


def _result(ev, workload: str):
    """The `WorkloadResult` of one workload in a full evaluation (None: no evaluation or not there)."""
    if ev is None:
        return None
    return next((r for r in ev.workloads if r.workload == workload), None)


def accuracy_cell(r) -> str:
    """How close a workload's outputs came to the tolerance: ``"3.1% of tolerance (max abs 1.2e-05, max rel
    3.4e-04)"``; "-" when nothing was checked."""
    if r is None or r.max_abs_err is None or not r.checks:
        return "-"
    errs = f"max abs {r.max_abs_err:.2g}" + (f", max rel {r.max_rel_err:.2g}" if r.max_rel_err is not None else "")
    if r.tolerance_used is None or math.isnan(r.tolerance_used):
        return errs
    return f"{100 * r.tolerance_used:.3g}% of tolerance ({errs})"


def timings(tree: Tree, columns: list[tuple[str, str]], spec, task,
            evaluations: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per-workload median times of some nodes, with their intervals, the naive kernel's and the roofline floor,
    and how close each node's outputs came to the tolerance.

    Args:
        columns: (label, node id) per node, e.g. [("parent n3", "n3"), ("best n7", "n7")].
        evaluations: node id -> its full `ksearch.records.Evaluation` where known (the 99.9% interval of each
            median, the errors against the tolerance, the check workloads); without one a node shows its median.

    Returns:
        {"columns": labels, "rows": [{"workload", "naive", "floor", "cells": ["1.23 ms (1.2-1.27; 4.1x naive,
        45% of floor)", ...]}], "floor": whether any floor is known, "accuracy": [{"workload", "purpose",
        "cells"}] over every checked workload (check workloads included), "tolerance": the task's tolerances,
        "intervals": whether any cell has an interval}.
        Empty rows when nothing was timed. Without a spec (None) there is no floor and no % of floor.
    """
    evaluations = evaluations or {}
    names: list[str] = []
    for nid in [ROOT_ID, *[n for _, n in columns]]:
        ev = tree[nid].evaluation
        for w in (ev.latency_ms if ev else {}):
            if w not in names:
                names.append(w)
    naive = tree.root.evaluation.latency_ms if tree.root.evaluation else {}
    rows = []
    for w in names:
        fl = floor_ms(spec, task, w)
        cells = []
        for _, nid in columns:
            ev = tree[nid].evaluation
            ms = ev.latency_ms.get(w) if ev else None
            if ms is None:
                cells.append("-")
                continue
            cell = f"{_g(ms)} ms"
            extra = []
            r = _result(evaluations.get(nid), w)
            if r is not None and r.ci_ms and len(r.ci_ms) == 2:
                extra.append(f"{_g(r.ci_ms[0])}-{_g(r.ci_ms[1])}")
            ups = []
            if naive.get(w):
                ups.append(f"{_g(naive[w] / ms)}x naive")
            if fl:
                ups.append(f"{100 * fl / ms:.0f}% of floor")
            if ups:
                extra.append(", ".join(ups))
            cells.append(cell + (f" ({'; '.join(extra)})" if extra else ""))
        naive_cell = "-"
        if naive.get(w):
            naive_cell = f"{_g(naive[w])} ms" + (f" ({100 * fl / naive[w]:.0f}% of floor)" if fl else "")
        rows.append({"workload": w, "naive": naive_cell,
                     "floor": f"{_g(fl)} ms" if fl else "-", "cells": cells})
    accuracy = []
    checked: list[str] = []
    for _, nid in columns:
        for r in (evaluations[nid].workloads if nid in evaluations else []):
            if r.workload not in checked and r.checks:
                checked.append(r.workload)
    for w in checked:
        try:
            purpose = task.workload(w).purpose
        except TaskError:
            purpose = ""
        accuracy.append({"workload": w, "purpose": purpose,
                         "cells": [accuracy_cell(_result(evaluations.get(nid), w)) for _, nid in columns]})
    d = task.definition
    tolerance = "; ".join(f"{dt}: rtol {_g(d.tolerance_for(dt).rtol)}, atol {_g(d.tolerance_for(dt).atol)}"
                          for dt in sorted({o.dtype for o in d.outputs.values()}))
    intervals = any(r.ci_ms for ev in evaluations.values() for r in ev.workloads)
    return {"columns": [label for label, _ in columns], "rows": rows, "floor": any(r["floor"] != "-" for r in rows),
            "accuracy": accuracy, "tolerance": tolerance, "intervals": intervals}


def profile_view(label: str, ev) -> list[dict[str, Any]]:
    """The profiler and compiler evidence of one evaluation (``ev.profiles``, `ksearch.records.Profile`) for a
    prompt: metrics as ``name=value`` (units in the names), the tool's notes, or why it did not work, as
    `untrusted.Untrusted` (they quote the kernel's source and names). [] without an evaluation or profiles."""
    out = []
    for p in getattr(ev, "profiles", None) or []:
        metrics = ", ".join(f"{k}={_g(v)}" for k, v in sorted(p.metrics.items()))
        text = p.error if p.error else "\n".join(p.notes)
        out.append({"label": label, "tool": p.tool, "workload": p.workload, "metrics": metrics,
                    "failed": bool(p.error),
                    "notes": untrusted.Untrusted.of(text, untrusted.PROFILER) if text.strip() else None})
    return out


def compact_tree(tree: Tree, limit: int = TREE_LINES) -> dict[str, Any]:
    """The whole tree, one short line per live node in depth-first order (id, status, choice or title, rating,
    confidence, measured speedup), indented by depth: what every planner prompt carries at every context level,
    so the planner can refer to its nodes by id. Dropped nodes are counted, not listed; past ``limit`` lines
    the rest are counted.

    Returns:
        {"lines": [{"indent", "id", "status", "title", "rating", "confidence", "measured"}], "more": int,
        "dropped": int, "chosen": the planner's pending choice or None, "retime": pending re-times}.
    """
    lines: list[dict[str, Any]] = []
    more = 0
    dropped = sum(1 for n in tree if n.status == NodeStatus.DROPPED)

    def walk(node: Node, depth: int) -> None:
        nonlocal more
        if node.status == NodeStatus.DROPPED:
            return
        if len(lines) >= limit:
            more += 1
        else:
            ev = node.evaluation
            measured = ""
            if ev is not None:
                measured = f"{_g(ev.score)}x naive" if ev.passed else f"failed: {ev.status}"
                if ev.passed and ev.round:
                    measured += f" (re-timed; before {_g(ev.previous_score)}x)"
            title = node.label if node.id != ROOT_ID else "the naive kernel"
            lines.append({"indent": "  " * depth, "id": node.id, "status": status_word(tree, node),
                          "title": _short(title if node.id == ROOT_ID or not node.action else
                                          (f"{node.choice}: " if node.choice else "") + node.action.title, 90),
                          "rating": _g(node.rating), "confidence": _g(node.confidence), "measured": measured})
        for child in tree.children(node.id):
            walk(child, depth + 1)

    walk(tree.root, 0)
    return {"lines": lines, "more": more, "dropped": dropped, "chosen": tree.chosen, "retime": list(tree.retime)}


def kernel_view(sources: dict[str, str], base: dict[str, str] | None, langs: dict[str, str],
                flags: list[str] | None = None, base_flags: list[str] | None = None) -> dict[str, Any]:
    """A kernel as the planner sees it: the unified diff from ``base`` (its parent's sources) when that is at
    most DIFF_SHARE of the kernel's size, else the whole sources (see `code_blocks`).

    Returns:
        {"diff": [{"name", "body", "fence"}] or None, "blocks": code blocks or None, "flags": "-O3 ..." or ""}
        (exactly one of diff and blocks is set).
    """
    import difflib

    flag_note = ""
    if flags is not None and base is not None and list(flags) != list(base_flags or []):
        flag_note = f"compile flags {' '.join(base_flags or []) or '(none)'} -> {' '.join(flags) or '(none)'}"
    elif flags:
        flag_note = f"compile flags {' '.join(flags)}"
    if base is not None:
        diffs, size = [], 0
        for name in sorted(set(sources) | set(base)):
            old, new = base.get(name, ""), sources.get(name, "")
            if old == new:
                continue
            body = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                                f"parent/{name}", f"this/{name}", n=2))
            size += len(body)
            diffs.append({"name": name, "body": body.rstrip("\n"), "fence": _fence(body)})
        total = sum(len(v) for v in sources.values()) or 1
        if not diffs:
            return {"diff": [], "blocks": None, "flags": flag_note}
        if size <= DIFF_SHARE * total:
            return {"diff": diffs, "blocks": None, "flags": flag_note}
    return {"diff": None, "blocks": code_blocks(sources, None, langs), "flags": flag_note}


def _fence(body: str) -> str:
    """A fence longer than any run of backticks in ``body`` (the body cannot close it)."""
    longest = max((len(run) for run in re.findall(r"`{3,}", body)), default=0)
    return "`" * max(3, longest + 1)


def code_blocks(sources: dict[str, str], launch: dict | None, langs: dict[str, str],
                flags: list[str] | None = None) -> list[dict[str, str]]:
    """Sources (and a launch plan, and compile flags) as fenced blocks for a prompt: lang (by suffix from
    ``langs``, the target's `Target.fence_langs`), name, body, fence."""
    import yaml

    out = []
    for name in sorted(sources):
        body = sources[name]
        lang = langs.get(name[name.rfind("."):], "")
        out.append({"lang": lang, "name": name, "body": body.rstrip("\n"), "fence": _fence(body)})
    if launch:
        body = yaml.safe_dump(launch, sort_keys=False, default_flow_style=None).rstrip("\n")
        out.append({"lang": "yaml", "name": "launch plan", "body": body, "fence": "```"})
    if flags:
        out.append({"lang": "flags", "name": "compile flags", "body": " ".join(flags), "fence": "```"})
    return out


def tree_view(tree: Tree, node_id: str | None, state: SearchState | None = None,
              strategy: StrategyConfig | None = None) -> dict[str, Any]:
    """The world-model view: the root's analysis, the active path root -> ``node_id`` (the root alone when
    None), the live competing siblings of every node on it (the other answers to its decision), and the frontier (open actions whose parent holds a
    passing kernel) by rating, those in their failure cooldown marked."""
    path = tree.path(node_id) if node_id else [tree.root]
    siblings = []
    for n in path[1:]:
        # competing: the other answers to the same decision (a sibling answering another decision is no alternative)
        others = [node_line(tree, s) for s in tree.siblings(n.id, live=True) if s.decision == n.decision]
        if others:
            siblings.append({"of": n.id, "decision": n.decision, "nodes": others})
    frontier = []
    open_now = sorted(tree.frontier(), key=lambda n: (-n.rating, n.difficulty))
    for n in open_now[:FRONTIER_LINES]:
        line = node_line(tree, n)
        line["cooling"] = bool(state is not None and cooling(n, tree, state, strategy or StrategyConfig()))
        frontier.append(line)
    counts: dict[str, int] = {}
    for n in tree:
        counts[n.status.value] = counts.get(n.status.value, 0) + 1
    best = tree.best()
    return {
        "analysis": tree.root.payload.get("analysis"),
        "path": [node_line(tree, n) for n in path],
        "siblings": siblings,
        "frontier": frontier,
        "frontier_more": max(0, len(open_now) - FRONTIER_LINES),
        "counts": ", ".join(f"{v} {k}" for k, v in counts.items()),
        "best": node_line(tree, best) if best is not None else None,
    }


def passing_leaves(tree: Tree) -> list[dict[str, Any]]:
    """Passing nodes (solved or regressed, root included) with no open child: where new actions can go."""
    out = []
    for n in tree:
        if n.status in PASSING and not any(c.status == NodeStatus.OPEN for c in tree.children(n.id)):
            out.append(node_line(tree, n))
    return out
