"""``ksearch report``: a run (or a comparison's or an ablation's runs) as ONE self-contained HTML file.

The page needs no network: plotly.js (from the ``plotly`` package) and the page's own script and styles are
inlined; the figures are Plotly figures built here, the page a Jinja2 template (``templates/*.html.j2``); the
run's data (`ksearch.report.html_data.run_data`) travels in the page as JSON and the page's script fills the node
panel from it with text nodes only (a kernel or a reply holding markup is shown as written, never run).

A run's page: the best-so-far curve against evaluations and against wall time (each evaluation's score with the
interval its median times span, per first-level branch), the world model's tree (click a node: its action, kernel,
diff from its parent's kernel, per-workload figures, the judge's messages, its llm calls), a roofline view per
workload and the final table. A group's page (`render_group`): the runs' best-so-far curves side by side.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ksearch.errors import ReportError, StoreError
from ksearch.report.html_data import curve_points, run_data
from ksearch.store.db import Store

if TYPE_CHECKING:
    from ksearch.run.ablate_results import AblationResult

TEMPLATES = Path(__file__).parent / "templates"

#: node colours by status (the terminal tree's: green solved, yellow regressed, red failed, grey open / dropped)
STATUS_COLOURS = {"solved": "#2ca02c", "regressed": "#e6a700", "failed": "#d62728", "open": "#9e9e9e",
                  "dropped": "#dddddd"}
SCORE_AXIS = "x naive (geomean, in-run)"


def _go():
    import plotly.graph_objects as go

    return go


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(value: Any) -> str:
    """JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` that could close it."""
    text = json.dumps(_finite(value), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _plain(text: str) -> str:
    """Text from a run (a planner's choice, a judge's message) for a Plotly label, which reads a few HTML tags
    (``<b>``, ``<a href>``, ``<br>``): shown as written, never as markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _error(points: list[dict], key: str = "score") -> dict | None:
    """Plotly error bars from each point's ``interval`` ([low, high]); 0 where a point has none."""
    if not any(p.get("interval") for p in points):
        return None
    up = [(p["interval"][1] - p[key]) if p.get("interval") else 0.0 for p in points]
    down = [(p[key] - p["interval"][0]) if p.get("interval") else 0.0 for p in points]
    return {"type": "data", "symmetric": False, "array": [max(0.0, u) for u in up],
            "arrayminus": [max(0.0, d) for d in down], "thickness": 1, "width": 3}


def curve_figure(data: dict, x: str) -> Any:
    """The best so far (one point per evaluation), every evaluation's score and each branch's best, against
    ``x``: ``seq`` (evaluations) or ``t_s`` (seconds since the run was created)."""
    go = _go()
    fig = go.Figure()
    status = {n["id"]: n["status"] for n in data["nodes"]}
    best = data["best"]
    fig.add_trace(go.Scatter(
        name="best so far", x=[p[x] for p in best], y=[p["score"] for p in best], mode="lines+markers",
        line={"shape": "hv", "width": 3, "color": "#1f77b4"}, error_y=_error(best),
        customdata=[p["node"] for p in best],
        hovertemplate="after evaluation %{text}: best %{y:.3f}x (node %{customdata})<extra></extra>",
        text=[str(p["seq"]) for p in best]))
    for name, pts in data["branches"].items():
        fig.add_trace(go.Scatter(name=_plain(f"branch {name}"), x=[p[x] for p in pts], y=[p["score"] for p in pts],
                                 mode="lines", line={"shape": "hv", "dash": "dot", "width": 1.5},
                                 hovertemplate="%{y:.3f}x"))
    ok = [p for p in data["evaluations"] if p["score"]]
    fig.add_trace(go.Scatter(
        name="each evaluation", x=[p[x] for p in ok], y=[p["score"] for p in ok], mode="markers",
        marker={"size": 8, "color": [STATUS_COLOURS.get(status.get(p["node"], ""), "#555") for p in ok]},
        error_y=_error(ok), customdata=[p["node"] for p in ok], text=[str(p["seq"]) for p in ok],
        hovertemplate="evaluation %{text}, node %{customdata}: %{y:.3f}x<extra></extra>"))
    bad = [p for p in data["evaluations"] if not p["score"]]
    if bad:
        fig.add_trace(go.Scatter(
            name="failed (drawn at 1x)", x=[p[x] for p in bad], y=[1.0] * len(bad), mode="markers",
            marker={"symbol": "x", "size": 9, "color": STATUS_COLOURS["failed"]},
            customdata=[p["node"] for p in bad], text=[_plain(f"{p['seq']}: {p['status']} {p['message']}") for p in bad],
            hovertemplate="evaluation %{text} (node %{customdata})<extra></extra>"))
    fig.update_layout(xaxis_title="evaluation" if x == "seq" else "seconds since the run started",
                      yaxis_title=SCORE_AXIS, margin={"l": 60, "r": 10, "t": 30, "b": 50}, height=380,
                      legend={"orientation": "h", "y": -0.25}, hovermode="closest")
    return fig


#: leaves above which the tree is drawn left to right (one row a leaf, the page scrolling down) instead of top down
WIDE_TREE = 24


def tree_figure(data: dict) -> Any:
    """The world model: one marker per node (coloured by status, sized by speedup, the best a star), labelled
    with id, speedup, rating and confidence; edges from each node to its parent. Top down; left to right (a row
    per leaf) for a tree of more than `WIDE_TREE` leaves."""
    go = _go()
    nodes = data["nodes"]
    at = {n["id"]: n for n in nodes}
    depth = -min((n["y"] for n in nodes), default=0)
    leaves = max((n["x"] for n in nodes), default=0) + 1
    wide = leaves > WIDE_TREE
    px = (lambda n: -n["y"]) if wide else (lambda n: n["x"])
    py = (lambda n: -n["x"]) if wide else (lambda n: n["y"])
    ex: list[float | None] = []
    ey: list[float | None] = []
    for n in nodes:
        if n["parent"]:
            p = at[n["parent"]]
            ex += [px(p), px(n), None]
            ey += [py(p), py(n), None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#bbbbbb", "width": 1}, hoverinfo="skip",
                             showlegend=False))

    def text(n: dict) -> str:
        score = f" {n['score']:.2f}x" if n["score"] else ""
        return f"{n['id']}{score}{' ' if wide else '<br>'}r{n['rating']:.1f} c{n['confidence']:.2f}"

    fig.add_trace(go.Scatter(
        name="nodes", x=[px(n) for n in nodes], y=[py(n) for n in nodes], mode="markers+text",
        text=[text(n) for n in nodes], textposition="middle right" if wide else "bottom center",
        textfont={"size": 9 if wide else 10}, customdata=[n["id"] for n in nodes],
        hovertext=[_plain(f"{n['id']} {n['label']}: {n['status']}") + (" (in flight)" if n["in_flight"] else "") +
                   (f", {n['score']:.3f}x" if n["score"] else "") +
                   f"<br>rating {n['rating']:.2f}, confidence {n['confidence']:.2f}" for n in nodes],
        hoverinfo="text", showlegend=False,
        marker={"color": [STATUS_COLOURS.get(n["status"], "#555") for n in nodes],
                "symbol": ["star" if n["best"] else "circle" for n in nodes],
                "size": [(10 if wide else 14) + (6 if wide else 12) * min(2.0, max(0.0, math.log2(n["score"])))
                         if n["score"] else (8 if wide else 11) for n in nodes],
                "line": {"width": [2 if n["best"] else 1 for n in nodes], "color": "#333"}}))
    for status, colour in STATUS_COLOURS.items():  # the legend: one entry per status
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=status, marker={"color": colour,
                                                                                          "size": 10}))
    if wide:
        fig.update_layout(height=int(90 + 22 * leaves), xaxis={"visible": False, "range": [-0.3, depth + 1.2]},
                          yaxis={"visible": False, "range": [-leaves + 0.4, 0.6]})
    else:
        if leaves > 11:  # room for the labels (the box scrolls) instead of overlapping them
            fig.update_layout(width=int(80 * (leaves + 0.4)))
        fig.update_layout(height=int(max(360, 160 + 95 * depth)),
                          xaxis={"visible": False, "range": [-0.7, leaves - 0.3]},
                          yaxis={"visible": False, "range": [-depth - 0.6, 0.4]})
    fig.update_layout(margin={"l": 10, "r": 10, "t": 10, "b": 10}, legend={"orientation": "h", "y": 1.02,
                                                                           "yanchor": "bottom"},
                      hovermode="closest", clickmode="event", dragmode="pan", plot_bgcolor="white")
    return fig


def roofline_figure(row: dict) -> Any:
    """One workload: the kernels' median times against its roofline floor (log scale), % of the floor on each."""
    go = _go()
    floor = row["floor_ms"]
    names = ([f"floor ({row['bound']}-bound)"] if floor else []) + [k["name"] for k in row["kernels"]]
    times = ([floor] if floor else []) + [k["ms"] for k in row["kernels"]]
    labels = [f"{t:.4g} ms" + (f" · {100 * floor / t:.3g}% of floor" if floor and i else "")
              for i, t in enumerate(times)] if floor else [f"{t:.4g} ms" for t in times]
    colours = (["#7f7f7f"] if floor else []) + ["#1f77b4"] * len(row["kernels"])
    fig = go.Figure(go.Bar(x=times, y=names, orientation="h", text=labels, textposition="auto",
                           marker={"color": colours}, hovertemplate="%{y}: %{x:.4g} ms<extra></extra>"))
    fig.update_layout(title={"text": f"{row['workload']} ({row['source']})", "font": {"size": 13}},
                      xaxis={"type": "log", "title": "median time, ms (log)"}, height=120 + 32 * len(names),
                      margin={"l": 150, "r": 10, "t": 35, "b": 45})
    return fig


@functools.cache
def _env():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              undefined=jinja2.StrictUndefined)


@functools.cache
def _plotlyjs() -> str:
    """plotly.js (some 4.6 MB, read from the package once: `--live` re-renders the page on every change)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _damaged(store: Store, e: sqlite3.DatabaseError) -> StoreError:
    detail = str(e).strip().splitlines()[0].split(" with text ")[0][:200] if str(e).strip() else type(e).__name__
    return StoreError(f"{store.path} cannot be drawn: it does not read ({detail}); `ksearch runs check "
                      f"{store.path.parent} --repair` rebuilds it from what is intact")


