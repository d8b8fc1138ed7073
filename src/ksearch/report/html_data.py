"""What the HTML report (`ksearch.report.html`) shows of a run, read from its store as plain JSON-able values.

`run_data` gathers everything one page needs: the run, one point per evaluation (its score, the seconds since the
run began, the interval of the score where the judge measured one), the best so far after each evaluation (the
world model's `Tree.best` in the snapshot written with it, per first-level branch too), the tree's nodes with a
layout, each node's details (action, kernel, diff from its parent's kernel, per-workload figures, the judge's
messages, the llm calls made for it), the roofline rows per workload and the final table.

`curve_points` is the best-so-far curve alone (for the curves of a comparison or an ablation).
"""

from __future__ import annotations

import json
import math
from datetime import datetime

from ksearch.errors import StoreError
from ksearch.records import Candidate, Evaluation, FinalReport
from ksearch.report.kernels import candidate_diff, source_text
from ksearch.search.worldmodel import ROOT_ID, NodeStatus, Tree
from ksearch.store.db import Store

#: characters of one prompt message or reply kept in the page (the store keeps them whole)
MAX_MESSAGE_CHARS = 20000


def _seconds(since: str, at: str) -> float | None:
    try:
        return (datetime.fromisoformat(at) - datetime.fromisoformat(since)).total_seconds()
    except (TypeError, ValueError):
        return None


def score_interval(ev: Evaluation | None) -> tuple[float, float] | None:
    """The range of an evaluation's score (geometric mean of its speedups over the naive kernel) that the
    interval of each timed workload's median time (``ci_ms``) spans, the naive kernel's times held fixed: (low,
    high), or None when a timed workload has no interval (one timed repeat is no interval)."""
    rows = [r for r in (ev.workloads if ev else []) if r.speedup_vs_naive and r.median_ms]
    if not rows or any(not r.ci_ms or len(r.ci_ms) != 2 or min(r.ci_ms) <= 0 or r.repeats < 2 for r in rows):
        return None
    naive = [r.speedup_vs_naive * r.median_ms for r in rows]  # type: ignore[operator]
    lo = math.exp(sum(math.log(n / r.ci_ms[1]) for n, r in zip(naive, rows)) / len(rows))  # type: ignore[index]
    hi = math.exp(sum(math.log(n / r.ci_ms[0]) for n, r in zip(naive, rows)) / len(rows))  # type: ignore[index]
    return lo, hi


def _tree(store: Store, seq: int, tree_json: str) -> Tree:
    try:
        return Tree.model_validate_json(tree_json)
    except ValueError as e:  # pydantic's ValidationError: a damaged snapshot
        raise StoreError(f"{store.path}: the world model of snapshot {seq} does not load: {str(e)[:300]}") from None


def _steps(store: Store) -> list[tuple[int, str, str | None, str, float | None, Tree | None]]:
    """(seq, created_at, node id, status, score, the tree written with it) per evaluation, in order."""
    rows = store.db.execute("SELECT e.seq, e.created_at, e.node_id, e.status, e.score, s.tree_json FROM evaluations e "
                            "LEFT JOIN snapshots s ON s.seq = e.seq ORDER BY e.seq").fetchall()
    return [(seq, at, node, status, score, _tree(store, seq, tj) if tj else None)
            for seq, at, node, status, score, tj in rows]


def _best_after(start: str, steps: list, intervals: dict) -> list[dict]:
    out: list[dict] = []
    for seq, at, _, _, _, tree in steps:
        b = tree.best() if tree is not None else None
        prev = out[-1] if out else {"score": 1.0, "node": ROOT_ID, "interval": None}
        if b is not None and b.evaluation and b.evaluation.score:
            cur = {"score": b.evaluation.score, "node": b.id,
                   "interval": list(intervals.get(b.candidate_id or "") or []) or None}
        else:
            cur = {k: prev[k] for k in ("score", "node", "interval")}
        out.append({"seq": seq, "t_s": _seconds(start, at), **cur})
    return out


def curve_points(store: Store) -> list[dict]:
    """The best so far after each evaluation: seq, t_s (seconds since the run was created, store timestamps of
    1 s resolution), score (the world model's best, 1.0 before anything beat the naive kernel), its node (and
    ``interval``, None here: `run_data` gives it)."""
    return _best_after(store.run()["created_at"], _steps(store), {})


