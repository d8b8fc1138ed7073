"""A search on a Ray cluster of two nodes on this machine, standing for two hosts, one node killed mid-run
(issue 27): every evaluation recorded once, none lost, the run finishes its budget on the surviving node, then
resumes.

Ray's own multi-node-on-one-machine support (`ray.cluster_utils.Cluster`): a head node and a second node, each
with its own raylet and object store; ``num_cpus`` is only Ray's accounting (head 2, second node 1 by default: the
head has room for the lost worker's replacement). The search is the ordinary command line,

    ksearch run TASK -w WORKLOADS --budget N --workers 2 --executor ray --ray-address <the cluster's address>

in a home of its own. Where each worker's actor runs is read from the processes: an actor is a child of its
node's raylet, titled ``ray::_HostActor`` (``ray::_HostActor.evaluate`` while it judges). Once ``--kill-after``
evaluations are committed and the second node's actor is judging, the second node's raylet and its workers are
killed (SIGKILL, ``remove_node(allow_graceful=False)``). The run must end with ``--budget`` evaluations, each
(candidate, round) once, the lost job recorded as a fault and judged again; then ``ksearch resume RUN --budget
N+R`` on the surviving node must add R more, again each once.

    python bench/ray_two_nodes.py                      # selective-scan, tiny, budget 8, kill after 2, resume +2
    python bench/ray_two_nodes.py --head-cpus 1        # no room for a replacement: it is given up, 1 worker goes on

Writes bench/results/ray-two-nodes-cpu-<stamp>.{md,json} (machine, CPU, load, versions, date, command, what
happened when) and prints the verdict; exit code 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_selective_scan_search import machine  # noqa: E402


def _children_titles(pid: int) -> dict[int, str]:
    """Child process id -> its command line (Ray's process title) of process ``pid``."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
    return out


def actors_on(node) -> list[str]:
    """The titles of the ksearch host actors that ``node`` (a `ray._private.node.Node`) runs."""
    raylet = node.all_processes.get("raylet")
    if not raylet:
        return []
    return [t for t in _children_titles(raylet[0].process.pid).values() if "_HostActor" in t]


def store_state(db: Path) -> dict:
    """Evaluations (candidate, round) in commit order, faults and the last snapshot's in-flight nodes of a run."""
    con = sqlite3.connect(db, timeout=30)
    try:
        rows = con.execute("SELECT candidate_id, round FROM evaluations ORDER BY seq").fetchall()
        try:
            faults = con.execute("SELECT candidate_id, worker, outcome, reason FROM faults ORDER BY seq").fetchall()
        except sqlite3.OperationalError:
            faults = []
        snap = con.execute("SELECT tree_json FROM snapshots ORDER BY seq DESC LIMIT 1").fetchone()
        in_flight = json.loads(snap[0]).get("in_flight", {}) if snap else {}
        return {"evaluations": [list(r) for r in rows], "faults": [list(f) for f in faults], "in_flight": in_flight}
    except sqlite3.OperationalError:  # tables not there yet
        return {"evaluations": [], "faults": [], "in_flight": {}}
    finally:
        con.close()


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def _json_tail(out: str) -> dict:
    """The JSON object the command printed last (Ray may print lines of its own before it)."""
    for i in [0] + [k + 1 for k, ch in enumerate(out) if ch == "\n"]:
        if out.startswith("{", i):
            try:
                return json.loads(out[i:])
            except json.JSONDecodeError:
                continue
    return {"stdout_tail": out[-2000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="selective-scan")
    ap.add_argument("-w", "--workloads", default="tiny")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--kill-after", type=int, default=2, help="evaluations committed before the node is killed")
    ap.add_argument("--resume-more", type=int, default=2, help="evaluations the resume adds")
    ap.add_argument("--head-cpus", type=int, default=2, help="the head node's CPUs in Ray's accounting")
    ap.add_argument("--node-cpus", type=int, default=1, help="the second node's CPUs in Ray's accounting")
    ap.add_argument("--deadline", type=float, default=600.0, help="seconds the whole bench may take")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from ksearch.hardware.load import measure_load

    t0 = time.monotonic()
    until = t0 + args.deadline
    events: list[tuple[float, str]] = []

    def note(msg: str) -> None:
        events.append((round(time.monotonic() - t0, 1), msg))
        print(f"{events[-1][0]:7.1f} s  {msg}", flush=True)

    load_before = measure_load(0.5).busy_cores
    home = Path(tempfile.mkdtemp(prefix="ksearch-ray-nodes-"))
    hardware = Path(os.environ.get("KSEARCH_HOME", Path.home() / ".cache" / "ksearch")) / "hardware"
    if hardware.is_dir():  # the measured spec, not probed again
        shutil.copytree(hardware, home / "hardware")
    env = dict(os.environ, KSEARCH_HOME=str(home))
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": args.head_cpus, "include_dashboard": False})
    checks: dict[str, bool] = {}
    result: dict = {}
    proc = None
    try:
        second = cluster.add_node(num_cpus=args.node_cpus)
        cluster.wait_for_nodes()
        note(f"cluster up at {cluster.address}: head {cluster.head_node.node_id[:8]} ({args.head_cpus} CPUs), "
             f"second {second.node_id[:8]} ({args.node_cpus} CPU)")
        cmd = [sys.executable, "-m", "ksearch", "run", args.task, "-w", args.workloads, "--budget", str(args.budget),
               "--workers", "2", "--executor", "ray", "--ray-address", cluster.address, "--json"]
        log = open(home / "run.log", "w")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        note("ksearch run started")
        runs, db = home / "runs", None
        placed: dict[str, list[str]] = {}
        killed_at = None
        while proc.poll() is None and time.monotonic() < until:
            if db is None:
                found = list(runs.glob("*/run.sqlite")) if runs.exists() else []
                db = found[0] if found else None
            on_head, on_second = actors_on(cluster.head_node), actors_on(second) if killed_at is None else []
            if killed_at is not None and len(on_head) > len(placed.get("head", ())) and "replaced" not in result:
                result["replaced"] = round(time.monotonic() - killed_at, 1)
                note(f"the lost worker's new actor runs on the head ({len(on_head)} actors there), "
                     f"{result['replaced']} s after the kill")
            if on_head and on_second and not placed:
                placed = {"head": on_head, "second": on_second}
                note(f"actors placed: head {len(on_head)}, second node {len(on_second)}")
            done = len(store_state(db)["evaluations"]) if db is not None else 0
            if (killed_at is None and done >= args.kill_after
                    and any("_HostActor.evaluate" in t for t in on_second)):
                before = store_state(db)
                cluster.remove_node(second, allow_graceful=False)  # its raylet and its workers, SIGKILL
                killed_at = time.monotonic()
                result["committed_at_kill"] = len(before["evaluations"])
                note(f"second node killed while its actor judged; {len(before['evaluations'])} evaluations "
                     f"committed, in flight: {sorted(before['in_flight'].values())}")
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=max(1.0, until - time.monotonic()))
        note(f"ksearch run ended (exit code {proc.returncode})")
        run = _json_tail(out)
        assert db is not None, "the run made no store"
        state = store_state(db)
        keys = [tuple(e) for e in state["evaluations"]]
        checks["actors on both nodes"] = bool(placed)
        checks["second node killed mid-evaluation"] = killed_at is not None
        checks["run exit code 0"] = proc.returncode == 0
        checks[f"{args.budget} evaluations committed"] = len(keys) == args.budget
        checks["each (candidate, round) once"] = len(keys) == len(set(keys))
        checks["nothing left in flight"] = not state["in_flight"]
        lost = [f for f in state["faults"] if f[2] == "requeued"]
        checks["the lost job recorded as a fault and judged again"] = bool(lost) and all(
            any(k[0] == f[0] for k in keys) for f in lost)
        result["run"] = {"json": run, "store": state}
        if args.resume_more:
            rcmd = [sys.executable, "-m", "ksearch", "resume", db.parent.name, "--budget",
                    str(args.budget + args.resume_more), "--workers", str(min(2, args.head_cpus)), "--json"]
            note("ksearch resume started (the surviving node only)")
            p = subprocess.run(rcmd, env=env, capture_output=True, text=True,
                               timeout=max(1.0, until - time.monotonic()))
            note(f"ksearch resume ended (exit code {p.returncode})")
            after = store_state(db)
            keys2 = [tuple(e) for e in after["evaluations"]]
            checks["resume exit code 0"] = p.returncode == 0
            checks[f"{args.budget + args.resume_more} evaluations after resume"] = (
                len(keys2) == args.budget + args.resume_more)
            checks["each (candidate, round) once after resume"] = len(keys2) == len(set(keys2))
            checks["the first run's evaluations kept"] = keys2[:len(keys)] == keys
            result["resume"] = {"exit": p.returncode, "store": after, "stderr_tail": p.stderr[-1500:]}
        log.close()
        text = (home / "run.log").read_text()
        result["run_log_tail"] = text[-4000:]
        parts = re.split(r"^\s*\[\s*(\d+)\]", text, flags=re.M)  # a step's lines (wrapped) end "(w1)"
        steps = [(int(i), m.group(1)) for i, body in zip(parts[1::2], parts[2::2])
                 if (m := re.search(r"\((w\d+)\)", body))]
        result["workers_per_evaluation"] = steps
        k = result.get("committed_at_kill", 0)
        result["by_worker"] = {"before the kill": _count(w for i, w in steps if i <= k),
                               "after the kill": _count(w for i, w in steps if i > k)}
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    total_s = round(time.monotonic() - t0, 1)
    ok = bool(checks) and all(checks.values())
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    info = machine()
    info["ray"] = ray.__version__
    info["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    result.update({"date": stamp, "command": "python bench/ray_two_nodes.py " + " ".join(sys.argv[1:]),
                   "machine": info, "others_load_cores_before": load_before, "args": vars(args), "ok": ok,
                   "checks": checks, "events": events, "total_s": total_s})
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"ray-two-nodes-cpu-{stamp}"
    path.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    path.with_suffix(".md").write_text(md)
    print(md)
    print(f"written: {path}.md, {path}.json")
    shutil.rmtree(home, ignore_errors=True)
    return 0 if ok else 1


