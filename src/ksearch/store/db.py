"""The run store: one SQLite file per run (WAL), written only by the controller.

Tables (see MIGRATIONS): ``runs`` (configuration, environment, status), ``candidates`` (sources and hash),
``evaluations`` (one row per evaluation, numbered by ``seq``, with per-workload metrics as JSON),
``snapshots`` (the world model and the strategy state after each evaluation), ``edits`` (every tree edit
proposed, accepted or rejected, with the reason), ``baselines`` (the naive kernel, and the final stage's
side-by-side measurements as ``final``), ``llm_calls`` (every language-model call of the llm proposer: prompt,
reply, tokens, cost, error), ``reports`` (the final report, `ksearch.records.FinalReport`, as ``final``).

Durability contract, which resume relies on: an evaluation, the tree snapshot and the strategy state that
follow from it are written in one transaction (`Store.record_step`). A process killed at any point leaves either
all of them or none; a candidate whose evaluation was not committed is evaluated again on resume, one whose
evaluation was committed is never evaluated again.

The run file alone is complete: every commit is followed by a checkpoint of the write-ahead log into
``run.sqlite``, so a copy of that file taken mid-run (without its ``-wal``) holds every committed evaluation. Before
and after each write the store checks that its file is still the one it opened (`Store._guard`): a run directory
removed under the run is written back from the open connection, a file replaced is left alone and the run's own
store kept beside it, a removed ``-wal`` is checkpointed into the file; each stops the run with `StoreWriteError`.
A write that fails (a full disk, a quota, permissions) is a `StoreWriteError` too, and nothing of it is committed.
A store opened read-only (`Store(path, readonly=True)`: `ksearch show`, `ksearch runs list`) works where the run
directory cannot be written.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from urllib.parse import quote

from ksearch.errors import StoreError, StoreWriteError
from ksearch.records import Candidate, Evaluation, FinalMeasurements, FinalReport


def _ident(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _m001_initial(db: sqlite3.Connection) -> None:
    _script(db, """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
            task TEXT NOT NULL, target TEXT NOT NULL, status TEXT NOT NULL,
            config_json TEXT NOT NULL, environment_json TEXT NOT NULL, hardware_json TEXT
        );
        CREATE TABLE candidates (
            id TEXT PRIMARY KEY, created_at TEXT NOT NULL, node_id TEXT, parent_id TEXT,
            candidate_json TEXT NOT NULL
        );
        CREATE TABLE evaluations (
            seq INTEGER PRIMARY KEY, created_at TEXT NOT NULL, candidate_id TEXT NOT NULL REFERENCES candidates(id),
            node_id TEXT, status TEXT NOT NULL, score REAL, evaluation_json TEXT NOT NULL
        );
        CREATE UNIQUE INDEX evaluations_candidate ON evaluations(candidate_id);
        CREATE TABLE snapshots (
            seq INTEGER PRIMARY KEY, created_at TEXT NOT NULL, tree_json TEXT NOT NULL, state_json TEXT NOT NULL,
            decision_json TEXT
        );
        CREATE TABLE edits (
            id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL, snapshot_seq INTEGER NOT NULL,
            source TEXT NOT NULL, edit_json TEXT NOT NULL, accepted INTEGER NOT NULL, reason TEXT NOT NULL
        );
        CREATE TABLE baselines (
            name TEXT PRIMARY KEY, created_at TEXT NOT NULL, kind TEXT NOT NULL, result_json TEXT NOT NULL
        );
        """)


def _script(db: sqlite3.Connection, sql: str) -> None:
    """Run ;-separated DDL inside the caller's transaction (executescript would commit it)."""
    for statement in sql.split(";"):
        if statement.strip():
            db.execute(statement)


