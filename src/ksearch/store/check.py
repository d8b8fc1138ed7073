"""`ksearch runs check`: is a run store intact, and its repair from what is.

A store is *intact* when SQLite's ``PRAGMA integrity_check`` says ok and every row a resume reads decodes (the
run's configuration, candidates, evaluations, the newest snapshot). A damaged store (bytes overwritten on disk, a
snapshot that does not decode) is repaired by copying every row that still reads and decodes into a new file, in
the schema of this ksearch: rows on damaged pages are lost, the rest is kept. Resume then starts from the newest
snapshot that decodes (`newest_intact_snapshot`) and the evaluations committed after it are reused, not judged
again (the controller replays the search to them: `ksearch.run.controller`). The damaged file is kept beside the
repaired one as ``run.sqlite.damaged-<UTC time>`` (with its -wal).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from ksearch.errors import StoreError
from ksearch.store.db import TABLES, Store
from ksearch.store.runs import lock_run

#: consecutive unreadable row ids after which a damaged table is taken to have no more rows
MAX_GAP = 2000
#: problems a check lists (integrity_check's lines and rows that do not decode)
MAX_PROBLEMS = 20


def _decodes(table: str) -> Callable[[dict], None] | None:
    """What a row of ``table`` must decode as (raises ValueError when it does not), None: any row."""
    from ksearch.llm.base import LLMCall
    from ksearch.records import Candidate, Evaluation, FinalReport
    from ksearch.search.strategy import SearchState
    from ksearch.search.worldmodel import Tree

    def snapshot(r: dict) -> None:
        Tree.model_validate_json(r["tree_json"])
        SearchState.model_validate_json(r["state_json"])

    def run(r: dict) -> None:
        if not isinstance(json.loads(r["config_json"]), dict):
            raise ValueError("the run's configuration is not an object")
        json.loads(r["environment_json"])

    return {"runs": run, "candidates": lambda r: Candidate.model_validate_json(r["candidate_json"]),
            "evaluations": lambda r: Evaluation.model_validate_json(r["evaluation_json"]),
            "snapshots": snapshot, "edits": lambda r: json.loads(r["edit_json"]),
            "baselines": lambda r: json.loads(r["result_json"]),
            "llm_calls": lambda r: LLMCall.model_validate_json(r["call_json"]),
            "reports": lambda r: FinalReport.model_validate_json(r["report_json"])}.get(table)


@dataclass
class CheckReport:
    """What `check` found: ``problems`` (empty: intact), rows per table, the newest snapshot that decodes."""

    path: Path
    problems: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    newest_snapshot: int | None = None
    snapshots_damaged: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def _connect_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True, isolation_level=None)


def _rows(db: sqlite3.Connection, table: str, problems: list[str]) -> Iterator[dict]:
    """Every row of ``table`` that can be read, in rowid order, damaged pages skipped (each skip a problem)."""
    cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    select = f"SELECT rowid, {', '.join(cols)} FROM {table}"
    last = 0
    try:
        for row in db.execute(f"{select} ORDER BY rowid"):
            last = row[0]
            yield dict(zip(cols, row[1:]))
        return
    except sqlite3.DatabaseError as e:
        problems.append(f"{table}: rows after rowid {last} do not read ({e}); reading them one at a time")
    gap, rowid = 0, last
    while gap < MAX_GAP:
        rowid += 1
        try:
            row = db.execute(f"{select} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            row = None
        if row is None:
            gap += 1
            continue
        gap = 0
        yield dict(zip(cols, row[1:]))


def check(path: Path) -> CheckReport:
    """Check the run store at ``path`` without writing to it: integrity_check, then every row of every table
    decoded. Raises StoreError when the file is not an SQLite database at all."""
    report = CheckReport(Path(path))
    try:
        db = _connect_ro(report.path)
        db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path} is not a usable ksearch run store: {e}") from None
    try:
        lines = [r[0] for r in db.execute(f"PRAGMA integrity_check({MAX_PROBLEMS})")]
    except sqlite3.DatabaseError as e:
        lines = [str(e)]
    try:
        if lines != ["ok"]:
            report.problems += [f"integrity check: {line}" for line in lines]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table in TABLES:
            if table not in tables:
                report.problems.append(f"table {table} is missing")
                continue
            decode = _decodes(table)
            n = 0
            for row in _rows(db, table, report.problems):
                try:
                    if decode is not None:
                        decode(row)
                except ValueError as e:
                    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    key = row.get("seq", row.get("id", row.get("name", "?")))
                    if table == "snapshots":
                        report.snapshots_damaged += 1
                    report.problems.append(f"{table} row {key} does not decode: {first[:200]}")
                    continue
                n += 1
                if table == "snapshots":
                    report.newest_snapshot = max(report.newest_snapshot or 0, row["seq"])
            report.rows[table] = n
    finally:
        db.close()
    del report.problems[MAX_PROBLEMS:]
    return report


def _remove(db: Path) -> None:
    """The SQLite file ``db`` and its -wal and -shm, where they are."""
    for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        f.unlink(missing_ok=True)


def repair(path: Path) -> tuple[CheckReport, Path]:
    """Rebuild the run store at ``path`` from every row that reads and decodes (`check`'s), keep the damaged file
    beside it as ``<name>.damaged-<UTC time>`` (its -wal too), and return the repaired file's check and where the
    damaged one went. Raises StoreError when a process works on the run, or when nothing of the run is left."""
    path = Path(path)
    try:
        lock = lock_run(path.parent)
    except StoreError as e:
        raise StoreError(f"{e}: stop it first") from None
    try:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        tmp = path.with_name(f"{path.name}.repair-{os.getpid()}")
        _remove(tmp)
        src = _connect_ro(path)
        dst = Store(tmp, create=True)
        problems: list[str] = []
        try:
            for table in TABLES:  # in this order the foreign keys (evaluations -> candidates) are met
                decode = _decodes(table)
                cols = [r[1] for r in dst.db.execute(f"PRAGMA table_info({table})")]
                with dst.transaction() as db:
                    for row in _rows(src, table, problems):
                        try:
                            if decode is not None:
                                decode(row)
                            have = {c: row[c] for c in cols if c in row}
                            db.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(have)}) VALUES "
                                       f"({', '.join('?' * len(have))})", tuple(have.values()))
                        except (ValueError, sqlite3.IntegrityError):
                            continue
            if dst.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0:
                raise StoreError(f"{path}: the run's own row is damaged beyond repair (no configuration to "
                                 "resume from); the evaluations can still be read with `sqlite3`")
        except BaseException:
            dst.close()
            src.close()
            _remove(tmp)
            raise
        dst.db.execute("PRAGMA journal_mode=DELETE")  # one self-contained file to move into place
        dst.close()
        src.close()
        aside = path.with_name(f"{path.name}.damaged-{stamp}")
        for suffix in ("-wal", "-shm", ""):
            if Path(f"{path}{suffix}").exists():
                os.replace(f"{path}{suffix}", f"{aside}{suffix}")
        os.replace(tmp, path)
        _remove(tmp)  # its -wal and -shm
    finally:
        lock.close()
    return check(path), aside
