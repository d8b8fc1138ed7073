"""OpenEvolve itself beside ksearch (issue 22): a run of OpenEvolve (the PyPI package ``openevolve``) on a ksearch
task with a given number of iterations (one program judged per iteration: the budget), its evaluator calling
ksearch's judge, its model reached through a local OpenAI-compatible server that hands every chat completion to a
ksearch queue directory: the same files `ksearch run --backend queue` writes, answered the same way (docs/llm.md)
by an agent, a person or a script. Bench tooling, not the product.

    pip install openevolve==0.4.1
    python bench/openevolve_peer.py selective-scan --iterations 12 --queue-dir /work/oe-queue --model NAME \\
        -w tiny,odd,long-state,extreme-dt,mamba370m-L512 [--runs RUN_ID,...] [--out bench/results/NAME]
    python bench/openevolve_peer.py --respond-scripted DIR   (a stand-in answerer: plumbing only, no model)
    python bench/openevolve_peer.py --retime-from WORK --runs RUN_ID,... --sessions 3 [--out ...]
        (no evolution: OpenEvolve's best from an earlier run's working directory and the runs' bests re-timed
        again, in SESSIONS judge sessions one after another: on a quiet machine, with the spread of the sessions)

OpenEvolve's settings are its defaults (islands, MAP-Elites archive, diff-based evolution with SEARCH/REPLACE
blocks, its prompt templates) except: one evaluation at a time (``evaluator.parallel_evaluations 1``, as a ksearch
run with one worker), no cascade (one evaluation = one judgment), ``language c``, the seed, and the model. Its
evaluator judges a program as ksearch judges a candidate (static checks, the compile jail, the sandboxed worker,
checks on fresh inputs, paired timing) beside the naive kernel, and returns ``combined_score``: the geometric-mean
speedup over the naive kernel on the timed workloads (0 when it failed). Each judgment is also logged
(``judged.jsonl``: the best-so-far curve).

At the end, OpenEvolve's best program and the best kernels of the ksearch runs named by ``--runs`` are re-timed
beside the naive kernel in one judge session (a fresh seed, the same inputs for all) and written as a table
(``<out>.md``, ``<out>.json``) with OpenEvolve's version and settings, the machine and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent

EVALUATOR = '''"""OpenEvolve's evaluator for a ksearch task: written by bench/openevolve_peer.py."""
import json, math, os, time
from pathlib import Path

SETUP = json.loads(Path(__file__).with_name("setup.json").read_text())
_judge = None
_naive = None


def _get():
    global _judge, _naive
    if _judge is None:
        from ksearch.eval.evaluator import EvalConfig, Evaluator
        from ksearch.hardware.spec import HardwareSpec
        from ksearch.run.controller import Controller, RunConfig
        from ksearch.tasks import load_task
        cfg = RunConfig.model_validate(SETUP["run"])
        hw = HardwareSpec.model_validate(SETUP["hardware"]) if SETUP.get("hardware") else None
        ecfg = Controller.eval_config(cfg)
        ecfg.profile = False
        task = load_task(cfg.task)
        _judge = Evaluator(task, cfg.target, hw, ecfg)
        _naive = _judge.naive_candidate()
        _judge.measure_naive(task.select(cfg.workloads))
    return _judge, _naive


def evaluate(program_path):
    from ksearch.eval.timing import Reference
    from ksearch.records import Candidate
    from ksearch.run.controller import score_of
    judge, naive = _get()
    t0 = time.monotonic()
    source = Path(program_path).read_text()
    cand = Candidate(target=SETUP["run"]["target"], sources={SETUP["file"]: source},
                     compile_flags=SETUP.get("flags", []))
    ev = judge.evaluate(cand, SETUP["run"].get("workloads"), SETUP["timing"], references=[Reference("naive", naive)])
    score = score_of(ev) or 0.0
    with open(Path(__file__).with_name("judged.jsonl"), "a") as f:
        f.write(json.dumps({"candidate_id": cand.id, "status": ev.status.value, "score": score,
                            "wall_s": round(time.monotonic() - t0, 2), "message": (ev.message or "")[:300]}) + "\\n")
    metrics = {"combined_score": score, "correct": 1.0 if ev.status.value == "PASSED" else 0.0}
    try:
        from openevolve.evaluation_result import EvaluationResult
        return EvaluationResult(metrics=metrics, artifacts={"judge": f"{ev.status.value}: {(ev.message or '')[:1500]}"})
    except ImportError:
        return metrics
