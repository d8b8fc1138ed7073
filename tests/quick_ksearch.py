"""``python tests/quick_ksearch.py ARGS`` (`command`): the ``ksearch`` command (``ksearch.cli.main``) in a real process of its own,
its runs, comparisons and ablations timed with the quick plan of the in-process tests (`tests.targets.test_null.QUICK`,
kept in the run's config: ``ksearch resume`` of such a run keeps it) and each worker's clock calibrated with 4 pings,
not 24 (`use_quick_timing`, which the in-process tests call with ``monkeypatch.setattr``).

For the tests about processes (kill -9 and resume, Ctrl-C, ``--json``, a Ray cluster), not the judge's timing: every
correctness check and every paired round the quick plan asks for still runs; what is traded is the default plan's
minimum time and repeats per kernel and its 64 MiB cache flush before every timed call (about a fifth of such a
test's CPU time on the tiny workload)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def use_quick_timing(setattr_=setattr, **config) -> None:
    """Every RunConfig that ``ksearch run``, ``compare`` and ``ablate`` build gets the quick plan (and ``config``,
    e.g. ``checks=1``), and each worker's clock is calibrated with 4 pings. ``setattr_``: ``monkeypatch.setattr`` in
    a test (undone after it), plain setattr in this script's own process."""
    import ksearch.cli.ablate_cmd as ablate_cmd
    import ksearch.cli.compare_cmd as compare_cmd
    import ksearch.cli.run_cmd as run_cmd
    from ksearch.eval import timing
    from ksearch.run.controller import RunConfig
    from tests.targets.test_null import QUICK

    for module in (run_cmd, compare_cmd, ablate_cmd):
        setattr_(module, "RunConfig", functools.partial(RunConfig, timing=QUICK, **config))
    setattr_(timing, "PINGS", 4)


def command(*args: str) -> list[str]:
    """The argument vector that runs ``ksearch ARGS`` so, in this interpreter, from any working directory."""
    return [sys.executable, __file__, *args]


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # the repository root, not tests/ (whose modules would shadow top-level ones)
    use_quick_timing()
    from ksearch.cli import main

    sys.argv[0] = "ksearch"
    main()
