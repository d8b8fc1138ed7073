"""Hardware probing across processes (`ksearch.hardware.cache.probe_lock`, issue 25): two processes started at
once in a fresh KSEARCH_HOME probe one at a time, and the second takes the spec the first cached instead of
probing under the first's load. The probing itself is a stand-in that logs when it runs (no real probes)."""

import json
import os
import subprocess
import sys
import time

import pytest

from ksearch.hardware.cache import current_fingerprint

SCRIPT = r"""
import json, os, sys, time
from ksearch.hardware import cache
from ksearch.hardware.spec import HardwareSpec

log, spec_file, refresh = sys.argv[1], sys.argv[2], sys.argv[3] == "1"

def measure(**kwargs):
    with open(log, "a") as f:
        f.write(f"start {os.getpid()} {time.time()}\n")
    time.sleep(0.3)
    with open(log, "a") as f:
        f.write(f"end {os.getpid()} {time.time()}\n")
    return HardwareSpec.model_validate_json(open(spec_file).read())

cache.measure_local_spec = measure
cache.implausible = lambda spec: []
print(cache.load_or_measure(refresh=refresh).fingerprint)
"""


@pytest.fixture
def spec_file(tmp_path, tiny_spec):
    path = tmp_path / "spec.json"
    path.write_text(tiny_spec.model_copy(update={"fingerprint": current_fingerprint()}).model_dump_json())
    return path


def _two_at_once(tmp_path, spec_file, refresh: bool) -> list[tuple[str, int, float]]:
    env = dict(os.environ, KSEARCH_HOME=str(tmp_path / "fresh-home"))
    log = tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(log), str(spec_file), "1" if refresh else "0"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == current_fingerprint()  # both got this machine's spec
    return [(what, int(pid), float(t)) for what, pid, t in (line.split() for line in log.read_text().splitlines())]


def test_two_runs_started_at_once_probe_once_and_share_the_spec(tmp_path, spec_file):
    events = _two_at_once(tmp_path, spec_file, refresh=False)
    assert [e[0] for e in events] == ["start", "end"], events  # the second waited, then took the cached spec
    cached = json.loads((tmp_path / "fresh-home" / "hardware" / f"{current_fingerprint()}.json").read_text())
    assert cached["name"] == "tiny"


def test_a_refresh_asked_while_another_process_probed_takes_its_fresh_spec(tmp_path, spec_file):
    events = _two_at_once(tmp_path, spec_file, refresh=True)
    assert [e[0] for e in events] == ["start", "end"], events


def test_probing_that_cannot_be_shared_runs_one_process_at_a_time(tmp_path, spec_file):
    """A provisional spec (probed under load) is never cached: each process probes, but never both at once."""
    spec = json.loads(spec_file.read_text())
    spec_file.write_text(json.dumps({**spec, "provisional": "probed under load"}))
    events = _two_at_once(tmp_path, spec_file, refresh=False)
    assert [e[0] for e in events] == ["start", "end", "start", "end"], events
    assert events[0][1] == events[1][1] and events[2][1] == events[3][1] != events[0][1]


def test_a_probe_lock_held_too_long_is_a_hardware_error(tmp_path, monkeypatch):
    import fcntl

    from ksearch.errors import HardwareError
    from ksearch.hardware.cache import probe_lock

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    (tmp_path / "hardware").mkdir()
    with open(tmp_path / "hardware" / "probe.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: another holder, as another process would be
        t0 = time.monotonic()
        with pytest.raises(HardwareError, match="another ksearch process has been probing"):
            with probe_lock(wait_s=0.2):
                pass
        assert time.monotonic() - t0 < 5
    with probe_lock(wait_s=0.2), probe_lock(wait_s=0.2):  # free again, and re-entrant in one process
        pass