'''


# -- the local OpenAI-compatible server in front of the queue ------------------------------------------------------


def serve(queue_dir: Path, port: int, timeout_s: float) -> ThreadingHTTPServer:
    """A chat-completions endpoint on 127.0.0.1:``port`` whose answers come from ``queue_dir`` (ksearch's queue
    backend: a prompt file per call, a reply file per answer); one call at a time."""
    from ksearch.llm.backends import QueueBackend, call_purpose
    from ksearch.llm.base import Message

    queue = QueueBackend(queue_dir)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _send(self, code: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(200, {"object": "list", "data": [{"id": "queue", "object": "model"}]})

        def do_POST(self):
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            msgs = []
            for m in req.get("messages", []):
                content = m.get("content")
                if isinstance(content, list):  # content parts
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                msgs.append(Message(role=m.get("role", "user") if m.get("role") in ("system", "user", "assistant")
                                    else "user", content=content or ""))
            token = call_purpose.set("openevolve")
            try:
                with lock:
                    reply = queue.complete(msgs, model=req.get("model", "queue"),
                                           max_tokens=int(req.get("max_tokens") or 4096),
                                           temperature=float(req.get("temperature") or 0.0), timeout_s=timeout_s)
            except Exception as e:  # the client retries on 5xx
                self._send(503, {"error": {"message": f"{type(e).__name__}: {e}"}})
                return
            finally:
                call_purpose.reset(token)
            self._send(200, {"id": f"q-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
                             "model": req.get("model", "queue"),
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": reply.text}}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def respond_scripted(queue_dir: Path, stop_after_s: float = 3600) -> None:
    """A stand-in answerer for the plumbing: every prompt gets a SEARCH/REPLACE block that adds a comment above
    the kernel's entry point (a new program each time, the same kernel). Not a model."""
    deadline = time.monotonic() + stop_after_s
    n = 0
    while time.monotonic() < deadline:
        for prompt in sorted(queue_dir.glob("*.prompt.md")):
            reply = prompt.with_name(prompt.name.replace(".prompt.md", ".reply.md"))
            if reply.exists():
                continue
            n += 1
            line = next((x for x in prompt.read_text().splitlines() if x.startswith("void run(")), "void run(")
            text = (f"Adding a note.\n\n<<<<<<< SEARCH\n{line}\n=======\n/* note {n} */\n{line}\n"
                    ">>>>>>> REPLACE\n")
            tmp = reply.with_name("." + reply.name)
            tmp.write_text(text)
            tmp.replace(reply)
        time.sleep(0.3)


# -- the run -------------------------------------------------------------------------------------------------------


def retime(run, hardware, programs: dict[str, object], progress=print) -> tuple[list[dict], list[str]]:
    """Each labelled candidate re-timed beside the naive kernel in one judge session: rows of label, status,
    speedup (paired, geometric mean) with its interval, per-workload medians."""
    import secrets

    from ksearch.eval.evaluator import EvalConfig, Evaluator
    from ksearch.eval.timing import Reference
    from ksearch.tasks import load_task

    task = load_task(run.task)
    ev = Evaluator(task, run.target, hardware, EvalConfig(seeds=[secrets.randbits(62)], timeout_s=run.timeout_s,
                                                           timing=run.timing))
    rows = []
    try:
        selected = task.select(run.workloads)
        bench = [w for w in selected if w.purpose == "bench"] or selected
        names = [w.name or w.uuid for w in bench]
        progress("re-time: the naive kernel")
        naive = ev.measure_naive(bench)
        for label, cand in programs.items():
            progress(f"re-time: {label}")
            e = ev.evaluate(cand, names, timing=True, references=[Reference("naive", ev.naive_candidate())])
            p = next((x for x in e.paired if x.role == "naive"), None)
            rows.append({"label": label, "candidate_id": cand.id, "status": e.status.value,
                         "message": (e.message or "")[:300], "vs_naive": p.ratio if p else None,
                         "lo": p.lo if p else None, "hi": p.hi if p else None,
                         "workloads": {r.workload: r.median_ms for r in e.workloads},
                         "naive_ms": {r.workload: r.median_ms for r in naive.workloads}})
    finally:
        ev.close()
    return rows, names


def ksearch_bests(run_ids: list[str]) -> dict[str, object]:
    """The best kernel of each ksearch run, labelled ``ksearch <strategy> (<run id>)``. Raises StoreError."""
    from ksearch.run.controller import load_snapshot
    from ksearch.store.runs import open_run

    programs: dict[str, object] = {}
    for rid in run_ids:
        store = open_run(rid)
        try:
            snap = load_snapshot(store)
            node = snap[0].best() if snap else None
            cand = store.candidate(node.candidate_id) if node is not None and node.candidate_id else None
            strategy = (store.run().get("config") or {}).get("strategy", {}).get("kind", "?")
        finally:
            store.close()
        if cand is not None:
            programs[f"ksearch {strategy} ({rid})"] = cand
    return programs


def retime_only(args) -> int:
    """``--retime-from WORK``: OpenEvolve's best (WORK/openevolve/best) and the ``--runs`` bests re-timed beside
    the naive kernel in ``--sessions`` judge sessions; a table per session and the median over them."""
    import statistics

    from ksearch.records import Candidate
    from ksearch.run.ablate_results import machine, versions
    from ksearch.run.controller import RunConfig
    from ksearch.targets.base import spec_for_run

    work = Path(args.retime_from)
    setup = json.loads((work / "setup.json").read_text())
    run = RunConfig.model_validate(setup["run"])
    best = next(iter(sorted((work / "openevolve" / "best").glob("best_program.*"))), None)
    if best is None:
        raise SystemExit(f"no best program under {work / 'openevolve' / 'best'}")
    code = best.read_text().replace("// EVOLVE-BLOCK-START\n", "").replace("// EVOLVE-BLOCK-END\n", "")
    programs: dict[str, object] = {"openevolve": Candidate(target=run.target, sources={setup["file"]: code},
                                                           compile_flags=list(setup["flags"]))}
    programs.update(ksearch_bests([r for r in args.runs.split(",") if r]))
    hardware = spec_for_run(run.target, None)
    sessions, names = [], []
    for k in range(args.sessions):
        print(f"session {k + 1}/{args.sessions}", flush=True)
        rows, names = retime(run, hardware, programs)
        sessions.append(rows)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or HERE / "results" / f"openevolve-retime-{stamp}")
    doc = {"date": stamp, "command": "python bench/openevolve_peer.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
           "work": str(work), "run": setup["run"], "bench_workloads": names, "sessions": sessions,
           "machine": machine(), "versions": versions()}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Re-timed: OpenEvolve's best beside ksearch runs' bests ({run.task}, {run.target})", "",
             f"- date: {stamp}", f"- command: `{doc['command']}`", f"- machine: {json.dumps(doc['machine'])}",
             f"- versions: {json.dumps(doc['versions'])}",
             f"- {args.sessions} judge session(s) one after another, each: the naive kernel, then every kernel "
             f"paired with it on {', '.join(names)} (a fresh secret seed per session)", "",
             "| kernel | " + " | ".join(f"session {k + 1}" for k in range(len(sessions))) + " | median |",
             "|---|" + "---|" * (len(sessions) + 1)]
    for label in programs:
        cells, vals = [], []
        for rows in sessions:
            r = next((x for x in rows if x["label"] == label), None)
            if r is None or r["vs_naive"] is None:
                cells.append(r["status"] if r else "-")
                continue
            vals.append(r["vs_naive"])
            iv = f" [{r['lo']:.3g}, {r['hi']:.3g}]" if r["lo"] and r["hi"] else ""
            cells.append(f"{r['vs_naive']:.3g}x{iv}")
        med = f"{statistics.median(vals):.3g}x" if vals else "-"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {med} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task", nargs="?")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("-w", "--workloads", default="")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queue-dir", default="")
    ap.add_argument("--model", default="queue-agent", help="the name the results give the model answering")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--llm-timeout", type=float, default=3600.0)
    ap.add_argument("--runs", default="", help="ksearch run ids whose best kernels are re-timed beside OpenEvolve's")
    ap.add_argument("--out", default="")
    ap.add_argument("--work", default="", help="OpenEvolve's working directory (default: a new temporary one)")
    ap.add_argument("--respond-scripted", metavar="DIR", help="answer DIR's prompts with a stand-in (no model)")
    ap.add_argument("--retime-from", metavar="WORK", help="no evolution: re-time WORK's OpenEvolve best beside the "
                    "--runs bests")
    ap.add_argument("--sessions", type=int, default=1, help="judge sessions of the re-time (with --retime-from)")
    args = ap.parse_args()
    if args.respond_scripted:
        respond_scripted(Path(args.respond_scripted))
        return 0
    if args.retime_from:
        return retime_only(args)
    if not args.task or not args.queue_dir:
        ap.error("give TASK and --queue-dir")
    import openevolve
    from openevolve.api import run_evolution
    from openevolve.config import Config, LLMModelConfig

    from ksearch.records import Candidate
    from ksearch.run.ablate_results import machine, versions
    from ksearch.run.controller import RunConfig
    from ksearch.targets import get_target
    from ksearch.targets.base import spec_for_run
    from ksearch.tasks import load_task

    task = load_task(args.task)
    names = [w for w in args.workloads.split(",") if w] or None
    task.select(names)
    run = RunConfig(task=args.task, target=args.target, budget=args.iterations, seed=args.seed, workloads=names)
    hardware = spec_for_run(args.target, None)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or HERE / "results" / f"openevolve-{task.name}-{args.target}-{stamp}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="ksearch-openevolve-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"OpenEvolve's files (its output, the evaluator, judged.jsonl): {work}", flush=True)
    naive = get_target(args.target).naive_candidate(task)
    file_name = next(iter(naive.sources))
    selected = task.select(names)
    timing = "bench" if any(w.purpose == "bench" for w in selected) else True
    (work / "setup.json").write_text(json.dumps({"run": run.model_dump(mode="json"), "file": file_name,
                                                 "flags": list(naive.compile_flags), "timing": timing,
                                                 "hardware": hardware.model_dump(mode="json")}))
    (work / "evaluator.py").write_text(EVALUATOR)
    initial = work / f"initial_program{Path(file_name).suffix}"
    initial.write_text("// EVOLVE-BLOCK-START\n" + naive.sources[file_name].rstrip() + "\n// EVOLVE-BLOCK-END\n")
    (work / "judged.jsonl").unlink(missing_ok=True)

    queue_dir = Path(args.queue_dir).expanduser().absolute()
    server = serve(queue_dir, args.port, args.llm_timeout)
    cfg = Config()
    cfg.max_iterations = args.iterations
    cfg.random_seed = args.seed
    cfg.language = "c"
    cfg.database.random_seed = args.seed
    cfg.evaluator.cascade_evaluation = False
    cfg.evaluator.parallel_evaluations = 1
    cfg.evaluator.timeout = 3600
    cfg.llm.timeout = int(args.llm_timeout)
    cfg.llm.retries = 2
    cfg.llm.models = [LLMModelConfig(name=args.model, api_base=f"http://127.0.0.1:{args.port}/v1",
                                     api_key="queue", weight=1.0, timeout=int(args.llm_timeout), retries=2,
                                     retry_delay=5)]
    cfg.llm.api_base = f"http://127.0.0.1:{args.port}/v1"
    cfg.llm.api_key = "queue"
    print(f"OpenEvolve {openevolve.__version__ if hasattr(openevolve, '__version__') else '?'}: {args.iterations} "
          f"iterations; prompts in {queue_dir}", flush=True)
    os.environ.setdefault("OPENAI_API_KEY", "queue")
    t0 = time.monotonic()
    result = run_evolution(str(initial), str(work / "evaluator.py"), cfg, iterations=args.iterations,
                           output_dir=str(work / "openevolve"), cleanup=False)
    wall = time.monotonic() - t0
    server.shutdown()
    judged = [json.loads(x) for x in (work / "judged.jsonl").read_text().splitlines() if x.strip()] \
        if (work / "judged.jsonl").exists() else []
    best_code = (result.best_code or "").replace("// EVOLVE-BLOCK-START\n", "").replace("// EVOLVE-BLOCK-END\n", "")
    programs: dict[str, object] = {}
    if best_code.strip():
        programs["openevolve"] = Candidate(target=args.target, sources={file_name: best_code},
                                           compile_flags=list(naive.compile_flags))
    programs.update(ksearch_bests([r for r in args.runs.split(",") if r]))
    rows, bench_names = retime(run, hardware, programs)
    best_so_far, best = [], 0.0
    for j in judged:
        best = max(best, j["score"] or 0.0)
        best_so_far.append(round(best, 4))
    try:
        from importlib.metadata import version as _v
        oe_version = _v("openevolve")
    except Exception:  # noqa: BLE001
        oe_version = "?"
    doc = {"date": stamp, "command": "python bench/openevolve_peer.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
           "task": task.name, "target": args.target, "workloads": names, "iterations": args.iterations,
           "model": args.model, "openevolve": {"version": oe_version, "settings": {
               "islands": cfg.database.num_islands, "population_size": cfg.database.population_size,
               "archive_size": cfg.database.archive_size, "exploration_ratio": cfg.database.exploration_ratio,
               "exploitation_ratio": cfg.database.exploitation_ratio, "diff_based_evolution":
               cfg.diff_based_evolution, "parallel_evaluations": 1, "cascade_evaluation": False,
               "random_seed": args.seed}},
           "wall_s": round(wall, 1), "judged": len(judged),
           "passed": sum(1 for j in judged if j["status"] == "PASSED"), "best_so_far": best_so_far,
           "openevolve_best_score": result.best_score, "retime": rows, "bench_workloads": bench_names,
           "machine": machine(), "versions": versions()}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    lines = [f"# OpenEvolve on {task.name} ({args.target}), {args.iterations} iterations, beside ksearch", "",
             f"- date: {stamp}", f"- command: `{doc['command']}`", f"- model: {args.model} (answering the queue)",
             f"- OpenEvolve {oe_version}: {json.dumps(doc['openevolve']['settings'])}",
             f"- machine: {json.dumps(doc['machine'])}", f"- versions: {json.dumps(doc['versions'])}",
             f"- OpenEvolve judged {len(judged)} programs ({doc['passed']} passed) in {wall:.0f} s; its best "
             f"combined_score (in-run speedup over the naive kernel) {result.best_score:.3g}", "",
             f"Best so far after each judged program (in-run): {', '.join(f'{x:.3g}' for x in best_so_far)}", "",
             f"Re-timed beside the naive kernel in one judge session on {', '.join(bench_names)}:", "",
             "| kernel | status | vs naive (paired, 99.9% interval) |", "|---|---|---|"]
    for r in rows:
        iv = f" [{r['lo']:.3g}, {r['hi']:.3g}]" if r["lo"] and r["hi"] else ""
        vs = f"{r['vs_naive']:.3g}x{iv}" if r["vs_naive"] else "-"
        lines.append(f"| {r['label']} | {r['status']} | {vs} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
