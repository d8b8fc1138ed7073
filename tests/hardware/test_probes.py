import shutil
from pathlib import Path

import pytest

from ksearch import config
from ksearch.errors import HardwareError
from ksearch.hardware import probes
from ksearch.hardware.cpu import detect_cpu
from ksearch.hardware.local import measure_local_spec

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc' on PATH")


def test_missing_compiler_names_it(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(HardwareError, match="no-such-compiler-xyz"):
        probes.find_compiler()


def test_stream_bytes_is_at_least_256_mb_and_4x_llc():
    info = detect_cpu()
    assert probes.stream_bytes(info) >= min(256 * 10**6, 4 * (info.last_level_cache_bytes() or 0))


@needs_cc
def test_probe_timeout_names_the_probe(tmp_path):
    exe = probes.compile_probe("fma", tmp_path, probes.find_compiler())
    with pytest.raises(HardwareError, match="'fma' timed out"):
        probes.run_probe(exe, ["30"], threads=1, timeout_s=0.2)


def test_failing_probe_raises(tmp_path):
    script = tmp_path / "broken"
    script.write_text("#!/bin/sh\necho oops >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(HardwareError, match="'broken' exited with 3: oops"):
        probes.run_probe(Path(script), [], threads=1, timeout_s=10)


@needs_cc
def test_real_probes_are_positive_and_plausible():
    spec = measure_local_spec(seconds_per_probe=0.1)
    assert 0.5 < spec.memory_bandwidth_gbs < 20_000
    assert 1e9 < spec.peak_flops["float32"] < 1e15
    assert 1e7 < spec.exp_rate_per_s < 1e13
    for key in ("memory_bandwidth_gbs", "peak_flops.float32", "exp_rate_per_s"):
        m = spec.measured[key]
        assert m.median <= m.best * 1.0001 and m.repeats >= 3 and m.threads >= 1
    assert spec.measured["memory_bandwidth_gbs"].bytes >= 250 * 10**6
    assert "-ffast-math" not in spec.measured["peak_flops.float32"].compile_flags
    assert spec.fingerprint and spec.source.startswith("measured on this machine by ksearch probes")


def test_find_compiler_takes_cc_from_config(monkeypatch):
    monkeypatch.setattr(config, "c_compiler", lambda: "sh -e")
    assert probes.find_compiler() == ["sh", "-e"]
    assert probes.find_compiler("sh") == ["sh"]  # an explicit compiler wins over the configured one
    monkeypatch.undo()
    monkeypatch.setenv("CC", "sh -x")  # read through config.c_compiler
    assert probes.find_compiler() == ["sh", "-x"]
