"""Fake ceiling probes (scripts printing the real probes' JSON) and a fake load meter, for tests of the logic
around the probes without their cost or their noise."""

from __future__ import annotations

import sys
from pathlib import Path

from ksearch.hardware.load import LoadReading

# plausible figures for any CPU these tests run on (see plausible.py): GB/s, FLOP/s, exp/s
GOOD = {"stream": 12.0, "fma": 1e11, "exp": 5e9, "cachebw": 150.0}


def fake_probes(tmp_path: Path, rates: dict[str, list[float]]) -> dict[str, Path]:
    """Scripts standing in for the compiled probes: each appends its name to `tmp_path/log` and prints the
    next of its `rates` (the last one again once they run out) in the real probe's JSON keys."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "log"
    exes = {}
    for name, values in rates.items():
        script = tmp_path / name
        script.write_text(f"""#!{sys.executable}
import json, pathlib
log = pathlib.Path({str(log)!r})
n = log.read_text().split().count({name!r}) if log.exists() else 0
with log.open("a") as f:
    f.write({name!r} + "\\n")
v = {values!r}[min(n, {len(values) - 1})]
out = {{"repeats": 3, "threads": 2, "bytes": 1000000}}
if {name!r} in ("stream", "cachebw"):
    for k in ("copy", "triad", "read"):
        out[k + "_best_gbs"] = v if k == "read" else v / 2
        out[k + "_median_gbs"] = 0.9 * v if k == "read" else v / 3
elif {name!r} == "fma":
    out.update(best_flops=v, median_flops=0.9 * v, chains=12, lanes=16)
else:
    out.update(libmvec_best_per_s=v / 4, libmvec_median_per_s=v / 5, libmvec_scalar_per_s=v / 40,
               libmvec_repeats=3, poly_best_per_s=v, poly_median_per_s=0.9 * v, poly_scalar_per_s=v / 10,
               poly_repeats=3, poly_max_rel_err=8e-8, poly_checked=1572864, n=2048)
print(json.dumps(out))
""")
        script.chmod(0o755)
        exes[name] = script
    return exes


class FakeMeter:
    """A LoadMeter stand-in whose readings say others used `busy` cores."""

    busy = 0.0

    def __init__(self, exclude_sessions=()):
        pass

    def reading(self) -> LoadReading:
        return LoadReading(busy_cores=self.busy, usable_cores=2, window_s=0.1, loadavg_1m=0.0)
