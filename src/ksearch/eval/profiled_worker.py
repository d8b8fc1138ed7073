"""The judge's worker under a profiler: ``python -m ksearch.eval.profiled_worker '<policy JSON>'``.

Started by the sandbox as any worker is (`ksearch.jail.sandbox.Worker`, its scrubbed environment, a session of its
own), it reads the profiler's argv that `ksearch.eval.profiling` wrote beside the worker's home
(``<scratch>/PROFILER_FILE``) and execs it with the judge's worker command appended: the profiler (Nsight Compute)
starts ``python -m ksearch.eval.worker '<policy JSON>'``, which enters its jail as always before the candidate
loads. The profiler itself runs outside the jail (it is the machine's tool, not candidate code); the protocol's
pipes pass through it to the worker. The standard library only; nothing is imported from the candidate's side.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

#: the file, in the worker's scratch directory (its home's parent), that holds ``{"argv": [...]}``
PROFILER_FILE = "profiler.json"
#: the judge's worker program, run under the profiler
WORKER_MODULE = "ksearch.eval.worker"


def command(policy_arg: str) -> list[str]:
    """The profiler's argv followed by the worker's command line for ``policy_arg`` (the policy JSON)."""
    home = Path(json.loads(policy_arg)["home"])
    spec = json.loads((home.parent / PROFILER_FILE).read_text())
    return [*spec["argv"], sys.executable, "-m", WORKER_MODULE, policy_arg]


def _main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m ksearch.eval.profiled_worker '<policy JSON>'", file=sys.stderr)
        return 2
    try:
        argv = command(sys.argv[1])
        os.execv(argv[0], argv)
    except (OSError, ValueError, KeyError) as e:
        print(f"profiled worker: cannot start the profiler: {type(e).__name__}: {e}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(_main())