def _kernel(store: Store, tree: Tree, node_id: str | None) -> Candidate | None:
    """The node's kernel: its judged candidate, the naive kernel for the root, the one being judged for a node in
    flight; None for a node with none."""
    if node_id is not None and node_id in tree.in_flight and not tree[node_id].candidate_id:
        return store.candidate(tree.in_flight[node_id])
    if node_id is None or not tree[node_id].candidate_id:
        return None
    if node_id == ROOT_ID:
        naive = (store.baseline("naive") or {}).get("candidate")
        return Candidate.model_validate(naive) if naive else store.candidate(tree[node_id].candidate_id or "")
    return store.candidate(tree[node_id].candidate_id or "")


def _evaluation(store: Store, tree: Tree, node_id: str, latest: dict[str, Evaluation]) -> Evaluation | None:
    """The node's evaluation: the naive kernel's for the root, else its candidate's latest in ``latest``
    (candidate id -> the evaluation of the highest seq: `Store.evaluation_of`, read once for all nodes)."""
    cid = tree[node_id].candidate_id
    if node_id == ROOT_ID:
        naive = (store.baseline("naive") or {}).get("evaluation")
        return Evaluation.model_validate(naive) if naive else None
    return latest.get(cid) if cid else None


def _fmt(x: float | None, fmt: str = ".4g") -> str | None:
    return None if x is None else format(x, fmt)


def _workloads(ev: Evaluation | None) -> list[dict]:
    """Per workload: status, times (median, its interval, spread), the floor and % of it, the speedup, the
    accuracy (worst errors and the share of the tolerance they used) and the paired comparisons."""
    rows = []
    for r in ev.workloads if ev else []:
        paired = [f"vs {p.role}: " + (f"{p.ratio:.3g}x" + (f" [{p.lo:.3g}, {p.hi:.3g}]" if p.lo and p.hi else "")
                                      + f" {p.verdict or 'no interval'} ({p.n} rounds)" if p.ratio else p.note)
                  for p in r.paired]
        rows.append({"workload": r.workload, "status": r.status.value, "median_ms": _fmt(r.median_ms),
                     "ci_ms": f"[{r.ci_ms[0]:.4g}, {r.ci_ms[1]:.4g}]" if r.ci_ms and r.repeats >= 2 else None,
                     "spread": None if r.spread is None or r.repeats < 2 else f"±{100 * r.spread:.1f}%",
                     "repeats": r.repeats,
                     "floor_ms": _fmt(r.floor_ms), "bound": r.bound, "pct_of_floor": _fmt(r.pct_of_floor, ".3g"),
                     "speedup_vs_naive": _fmt(r.speedup_vs_naive, ".3g"), "max_abs_err": _fmt(r.max_abs_err, ".2e"),
                     "max_rel_err": _fmt(r.max_rel_err, ".2e"),
                     "tolerance_used": None if r.tolerance_used is None else f"{100 * r.tolerance_used:.3g}%",
                     "checks": r.checks, "paired": paired, "message": r.message[:2000]})
    return rows


def _call(c) -> dict:
    from ksearch.report.llm import call_status

    return {"role": c.role, "purpose": c.purpose, "model": c.model, "status": call_status(c),
            "input_tokens": c.usage.input_tokens, "output_tokens": c.usage.output_tokens,
            "estimated": c.usage_estimated, "cost_usd": c.cost_usd, "latency_s": round(c.latency_s, 2),
            "messages": [{"role": m.role, "content": m.content[:MAX_MESSAGE_CHARS]} for m in c.messages],
            "reply": (c.reply or "")[:MAX_MESSAGE_CHARS], "error": c.error}


def _history(edits: list[dict]) -> dict[str, list[dict]]:
    """Node id -> the tree edits that name it (inserted, updated, split, dropped, sent to be judged; rejected ones
    with the reason), oldest first: after which evaluation, by whom, accepted, what."""
    out: dict[str, list[dict]] = {}
    for e in edits:
        body = e["edit"] if isinstance(e["edit"], dict) else {}
        text = e["reason"] or (f"sent to be judged (candidate {body.get('candidate')})" if "dispatch" in body
                               else json.dumps(body)[:300])
        for key in ("id", "node_id", "dispatch", "parent_id"):
            nid = body.get(key)
            if isinstance(nid, str) and (key != "parent_id" or not e["accepted"]):
                out.setdefault(nid, []).append({"seq": e["seq"], "source": e["source"], "accepted": e["accepted"],
                                                "text": text[:500]})
                break
    return out