def _m002_llm_calls(db: sqlite3.Connection) -> None:
    _script(db, """
        CREATE TABLE llm_calls (
            seq INTEGER PRIMARY KEY, created_at TEXT NOT NULL, role TEXT NOT NULL, purpose TEXT NOT NULL,
            node_id TEXT, model TEXT NOT NULL, prompt_hash TEXT NOT NULL, ok INTEGER NOT NULL,
            replayed INTEGER NOT NULL, call_json TEXT NOT NULL
        );
        CREATE INDEX llm_calls_prompt ON llm_calls(prompt_hash)
    """)


def _m003_reports(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE reports (name TEXT PRIMARY KEY, created_at TEXT NOT NULL, report_json TEXT NOT NULL)")


def _m004_retimes(db: sqlite3.Connection) -> None:
    """A candidate may be judged again when the planner asks (a re-time): evaluations are unique per (candidate,
    round) instead of per candidate; round 0 is the first judgment."""
    db.execute("ALTER TABLE evaluations ADD COLUMN round INTEGER NOT NULL DEFAULT 0")
    db.execute("DROP INDEX evaluations_candidate")
    db.execute("CREATE UNIQUE INDEX evaluations_candidate_round ON evaluations(candidate_id, round)")


def _m005_faults(db: sqlite3.Connection) -> None:
    """Infrastructure faults of a run with several workers: a host lost mid-evaluation (its candidate re-queued
    once, then failed), so that a resumed run counts them too."""
    db.execute("CREATE TABLE faults (seq INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL, node_id TEXT, "
               "candidate_id TEXT NOT NULL, worker TEXT NOT NULL, reason TEXT NOT NULL, outcome TEXT NOT NULL, "
               "attempt TEXT NOT NULL DEFAULT '')")


#: Schema migrations, applied in order and recorded by name in ``migrations``.
MIGRATIONS: list[tuple[str, Callable[[sqlite3.Connection], None]]] = [
    ("001_initial", _m001_initial),
    ("002_llm_calls", _m002_llm_calls),
    ("003_reports", _m003_reports),
    ("004_retimes", _m004_retimes),
    ("005_faults", _m005_faults),
]

#: the tables every migrated store has
TABLES = ("runs", "candidates", "evaluations", "snapshots", "edits", "baselines", "llm_calls", "reports", "faults")


def _reads(method):
    """A read of the store: what a damaged file raises on the way (an SQLite error, JSON or a record that does
    not decode; pydantic's ValidationError is a ValueError) becomes a StoreError naming the file."""

    @functools.wraps(method)
    def read(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.DatabaseError, ValueError) as e:
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StoreError(f"{self.path} cannot be read ({method.__name__}): {detail}") from None

    return read


class Store:
    """Access to one run's SQLite file.

    Raises StoreError for a missing, locked, damaged or foreign file (an SQLite file that is not a run store is
    refused before anything is written to it); the read methods raise StoreError when what they read does
    not decode.
    """

    def __init__(self, path: Path, create: bool = False, readonly: bool = False):
        self.path = Path(path).absolute()  # the file `_guard` watches, whatever the working directory becomes
        self.readonly = readonly and not create
        self._broken: str | None = None  # why writes stopped (`_guard`), or None
        self._wal: tuple[int, int] | None = None  # the -wal file this connection writes (device, inode)
        if not create and not self.path.is_file():
            raise StoreError(f"no run store at {self.path}")
        if self.readonly:
            self.db = self._connect_readonly()
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
            except OSError as e:
                raise StoreWriteError(f"cannot create the run store {self.path}: {e.strerror or e}") from None
            except sqlite3.DatabaseError as e:
                raise StoreError(f"{self.path} is not a usable ksearch run store: {e}") from None
        try:
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not create and "migrations" not in tables:
                raise StoreError(f"{self.path} is not a ksearch run store (an SQLite file without its tables)")
            if not self.readonly:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=FULL")
                self.db.execute("PRAGMA foreign_keys=ON")
                self._ident = _ident(self.path)
                self._migrate()
            elif self._pending_migrations():
                if not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK)):
                    raise StoreError(f"{self.path} was written by an older ksearch and cannot be updated here (the "
                                     "file or its directory is read-only): open it once where it can be written")
                self.db.close()  # migrated once by a writer, then read as asked
                Store(self.path).close()
                self.db = self._connect_readonly()
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            missing = [t for t in TABLES if t not in tables]
            if missing:
                raise StoreError(f"{self.path} is damaged: tables {missing} are missing")
        except sqlite3.OperationalError as e:
            self.db.close()
            if create and not self.readonly:
                raise StoreWriteError(f"cannot create the run store {self.path}: {e}") from None
            raise StoreError(f"{self.path} is not a usable ksearch run store: {e}") from None
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise StoreError(f"{self.path} is not a usable ksearch run store: {e}") from None
        except StoreError:
            self.db.close()
            raise

    def _connect_readonly(self) -> sqlite3.Connection:
        """A read-only connection: ``mode=ro`` (sees a live run's -wal), else, where even that cannot open (a
        read-only directory without the -shm file), ``immutable=1``: the file as it is, which holds every committed
        step (each commit is checkpointed into it)."""
        base = f"file:{quote(str(self.path.absolute()))}"
        last: Exception | None = None
        for mode in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                db = sqlite3.connect(base + mode, uri=True, timeout=10, isolation_level=None)
                db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
                return db
            except sqlite3.DatabaseError as e:
                last = e
        raise StoreError(f"{self.path} is not a usable ksearch run store (opened read-only): {last}")

    def _pending_migrations(self) -> list[str]:
        done = {r[0] for r in self.db.execute("SELECT name FROM migrations")}
        return [name for name, _ in MIGRATIONS if name not in done]

    def _migrate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
        done = {r[0] for r in self.db.execute("SELECT name FROM migrations")}
        known = {name for name, _ in MIGRATIONS}
        if done - known:
            raise StoreError(f"{self.path} was written by a newer ksearch (migrations {sorted(done - known)})")
        for name, fn in MIGRATIONS:
            if name not in done:
                with self.transaction():
                    fn(self.db)
                    self.db.execute("INSERT INTO migrations VALUES (?, ?)", (name, _now()))

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """All statements inside commit together or not at all; the commit is then checkpointed into the run file.

        Raises StoreWriteError when the store cannot be written (disk full, quota, permissions, a read-only store)
        or its file was removed or replaced under the run (`_guard`); nothing of the transaction is then committed
        (the file removed: what was committed before is written back). sqlite3.IntegrityError (a row the schema
        refuses) passes through as it is.
        """
        if self.readonly:
            raise StoreWriteError(f"{self.path} is open read-only")
        self._guard()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise self._write_error(e) from None
        try:
            yield self.db
            self.db.execute("COMMIT")
        except BaseException as e:
            if self.db.in_transaction:  # SQLite may have rolled back already (a full disk)
                try:
                    self.db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if isinstance(e, sqlite3.OperationalError):
                raise self._write_error(e) from None
            raise
        self.checkpoint()
        self._guard()

    def _write_error(self, e: sqlite3.OperationalError) -> StoreWriteError:
        return StoreWriteError(f"cannot write the run store {self.path}: {e}; nothing of this step was committed")

    def checkpoint(self) -> None:
        """Copy the committed pages of the -wal into the run file (PASSIVE: a reader holding an old snapshot, a
        `ksearch show` under way, leaves the rest for the next commit). A failure to write is a StoreWriteError;
        the commit stands, in the -wal."""
        try:
            self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.OperationalError as e:
            raise StoreWriteError(f"cannot write the run store {self.path} (checkpoint): {e}; what was committed is "
                                  f"in {self.path.name}-wal") from None
        if self._wal is None:
            self._wal = _ident(Path(f"{self.path}-wal"))

    def _guard(self) -> None:
        """Stop (StoreWriteError) when the run's file is no longer the one this store opened, keeping what was
        committed: the directory or file removed: written back from the open connection; the file replaced by
        another: this run's store kept beside it; its -wal removed or replaced: checkpointed into the file."""
        if self._broken:
            raise StoreWriteError(self._broken)
        here = _ident(self.path)
        wal = _ident(Path(f"{self.path}-wal")) if self._wal is not None else None
        if here == self._ident and wal == self._wal:
            return
        n = self._count_quietly()
        if here is None:
            kept = self._write_back(self.path)
            self._broken = (f"{self.path} was removed while the run worked on it; its store ({n} evaluations) was "
                            f"written back there{kept}, and the run stopped: `ksearch resume "
                            f"{self.path.parent.name}` continues it")
        elif here != self._ident:
            aside = self.path.with_name(f"{self.path.stem}.kept-{os.getpid()}{self.path.suffix}")
            kept = self._write_back(aside)
            if wal == self._wal and wal is not None:  # this run's -wal beside another file would be read into it
                for stale in (Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                    stale.unlink(missing_ok=True)
            self._broken = (f"{self.path} was replaced by another file while the run worked on it; the run stopped "
                            f"and its own store ({n} evaluations) is kept as {aside}{kept}")
        else:
            try:
                self.db.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
                self.db.close()  # the file now holds everything; a new connection makes a new -wal
                kept = ""
            except sqlite3.Error as e:
                kept = f" (the checkpoint failed: {e})"
            self._broken = (f"{self.path.name}-wal was removed or replaced while the run worked on it; everything "
                            f"committed ({n} evaluations) is in {self.path}{kept}, and the run stopped: "
                            f"`ksearch resume {self.path.parent.name}` continues it")
        raise StoreWriteError(self._broken)

    def _count_quietly(self) -> int | str:
        try:
            return self.db.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
        except sqlite3.Error:
            return "its"

    def _write_back(self, dest: Path) -> str:
        """Copy this connection's database (what it sees: the file and its -wal, open even when removed) to
        ``dest`` atomically, then close the connection; '' or why the copy failed."""
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            out = sqlite3.connect(tmp)
            try:
                self.db.backup(out)
            finally:
                out.close()
            self.db.close()
            os.replace(tmp, dest)
            return ""
        except (OSError, sqlite3.Error) as e:
            tmp.unlink(missing_ok=True)
            return f" (writing it failed: {e}: what was committed is lost with the file)"

    def close(self) -> None:
        self.db.close()

    def quick_check(self) -> list[str]:
        """SQLite's ``PRAGMA quick_check`` of the file (at most 5 lines): [] when intact, else what is damaged
        (`ksearch.store.check` has the full check and the repair)."""
        try:
            lines = [r[0] for r in self.db.execute("PRAGMA quick_check(5)")]
        except sqlite3.DatabaseError as e:
            return [str(e)]
        return [] if lines == ["ok"] else lines

    # -- run ----------------------------------------------------------------------------------------

    def create_run(self, run_id: str, task: str, target: str, config: dict, environment: dict,
                   hardware: dict | None) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                       (run_id, _now(), _now(), task, target, "running", json.dumps(config),
                        json.dumps(environment), json.dumps(hardware) if hardware else None))

    @_reads
    def run(self) -> dict[str, Any]:
        row = self.db.execute("SELECT id, created_at, updated_at, task, target, status, config_json, "
                              "environment_json, hardware_json FROM runs").fetchone()
        if row is None:
            raise StoreError(f"{self.path} holds no run")
        keys = ("id", "created_at", "updated_at", "task", "target", "status", "config", "environment", "hardware")
        out = dict(zip(keys, row))
        for k in ("config", "environment", "hardware"):
            out[k] = json.loads(out[k]) if out[k] else None
        if not isinstance(out["config"], dict):
            raise ValueError(f"the run's configuration is {out['config']!r}, not an object")
        return out

    @_reads
    def best_score(self) -> float | None:
        """The score of the run's best kernel as its world model has it (`ksearch.search.worldmodel.Tree.best`: a
        regressed kernel, or one that tied with the best of its time, never counts, whatever its score), or None
        when nothing is solved. A run without a snapshot: the highest score of a passing evaluation."""
        from ksearch.search.worldmodel import Tree

        snap = self.latest_snapshot()
        if snap is None:
            return self.db.execute("SELECT MAX(score) FROM evaluations WHERE status = 'PASSED'").fetchone()[0]
        try:
            best = Tree.model_validate_json(snap[1]).best()
        except ValueError as e:  # pydantic's ValidationError: a damaged snapshot
            raise StoreError(f"{self.path}: the newest snapshot's world model does not load: {str(e)[:300]}") from None
        return best.evaluation.score if best is not None and best.evaluation is not None else None

    def set_status(self, status: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE runs SET status = ?, updated_at = ?", (status, _now()))

    def set_config(self, config: dict) -> None:
        """Replace the run's saved configuration (e.g. a raised budget)."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET config_json = ?, updated_at = ?", (json.dumps(config), _now()))

    @_reads
    def hardware(self) -> dict | None:
        """The hardware spec the run measures against, as `set_hardware` stored it (None before it was set)."""
        row = self.db.execute("SELECT hardware_json FROM runs").fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def set_hardware(self, hardware: dict) -> None:
        """Record the hardware spec the run measures against."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET hardware_json = ?, updated_at = ?", (json.dumps(hardware), _now()))

    # -- baselines ----------------------------------------------------------------------------------

    def put_baseline(self, name: str, kind: str, result: dict) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO baselines VALUES (?,?,?,?)", (name, _now(), kind, json.dumps(result)))

    @_reads
    def baseline(self, name: str) -> dict | None:
        row = self.db.execute("SELECT result_json FROM baselines WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else None

    def put_final(self, final: FinalMeasurements) -> None:
        """Keep the final stage's measurements (the ``final`` baseline)."""
        self.put_baseline("final", "side-by-side", final.model_dump(mode="json"))

    @_reads
    def final(self) -> FinalMeasurements | None:
        """The final stage's measurements as `put_final` kept them (None before a run's first finish). Raises
        StoreError when they do not decode."""
        row = self.baseline("final")
        return FinalMeasurements.model_validate(row) if row is not None else None

    # -- the final report ---------------------------------------------------------------------------

    def put_report(self, report: FinalReport) -> None:
        """Keep the run's final report (replacing an earlier finish's)."""
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO reports VALUES (?,?,?)", ("final", _now(), report.model_dump_json()))

    @_reads
    def report(self) -> FinalReport | None:
        """The final report as `put_report` kept it (None before the run first finished). Raises StoreError when
        it does not decode (a report of another ksearch version that does not validate)."""
        row = self.db.execute("SELECT report_json FROM reports WHERE name = 'final'").fetchone()
        return FinalReport.model_validate_json(row[0]) if row else None

    # -- candidates and evaluations -----------------------------------------------------------------

    @_reads
    def candidate(self, candidate_id: str) -> Candidate | None:
        row = self.db.execute("SELECT candidate_json FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
        return Candidate.model_validate_json(row[0]) if row else None

    @_reads
    def evaluation_of(self, candidate_id: str) -> Evaluation | None:
        row = self.db.execute("SELECT evaluation_json FROM evaluations WHERE candidate_id = ? ORDER BY seq DESC "
                              "LIMIT 1", (candidate_id,)).fetchone()
        return Evaluation.model_validate_json(row[0]) if row else None

    @_reads
    def evaluations(self) -> list[tuple[int, str | None, Evaluation]]:
        """(seq, node_id, evaluation) in order."""
        return [(seq, node, Evaluation.model_validate_json(js)) for seq, node, js in
                self.db.execute("SELECT seq, node_id, evaluation_json FROM evaluations ORDER BY seq")]

    @_reads
    def evaluation_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]

    def record_step(self, candidate: Candidate, evaluation: Evaluation, score: float | None, tree_json: str,
                    state_json: str, decision_json: str | None,
                    edits: list[tuple[str, str, bool, str]] = (), *, retime: bool = False) -> int:
        """Write one evaluation with the tree and state that follow from it, atomically; returns its seq.

        ``edits``: (source, edit JSON, accepted, reason) of the tree edits made from this evaluation.
        ``retime``: the candidate was judged before and the planner asked for it again: the row is its next
        round (without it, a second evaluation of a candidate is refused by the store: IntegrityError).
        """
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO candidates VALUES (?,?,?,?,?)",
                       (candidate.id, _now(), candidate.node_id, candidate.parent_id, candidate.model_dump_json()))
            rnd = 0
            if retime:
                rnd = db.execute("SELECT COALESCE(MAX(round) + 1, 0) FROM evaluations WHERE candidate_id = ?",
                                 (candidate.id,)).fetchone()[0]
            cur = db.execute("INSERT INTO evaluations (created_at, candidate_id, node_id, status, score, "
                             "evaluation_json, round) VALUES (?,?,?,?,?,?,?)",
                             (_now(), candidate.id, candidate.node_id, evaluation.status.value, score,
                              evaluation.model_dump_json(), rnd))
            seq = cur.lastrowid
            self._snapshot(db, seq, tree_json, state_json, decision_json, edits)
            db.execute("UPDATE runs SET updated_at = ?", (_now(),))
        return seq

    def record_dispatch(self, candidate: Candidate, tree_json: str, state_json: str,
                        edits: list[tuple[str, str, bool, str]] = ()) -> None:
        """A candidate sent to be judged: kept with the tree that marks it in flight (`Tree.in_flight`), atomically,
        so that a run stopped before its evaluation comes back judges it on resume instead of writing another."""
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO candidates VALUES (?,?,?,?,?)",
                       (candidate.id, _now(), candidate.node_id, candidate.parent_id, candidate.model_dump_json()))
            self._snapshot(db, self.evaluation_count(), tree_json, state_json, None, edits)

    def record_fault(self, node_id: str | None, candidate_id: str, worker: str, reason: str, outcome: str,
                     attempt: str = "") -> None:
        """An infrastructure fault: ``worker`` was lost judging ``candidate_id``; ``outcome``: requeued | failed |
        dropped (a re-time); ``attempt``: which judgment of the kernel it was (the controller's key)."""
        with self.transaction() as db:
            db.execute("INSERT INTO faults (created_at, node_id, candidate_id, worker, reason, outcome, attempt) "
                       "VALUES (?,?,?,?,?,?,?)", (_now(), node_id, candidate_id, worker, reason[:2000], outcome,
                                                  attempt))

    @_reads
    def faults(self) -> list[dict]:
        """The run's infrastructure faults in order: seq, created_at, node_id, candidate_id, worker, reason, outcome,
        attempt."""
        keys = ("seq", "created_at", "node_id", "candidate_id", "worker", "reason", "outcome", "attempt")
        return [dict(zip(keys, row)) for row in self.db.execute(f"SELECT {', '.join(keys)} FROM faults ORDER BY seq")]

    @_reads
    def faults_of(self, attempt: str) -> int:
        """Faults recorded for this judgment (`record_fault`'s ``attempt``)."""
        return self.db.execute("SELECT COUNT(*) FROM faults WHERE attempt = ?", (attempt,)).fetchone()[0]

    @_reads
    def rounds(self, candidate_id: str) -> int:
        """Evaluations of this candidate committed so far (its first judgment, and the re-times after it)."""
        return self.db.execute("SELECT COUNT(*) FROM evaluations WHERE candidate_id = ?", (candidate_id,)).fetchone()[0]

    def record_snapshot(self, tree_json: str, state_json: str, edits: list[tuple[str, str, bool, str]] = ()) -> None:
        """A tree change not tied to an evaluation (the initial tree, planner edits); seq 0 before any."""
        with self.transaction() as db:
            self._snapshot(db, self.evaluation_count(), tree_json, state_json, None, edits)

    @staticmethod
    def _snapshot(db, seq, tree_json, state_json, decision_json, edits) -> None:
        # a later snapshot at the same seq (a tree change before the next evaluation) keeps the evaluation's decision
        db.execute("INSERT INTO snapshots VALUES (?,?,?,?,?) ON CONFLICT(seq) DO UPDATE SET "
                   "created_at = excluded.created_at, tree_json = excluded.tree_json, state_json = excluded.state_json, "
                   "decision_json = COALESCE(excluded.decision_json, snapshots.decision_json)",
                   (seq, _now(), tree_json, state_json, decision_json))
        for source, edit_json, accepted, reason in edits:
            db.execute("INSERT INTO edits (created_at, snapshot_seq, source, edit_json, accepted, reason) "
                       "VALUES (?,?,?,?,?,?)", (_now(), seq, source, edit_json, int(accepted), reason))

    @_reads
    def latest_snapshot(self) -> tuple[int, str, str] | None:
        """(seq, tree JSON, state JSON) of the newest snapshot, or None."""
        row = self.db.execute("SELECT seq, tree_json, state_json FROM snapshots ORDER BY seq DESC LIMIT 1").fetchone()
        return tuple(row) if row else None

    @_reads
    def snapshot_seqs(self) -> list[int]:
        """The seqs of the stored snapshots, newest first."""
        return [r[0] for r in self.db.execute("SELECT seq FROM snapshots ORDER BY seq DESC")]

    @_reads
    def snapshot(self, seq: int) -> tuple[int, str, str] | None:
        """(seq, tree JSON, state JSON) of the snapshot ``seq``, or None."""
        row = self.db.execute("SELECT seq, tree_json, state_json FROM snapshots WHERE seq = ?", (seq,)).fetchone()
        return tuple(row) if row else None

    @_reads
    def decisions(self) -> list[dict]:
        """The strategy's decisions in order (from the snapshots of each evaluation)."""
        return [json.loads(r[0]) for r in
                self.db.execute("SELECT decision_json FROM snapshots WHERE decision_json IS NOT NULL ORDER BY seq")]

    @_reads
    def edit_log(self) -> list[dict]:
        return [{"seq": s, "source": src, "edit": json.loads(e), "accepted": bool(a), "reason": r}
                for s, src, e, a, r in self.db.execute(
                    "SELECT snapshot_seq, source, edit_json, accepted, reason FROM edits ORDER BY id")]

    # -- the llm proposer's calls ---------------------------------------------------------------------

    def record_llm_call(self, call) -> int:
        """Keep one `ksearch.llm.base.LLMCall` (prompt, reply, tokens, cost, error); returns its seq."""
        with self.transaction() as db:
            cur = db.execute("INSERT INTO llm_calls (created_at, role, purpose, node_id, model, prompt_hash, ok, "
                             "replayed, call_json) VALUES (?,?,?,?,?,?,?,?,?)",
                             (_now(), call.role, call.purpose, call.node_id, call.model, call.prompt_hash,
                              int(call.error is None and call.reply is not None), int(call.replayed),
                              call.model_dump_json()))
            return cur.lastrowid

    @_reads
    def llm_calls(self) -> list:
        """Every recorded call, oldest first, as `LLMCall` records."""
        from ksearch.llm.base import LLMCall

        return [LLMCall.model_validate_json(js) for (js,) in
                self.db.execute("SELECT call_json FROM llm_calls ORDER BY seq")]
