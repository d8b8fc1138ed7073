"""Where runs live: ``$KSEARCH_HOME/runs/<run id>/run.sqlite`` plus the best kernel's sources beside it."""

from __future__ import annotations

import fcntl
import re
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from ksearch import config
from ksearch.errors import StoreError
from ksearch.store.db import Store


def runs_dir(create: bool = True) -> Path:
    """``$KSEARCH_HOME/runs``, made when ``create`` (a read-only command leaves a home it cannot write as it is)."""
    path = config.home_dir(writable=create) / "runs"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def new_run_id(task: str) -> str:
    """``<task>-<UTC date and time>-<4 hex>``, e.g. ``selective-scan-20261129-214500-a3f2``; characters of the
    task name that do not belong in a directory name (``/``, spaces, ...) become ``-``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", task).strip("-.") or "task"
    return f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def run_dir(run_id: str) -> Path:
    return runs_dir() / run_id


def find_run(run: str) -> Path:
    """The run.sqlite of a run given by id, unique id prefix, or path to its directory or run.sqlite.

    Raises:
        StoreError: no such run, or a prefix that matches several.
    """
    if not run.strip():  # '' is a prefix of every id (and Path('') the working directory): never "the one run"
        raise StoreError("no run given: a run id, a unique prefix of one, or its directory (see `ksearch runs list`)")
    p = Path(run)
    if p.is_file():
        return p
    if (p / "run.sqlite").is_file():
        return p / "run.sqlite"
    where = runs_dir(create=False)
    exact = where / run / "run.sqlite"
    if exact.is_file():
        return exact
    found = where.iterdir() if where.is_dir() else []
    matches = [d for d in found if d.name.startswith(run) and (d / "run.sqlite").is_file()]
    if len(matches) == 1:
        return matches[0] / "run.sqlite"
    if len(matches) > 1:
        raise StoreError(f"run {run!r} is ambiguous: {', '.join(sorted(m.name for m in matches)[:5])}")
    raise StoreError(f"no run {run!r} in {where} (see `ksearch runs list`)")


def open_run(run: str, readonly: bool = False) -> Store:
    """Open a run by id, unique id prefix, or path to its directory or run.sqlite (`find_run`); ``readonly``:
    for commands that only read it (`Store`'s read-only mode: works where the run cannot be written).

    Raises:
        StoreError: no such run, or a prefix that matches several, or a file that is not a usable store.
    """
    return Store(find_run(run), readonly=readonly)


def list_runs() -> list[dict]:
    """Every run's summary row, newest first: id (its directory's name, what `open_run` takes), task, target,
    status, evaluations, best score, dates. A run marked ``running`` whose lock no process holds was killed:
    its status reads ``stopped`` (`ksearch resume` continues it). A run whose store cannot be read has status
    ``unreadable`` and the reason in ``error``."""
    rows: list[dict] = []
    where = runs_dir(create=False)
    for d in where.iterdir() if where.is_dir() else []:
        f = d / "run.sqlite"
        if not f.is_file():
            continue
        try:
            store = Store(f, readonly=True)
        except StoreError as e:
            rows.append({"id": d.name, "status": "unreadable", "error": str(e)})
            continue
        try:
            info = store.run()
            status = current_status(d, info["status"])
            try:
                best = store.best_score()
            except StoreError:  # a damaged world model: the run is listed, its best unknown (`show` says why)
                best = None
            rows.append({"id": d.name, "task": info["task"], "target": info["target"], "status": status,
                         "evaluations": store.evaluation_count(), "best_score": best,
                         "created_at": info["created_at"], "updated_at": info["updated_at"]})
        except StoreError as e:
            rows.append({"id": d.name, "status": "unreadable", "error": str(e)})
        finally:
            store.close()
    rows.sort(key=lambda r: (r.get("created_at") or "", r["id"]), reverse=True)
    return rows


def current_status(directory: Path, status: str) -> str:
    """A run's stored ``status`` as it stands: ``running`` with no process holding the run's lock is ``stopped``
    (killed, or its directory removed: `ksearch resume` continues it)."""
    return "stopped" if status == "running" and not _locked(directory) else status


def hold_lock(path: Path, what: str) -> TextIO:
    """The file ``path``, held (flock, exclusive, without waiting) until it is closed. Raises StoreError naming
    ``what`` (``run ID``, ``ablation ID``) when another process holds it."""
    f = open(path, "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise StoreError(f"{what} is being worked on by another ksearch process") from None
    return f


def lock_run(directory: Path) -> TextIO:
    """The run directory's ``lock`` file, held (`hold_lock`) until it is closed: by `ksearch.run.session` while it
    works on the run, by `ksearch.store.check.repair`. Raises StoreError when another process holds it."""
    return hold_lock(directory / "lock", f"run {directory.name}")


def _locked(directory: Path) -> bool:
    """Whether a process holds the run's ``lock`` (taken by `ksearch.run.session` while it works on the run)."""
    try:
        with open(directory / "lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
    except BlockingIOError:
        return True
    except OSError:
        return False