def render_run(store: Store, live_s: float | None = None) -> str:
    """The run's page as HTML text. ``live_s``: the page reloads itself every ``live_s`` seconds (``--live``).
    Raises StoreError for a store that cannot be read."""
    try:
        data = run_data(store)
    except ValueError as e:  # a stored record that does not validate (pydantic's ValidationError is a ValueError)
        raise StoreError(f"{store.path} cannot be drawn: a record does not load: {str(e).strip()[:300]}") from None
    except sqlite3.DatabaseError as e:  # damaged pages, text that is not UTF-8: the store's own reads say so too
        raise _damaged(store, e) from None
    figures = {"curve-evals": curve_figure(data, "seq"), "curve-time": curve_figure(data, "t_s")}
    if data["nodes"]:
        figures["tree"] = tree_figure(data)
    for i, row in enumerate(data["roofline"]):
        figures[f"roofline-{i}"] = roofline_figure(row)
    page_data = {"details": data["details"], "nodes": [n["id"] for n in data["nodes"]],
                 "evaluations": len(data["evaluations"])}
    return _env().get_template("run.html.j2").render(
        d=data, live_s=live_s, plotlyjs=_plotlyjs(), data_json=_json(page_data),
        figures_json=_json({k: json.loads(f.to_json()) for k, f in figures.items()}),
        roofline_ids=[f"roofline-{i}" for i in range(len(data["roofline"]))])


