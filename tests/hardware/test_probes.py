import json
import platform
import re
import shutil
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest

from ksearch import config
from ksearch.errors import HardwareError
from ksearch.hardware import local, probes
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
        assert m.runs >= 3 and m.busy_cores is not None  # best of interleaved runs, each metered
    assert spec.measured["exp_rate_per_s"].vectorized is not None
    for name, level in spec.cache_bandwidth_gbs.items():  # one per data cache level sysfs or lscpu reports
        m = spec.measured[f"cache_bandwidth_gbs.{name}"]
        assert level.gbs == m.best > 0 and level.working_set_bytes <= level.capacity_bytes
        assert m.probe.startswith("cachebw_")
    if detect_cpu().caches:
        assert spec.cache_bandwidth_gbs
    assert spec.measured["memory_bandwidth_gbs"].bytes >= 250 * 10**6
    assert "-ffast-math" not in spec.measured["peak_flops.float32"].compile_flags
    exp = spec.measured["exp_rate_per_s"]
    assert exp.probe in ("exp2f_poly", "expf_libmvec") and exp.best == spec.exp_rate_per_s
    assert "Polynomial exp2f (degree 6" in exp.notes and "libmvec expf: best" in exp.notes
    assert spec.fingerprint and spec.source.startswith("measured on this machine by ksearch probes")


def test_find_compiler_takes_cc_from_config(monkeypatch):
    monkeypatch.setattr(config, "c_compiler", lambda: "sh -e")
    assert probes.find_compiler() == ["sh", "-e"]
    assert probes.find_compiler("sh") == ["sh"]  # an explicit compiler wins over the configured one
    monkeypatch.undo()
    monkeypatch.setenv("CC", "sh -x")  # read through config.c_compiler
    assert probes.find_compiler() == ["sh", "-x"]


def test_vector_fma_count():
    asm = """
    2137:	vfmadd132ps %zmm10,%zmm9,%zmm0
    2144:	vfmadd231ps %ymm1,%ymm8,%ymm0
    2150:	vfmadd231ss %xmm1,%xmm6,%xmm0
    2156:	vmulps %zmm2,%zmm0,%zmm0
    2160:	fmla	v0.4s, v1.4s, v2.4s
    """
    assert probes.vector_fma_count(asm) == 3


def _poly_coefficients() -> list[float]:
    src = (files("ksearch.hardware") / "probe_src" / "exp.c").read_text()
    coeffs = dict(re.findall(r"#define C(\d) ([-+.e\d]+)f", src))
    return [float(coeffs[str(k)]) for k in range(1, 7)]


def test_poly_exp2f_coefficients_are_fp32_accurate():
    """The probe's polynomial, evaluated in float32 (Horner, rounding every op), against exp2 in float64."""
    c = [np.float32(v) for v in _poly_coefficients()]
    x = np.concatenate([np.linspace(-126, 126, 1 << 18), np.linspace(-1, 1, 1 << 18)]).astype(np.float32)
    n = np.rint(x)
    f = x - n
    p = np.full_like(f, c[5])
    for ck in (c[4], c[3], c[2], c[1], c[0], np.float32(1)):
        p = p * f + ck
    y = p * np.ldexp(np.float32(1), n.astype(np.int32))
    assert y.dtype == np.float32
    want = np.exp2(x.astype(np.float64))
    assert np.max(np.abs(y - want) / want) < probes.POLY_MAX_REL_ERR


@needs_cc
def test_exp_probe_poly_is_accurate_and_vectorized(tmp_path):
    exe = probes.compile_probe("exp", tmp_path, probes.find_compiler())
    r = probes.run_probe(exe, ["0.02"], threads=1, timeout_s=30)
    assert 0 <= r["poly_max_rel_err"] < probes.POLY_MAX_REL_ERR and r["poly_checked"] >= 10**6
    for key in ("libmvec_best_per_s", "libmvec_median_per_s", "poly_best_per_s", "poly_median_per_s"):
        assert r[key] > 0
    asm = probes.disassembly(exe, probes.POLY_SYMBOL)
    flags = detect_cpu().simd_isa
    if asm is not None and platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= set(flags):
        assert probes.vector_fma_count(asm) >= 6  # the 6 Horner steps, on ymm or zmm registers


def _fake_exp_probe(tmp_path: Path, **result) -> Path:
    out = {
        "libmvec_best_per_s": 4e9, "libmvec_median_per_s": 3.9e9, "libmvec_scalar_per_s": 5e8, "libmvec_repeats": 7,
        "poly_best_per_s": 8e9, "poly_median_per_s": 7.5e9, "poly_scalar_per_s": 1e9, "poly_repeats": 7,
        "poly_max_rel_err": 8e-8, "poly_checked": 1572864, "threads": 2, "n": 2048,
    } | result
    script = tmp_path / "exp"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(out)}\nEOF\n")
    script.chmod(0o755)
    return script


def test_exp_reports_the_faster_variant_and_both_rates(tmp_path):
    m = probes._measure_exp(_fake_exp_probe(tmp_path), threads=2, seconds=0.1, timeout_s=10)
    assert (m.probe, m.best, m.median, m.repeats) == ("exp2f_poly", 8e9, 7.5e9, 7)
    assert "polynomial exp2f won" in m.notes and "8e+09" in m.notes and "4e+09" in m.notes
    m = probes._measure_exp(_fake_exp_probe(tmp_path, poly_best_per_s=3e9), threads=2, seconds=0.1, timeout_s=10)
    assert (m.probe, m.best, m.median) == ("expf_libmvec", 4e9, 3.9e9)
    assert "libmvec expf won" in m.notes and "3e+09" in m.notes


def test_inaccurate_poly_does_not_count(tmp_path):
    m = probes._measure_exp(_fake_exp_probe(tmp_path, poly_max_rel_err=3e-6), threads=2, seconds=0.1, timeout_s=10)
    assert m.probe == "expf_libmvec" and m.best == 4e9
    assert "NOT counted" in m.notes


def test_probe_version_is_in_the_fingerprint(monkeypatch):
    info = detect_cpu()
    before = local.local_fingerprint(info, "gcc 12")
    monkeypatch.setattr(local, "PROBE_VERSION", probes.PROBE_VERSION + 1)
    assert local.local_fingerprint(info, "gcc 12") != before


@needs_cc
def test_bandwidth_probes_report_read_copy_and_triad(tmp_path):
    cc = probes.find_compiler()
    for probe, args in (("stream", [str(8 * 10**6), "0.01"]), ("cachebw", ["24576", "0.01"])):
        r = probes.run_probe(probes.compile_probe(probe, tmp_path, cc), args, threads=1, timeout_s=30)
        for k in ("read", "copy", "triad"):
            assert r[f"{k}_best_gbs"] >= r[f"{k}_median_gbs"] > 0, (probe, r)
    m = probes._bandwidth(r, "cachebw", 24576, 1)
    assert m.best == max(r["read_best_gbs"], r["copy_best_gbs"], r["triad_best_gbs"]) and m.median <= m.best