def _details(store: Store, tree: Tree, calls: list, reasons: dict[str, str],
             latest: dict[str, Evaluation]) -> dict[str, dict]:
    out = {}
    history = _history(store.edit_log())
    for n in tree:
        ev = _evaluation(store, tree, n.id, latest)
        mine, theirs = _kernel(store, tree, n.id), _kernel(store, tree, n.parent_id)
        diff = None
        if mine is not None and n.parent_id is not None:
            diff = candidate_diff(theirs, mine, n.parent_id, n.id) or f"{n.id} builds the same kernel as its parent"
        iv = score_interval(ev)
        mine_calls = [c for c in calls if c.node_id == n.id or (n.id == ROOT_ID and c.node_id is None)]
        out[n.id] = {
            "id": n.id, "parent": n.parent_id, "decision": n.decision, "choice": n.choice, "status": n.status.value,
            "rating": n.rating, "confidence": n.confidence, "attempts": n.attempts, "in_flight": n.id in tree.in_flight,
            "impacts": n.impacts.model_dump(), "action": n.action.model_dump() if n.action else None,
            "score": n.evaluation.score if n.evaluation else None,
            "interval": [round(iv[0], 4), round(iv[1], 4)] if iv else None,
            "vs_parent": n.evaluation.vs_parent if n.evaluation else None,
            "vs_best": n.evaluation.vs_best if n.evaluation else None,
            "chosen_because": reasons.get(n.id),
            "kernel": source_text(mine) if mine else None, "diff": diff,
            "evaluation": None if ev is None else {
                "status": ev.status.value, "message": ev.message[:4000], "compile_log": ev.compile_log[-4000:],
                "wall_s": ev.wall_s, "load_s": ev.load_s, "infra_faults": ev.infra_faults},
            "workloads": _workloads(ev), "llm_calls": [_call(c) for c in mine_calls],
            "history": history.get(n.id, [])[-60:]}
    return out


def layout(tree: Tree) -> dict[str, tuple[float, float]]:
    """Node id -> (x, y) for drawing the tree top-down: leaves side by side in depth-first order, a parent centred
    over its children, y = -depth."""
    pos: dict[str, tuple[float, float]] = {}
    nxt = [0.0]

    def place(nid: str, depth: int) -> float:
        kids = tree.children(nid)
        if not kids:
            x = nxt[0]
            nxt[0] += 1.0
        else:
            xs = [place(k.id, depth + 1) for k in kids]
            x = (xs[0] + xs[-1]) / 2
        pos[nid] = (x, -float(depth))
        return x

    place(ROOT_ID, 0)
    return pos


def _hardware(hw: dict | None) -> str | None:
    if not hw:
        return None
    peak = (hw.get("peak_flops") or {}).get("float32")
    parts = [f"{hw.get('name')} ({hw.get('model') or hw.get('kind')})",
             f"memory {hw.get('memory_bandwidth_gbs'):.4g} GB/s" if hw.get("memory_bandwidth_gbs") else None,
             f"FP32 {peak / 1e9:.4g} GFLOP/s" if peak else None,
             f"exp {hw['exp_rate_per_s'] / 1e9:.3g} G/s" if hw.get("exp_rate_per_s") else None,
             f"source: {hw.get('source')}" if hw.get("source") else None]
    return " · ".join(p for p in parts if p)


def _roofline(store: Store, tree: Tree, report: FinalReport | None, latest: dict[str, Evaluation]) -> list[dict]:
    """Per workload: its floor and what bounds it, and the kernels' times against it (the final side-by-side
    measurement when the run finished, else the naive kernel's and the best kernel's evaluations so far)."""
    if report is not None and report.workloads:
        return [{"workload": w.name, "floor_ms": w.floor_ms, "bound": w.bound, "source": "final measurement",
                 "kernels": [k for k in ({"name": "naive", "ms": w.naive_ms},
                                         {"name": "best", "ms": w.best_ms},
                                         {"name": report.reference_baseline, "ms": w.reference_ms}) if k["ms"]]}
                for w in report.workloads]
    naive, best = _evaluation(store, tree, ROOT_ID, latest), tree.best()
    best_ev = _evaluation(store, tree, best.id, latest) if best is not None and best.id != ROOT_ID else None
    rows: dict[str, dict] = {}
    for name, ev in (("naive", naive), ("best so far", best_ev)):
        for r in ev.workloads if ev else []:
            if r.median_ms:
                row = rows.setdefault(r.workload, {"workload": r.workload, "floor_ms": r.floor_ms, "bound": r.bound,
                                                   "source": "in-search evaluations", "kernels": []})
                row["kernels"].append({"name": name, "ms": r.median_ms})
    return list(rows.values())


