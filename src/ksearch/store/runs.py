"""Where runs live: ``$KSEARCH_HOME/runs/<run id>/run.sqlite`` plus the best kernel's sources beside it."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from pathlib import Path

from ksearch import config
from ksearch.errors import StoreError
from ksearch.store.db import Store


def runs_dir() -> Path:
    path = config.home_dir() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_run_id(task: str) -> str:
    """``<task>-<UTC date and time>-<4 hex>``, e.g. ``selective-scan-20261129-214500-a3f2``."""
    return f"{task}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def run_dir(run_id: str) -> Path:
    return runs_dir() / run_id


def open_run(run: str) -> Store:
    """Open a run by id, unique id prefix, or path to its directory or run.sqlite.

    Raises:
        StoreError: no such run, or a prefix that matches several.
    """
    p = Path(run)
    if p.is_file():
        return Store(p)
    if (p / "run.sqlite").is_file():
        return Store(p / "run.sqlite")
    exact = run_dir(run) / "run.sqlite"
    if exact.is_file():
        return Store(exact)
    matches = [d for d in runs_dir().iterdir() if d.name.startswith(run) and (d / "run.sqlite").is_file()]
    if len(matches) == 1:
        return Store(matches[0] / "run.sqlite")
    if len(matches) > 1:
        raise StoreError(f"run {run!r} is ambiguous: {', '.join(sorted(m.name for m in matches)[:5])}")
    raise StoreError(f"no run {run!r} in {runs_dir()} (see `ksearch runs list`)")


def list_runs() -> list[dict]:
    """Every run's summary row (id, task, target, status, evaluations, best score, dates), newest first."""
    rows = []
    for d in sorted(runs_dir().iterdir(), reverse=True):
        f = d / "run.sqlite"
        if not f.is_file():
            continue
        try:
            store = Store(f)
        except StoreError as e:
            rows.append({"id": d.name, "status": f"unreadable: {e}"})
            continue
        try:
            info = store.run()
            best = store.db.execute("SELECT MAX(score) FROM evaluations WHERE status = 'PASSED'").fetchone()[0]
            rows.append({"id": info["id"], "task": info["task"], "target": info["target"], "status": info["status"],
                         "evaluations": store.evaluation_count(), "best_score": best,
                         "created_at": info["created_at"], "updated_at": info["updated_at"]})
        except StoreError as e:
            rows.append({"id": d.name, "status": f"unreadable: {e}"})
        finally:
            store.close()
    return rows