def markdown(r: dict) -> str:
    m, a = r["machine"], r["args"]
    lines = [f"# A search on two Ray nodes of one machine, one killed mid-run ({r['date']})", "",
             f"`{r['command']}`", "",
             f"- machine: {m.get('cpu', '?')}, {m.get('cores')} cores, {m.get('platform')}; CPU only, one machine, "
             "two Ray nodes (each its own raylet) standing for two hosts",
             f"- others' load before: {r['others_load_cores_before']:.2f} busy cores; load average after: "
             f"{' '.join(m.get('loadavg_after', []))}",
             f"- versions: python {m.get('python')}, ray {m.get('ray')}, numpy {m.get('numpy')}, {m.get('cc')}, "
             f"ksearch {m.get('ksearch_commit')}",
             f"- {a['task']} -w {a['workloads']}, budget {a['budget']}, 2 workers; head {a['head_cpus']} CPUs, "
             f"second node {a['node_cpus']} (Ray's accounting); second node killed after {a['kill_after']} "
             f"evaluations; resume +{a['resume_more']}",
             f"- verdict: {'all checks passed' if r['ok'] else 'FAILED'}; {r['total_s']} s in all", "",
             "| check | |", "| --- | --- |"]
    lines += [f"| {k} | {'yes' if v else 'NO'} |" for k, v in r["checks"].items()]
    lines += ["", "| s | event |", "| ---: | --- |"]
    lines += [f"| {t} | {msg} |" for t, msg in r["events"]]
    if r.get("by_worker"):
        lost = sorted({f[1] for f in r.get("run", {}).get("store", {}).get("faults", [])})
        lines += ["", f"Evaluations committed per worker (from the run's output; {', '.join(lost) or '?'}: the second "
                  "node's actor until the kill, then its replacement if one was placed): "
                  + "; ".join(f"{k}: {v}" for k, v in r["by_worker"].items())]
    faults = r.get("resume", r.get("run", {})).get("store", {}).get("faults", [])
    if faults:
        lines += ["", "Faults recorded (candidate, worker, outcome, reason):", ""]
        lines += [f"- {f[0]} on {f[1]}: {f[2]} ({f[3][:160]})" for f in faults]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
