"""The run store: SQLite files under ``$KSEARCH_HOME/runs/<run id>/``, written only by the controller."""

from ksearch.store.db import Store
from ksearch.store.runs import list_runs, new_run_id, open_run, run_dir, runs_dir

__all__ = ["Store", "list_runs", "new_run_id", "open_run", "run_dir", "runs_dir"]