def group_figure(curves: dict[str, list[dict]], groups: dict[str, str],
                 bands: dict[str, tuple[list[float], list[float], list[float]]] | None = None) -> Any:
    """Runs' best-so-far curves side by side: against evaluations (left) and wall time (right); runs of one
    group (a strategy, a context level) share a colour. ``bands``: group -> (median, min, max) after each
    evaluation over its runs (a comparison's `StrategySummary` curves), drawn on the left as a thick median line
    over a shaded min-max band."""
    from plotly.subplots import make_subplots

    go = _go()
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    colour = {g: palette[i % len(palette)] for i, g in enumerate(dict.fromkeys(groups.values()))}
    fig = make_subplots(rows=1, cols=2, subplot_titles=("against evaluations", "against wall time"),
                        horizontal_spacing=0.08)
    for g, (med, lo, hi) in (bands or {}).items():
        xs = list(range(1, len(med) + 1))
        c = colour.setdefault(g, palette[len(colour) % len(palette)])
        for name, ys, fill in ((f"{g} min", lo, "none"), (f"{g} min-max", hi, "tonexty")):
            fig.add_trace(go.Scatter(x=xs, y=ys, fill=fill, mode="lines",
                                     fillcolor=f"rgba({int(c[1:3], 16)}, {int(c[3:5], 16)}, {int(c[5:7], 16)}, 0.2)",
                                     line={"width": 0, "shape": "hv"}, hoverinfo="skip", legendgroup=g,
                                     showlegend=False, name=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=med, name=f"{g} median", legendgroup=g, mode="lines", opacity=0.6,
                                 line={"shape": "hv", "color": c, "width": 4}, hovertemplate="median %{y:.3f}x"),
                      row=1, col=1)
    for label, pts in curves.items():
        g = groups.get(label, label)
        for col, x in ((1, "seq"), (2, "t_s")):
            fig.add_trace(go.Scatter(name=label, legendgroup=g, showlegend=col == 1, x=[p[x] for p in pts],
                                     y=[p["score"] for p in pts], mode="lines+markers",
                                     line={"shape": "hv", "color": colour[g]}, marker={"size": 4},
                                     hovertemplate="%{y:.3f}x at %{x}"), row=1, col=col)
    fig.update_xaxes(title_text="evaluation", row=1, col=1)
    fig.update_xaxes(title_text="seconds since the run started", row=1, col=2)
    fig.update_yaxes(title_text="best so far (x naive, in-run)", row=1, col=1)
    fig.update_layout(height=460, margin={"l": 60, "r": 10, "t": 40, "b": 50}, hovermode="closest")
    return fig


