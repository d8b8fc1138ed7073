import pytest

from ksearch.hardware.spec import CacheLevel, HardwareSpec, Measurement


@pytest.fixture
def tiny_spec() -> HardwareSpec:
    """A hand-made spec with round ceilings: 10 GB/s, 1e11 FLOP/s float32, 1e9 exp/s."""
    return HardwareSpec(
        name="tiny",
        kind="cpu",
        cores=2,
        threads=4,
        simd_isa=["avx2", "fma"],
        simd_width_bits=256,
        simd_width=8,
        caches=[CacheLevel(level=3, size_bytes=8 * 2**20, shared_by_cores=2)],
        memory_bandwidth_gbs=10.0,
        peak_flops={"float32": 1e11},
        exp_rate_per_s=1e9,
        source="hand-made for tests",
        measured={
            "memory_bandwidth_gbs": Measurement(
                probe="stream_triad", unit="GB/s", best=10.0, median=9.5, threads=4, repeats=5, bytes=256 * 10**6
            )
        },
        fingerprint="0123456789abcdef",
    )


@pytest.fixture
def ksearch_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def fake(tmp_path, monkeypatch, ksearch_home):
    """Install fake probes (tests/hardware/fakeprobes.py) with rates per probe (a list: one per run, else
    fakeprobes.GOOD) and a load meter whose readings say others used `busy` cores; returns the probes' call log."""
    from ksearch.hardware import cache, ceilings

    from .fakeprobes import GOOD, FakeMeter, fake_probes

    def install(rates: dict[str, list[float]] | None = None, busy: float = 0.0):
        rates = {k: [v] for k, v in GOOD.items()} | (rates or {})
        exes = fake_probes(tmp_path / "fake-probes", rates)
        monkeypatch.setattr(ceilings, "built_probes", lambda names, cc: {n: exes[n] for n in names})
        monkeypatch.setattr(ceilings, "LoadMeter", type("Meter", (FakeMeter,), {"busy": busy}))
        monkeypatch.setattr(cache, "_provisional", {})
        return tmp_path / "fake-probes" / "log"

    return install