def _final(report: FinalReport | None) -> dict | None:
    if report is None:
        return None
    rows = []
    for w in report.workloads:
        iv = w.speedup_vs_naive_interval
        rows.append([w.name, _fmt(w.naive_ms), (_fmt(w.best_ms) or "—") + (
            f" ±{100 * w.best_spread:.0f}%" if w.best_spread is not None else ""), _fmt(w.reference_ms),
            (f"{w.speedup_vs_naive:.2f}x" + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else ""))
            if w.speedup_vs_naive else None,
            f"{w.speedup_vs_reference:.2f}x" if w.speedup_vs_reference else None, _fmt(w.pct_of_floor, ".3g"),
            f"{w.floor_ms:.3g} ({w.bound})" if w.floor_ms is not None else None])
    notes = []
    if report.best_status is not None and report.best_status.value != "PASSED":
        notes.append(f"the best kernel FAILED its final check ({report.best_status.value}): {report.best_message}")
    if report.hidden_workloads is not None:
        h = report.hidden_workloads
        notes.append(f"hidden workloads: {h.status.value}" + (f" ({len(h.axes)} drawn with a secret seed)"
                                                              if h.axes else "") + (f": {h.message}" if h.message
                                                                                    else ""))
    notes += report.reference_notes
    if report.reproduce:
        notes.append(f"judge the best kernel again: {report.reproduce}")
    return {"reference": report.reference_baseline, "rows": [[c if c is not None else "—" for c in r] for r in rows],
            "notes": notes, "best_node": report.best_node_id}


def run_data(store: Store) -> dict:
    """Everything the run's page shows (see the module docstring). Raises StoreError for a store that cannot be
    read."""
    from ksearch.report.llm import llm_totals

    info = store.run()
    cfg = info["config"]
    steps = _steps(store)
    snap = store.latest_snapshot()
    tree = _tree(store, snap[0], snap[1]) if snap is not None else None
    evals = {seq: ev for seq, _, ev in store.evaluations()}
    points, branches = [], {}  # type: ignore[var-annotated]
    latest = {ev.candidate_id: ev for ev in evals.values()}  # a re-timed candidate: its last round
    intervals = {cid: score_interval(ev) for cid, ev in latest.items()}
    best = _best_after(info["created_at"], steps, intervals)
    for seq, at, node, status, score, snapshot in steps:
        ev = evals.get(seq)
        t_s = _seconds(info["created_at"], at)
        iv = intervals.get(ev.candidate_id) if ev else None
        points.append({"seq": seq, "t_s": t_s, "node": node, "status": status, "score": score,
                       "interval": list(iv) if iv and score else None,
                       "message": (ev.message.splitlines() or [""])[0][:200] if ev else ""})
        for n in snapshot or []:
            if n.status == NodeStatus.SOLVED and n.id != ROOT_ID and n.evaluation and n.evaluation.score:
                br = snapshot.branch_of(n.id)  # type: ignore[union-attr]
                line = branches.setdefault(br, {})
                line[seq] = max(line.get(seq, 0.0), n.evaluation.score)
    branch_lines = {}
    for br, by_seq in branches.items():
        name = tree[br].label if tree is not None and br in tree else br
        branch_lines[f"{br} {name}"] = [{"seq": p["seq"], "t_s": p["t_s"], "score": by_seq[p["seq"]]}
                                       for p in best if p["seq"] in by_seq]
    report = store.report()
    calls = store.llm_calls()
    nodes, details = [], {}
    if tree is not None:
        pos = layout(tree)
        top = tree.best()
        for n in tree:
            nodes.append({"id": n.id, "x": pos[n.id][0], "y": pos[n.id][1], "parent": n.parent_id,
                          "status": n.status.value, "label": n.label, "rating": n.rating,
                          "confidence": n.confidence, "best": top is not None and n.id == top.id,
                          "in_flight": n.id in tree.in_flight,
                          "score": n.evaluation.score if n.evaluation else None})
        reasons = {d["node_id"]: d.get("reason", "") for d in store.decisions() if d.get("node_id")}
        details = _details(store, tree, calls, reasons, latest)
    from ksearch.store.runs import current_status

    status = current_status(store.path.parent, info["status"])  # a killed run is stopped, as `runs list` says
    return {"run": {"id": info["id"], "task": info["task"], "target": info["target"], "status": status,
                    "created_at": info["created_at"], "updated_at": info["updated_at"],
                    "budget": cfg.get("budget"), "proposer": cfg.get("proposer"),
                    "strategy": (cfg.get("strategy") or {}).get("kind") if isinstance(cfg.get("strategy"), dict)
                    else cfg.get("strategy"), "hardware": _hardware(info.get("hardware"))},
            "evaluations": points, "best": best, "branches": branch_lines, "nodes": nodes, "details": details,
            "roofline": _roofline(store, tree, report, latest) if tree is not None else [], "final": _final(report),
            "llm": llm_totals(calls) if calls else None}