def render_group(title: str, runs: list[tuple[str, str, str]], result: AblationResult | None = None,
                 notes: list[str] | None = None,
                 bands: dict[str, tuple[list[float], list[float], list[float]]] | None = None) -> str:
    """A comparison's or an ablation's page: ``runs`` as (label, group, run id) (runs never started left out),
    the curves side by side (with ``bands``: see `group_figure`) and, where ``result`` holds them, the re-timed
    results table. Raises StoreError for a run whose store cannot be read."""
    from ksearch.report.ablation import COLUMNS, cells
    from ksearch.store.runs import open_run

    curves, groups = {}, {}
    for label, group, run_id in runs:
        store = open_run(run_id, readonly=True)
        try:
            curves[label] = curve_points(store)
        except sqlite3.DatabaseError as e:
            raise _damaged(store, e) from None
        finally:
            store.close()
        groups[label] = group
    headers = [h.format(reference=(result.reference_name if result else None) or "reference") for h, _, _ in COLUMNS]
    table = [cells(r) for r in result.rows] if result is not None else []
    figs = {"curves": group_figure(curves, groups, bands)}
    return _env().get_template("group.html.j2").render(
        title=title, runs=runs, headers=headers, table=table, notes=notes or [], plotlyjs=_plotlyjs(),
        figures_json=_json({k: json.loads(f.to_json()) for k, f in figs.items()}),
        data_json=_json({"runs": {label: len(c) for label, c in curves.items()}}))


def write_html(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all (a temporary file renamed over it: a page reloading while
    it is re-written never reads half a file)."""
    path = Path(path)
    if path.exists() and not path.is_file():  # renamed over, a directory breaks and a device or FIFO is replaced
        what = "a directory" if path.is_dir() else "not a regular file"
        raise ReportError(f"{path} is {what}: the report is written to a file (-o FILE.html)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a failed write names no file: "No space left on device"
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    return path
