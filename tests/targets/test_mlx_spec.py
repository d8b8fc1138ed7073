"""The roofline spec of the mlx targets: measured through CuPy where it is, else the catalog's figures for the
GPU MLX names (mlx 0.32's ``mx.device_info()["device_name"]``)."""

from __future__ import annotations

import sys
import types

import pytest

from ksearch.errors import HardwareError
from ksearch.targets import get_target


def fake_mlx(monkeypatch, name: str) -> None:
    core = types.SimpleNamespace(device_info=lambda: {"device_name": name})
    mlx = types.ModuleType("mlx")
    mlx.core = core
    monkeypatch.setitem(sys.modules, "mlx", mlx)
    monkeypatch.setitem(sys.modules, "mlx.core", core)


def test_mlx_cuda_without_cupy_takes_the_catalog_entry_of_the_gpu(monkeypatch):
    import ksearch.targets.cuda as cuda

    monkeypatch.setattr(cuda, "cupy_status", lambda: "cupy not installed")
    fake_mlx(monkeypatch, "NVIDIA H200")
    spec = get_target("mlx-cuda").hardware_spec()
    assert spec.name == "h200" and spec.memory_bandwidth_gbs == pytest.approx(4800, rel=0.01)


def test_mlx_metal_takes_the_catalog_entry_and_names_an_unknown_chip(monkeypatch):
    fake_mlx(monkeypatch, "Apple M2 Max")
    assert get_target("mlx-metal").hardware_spec().name == "m2-max"
    fake_mlx(monkeypatch, "Apple M9 Hyper")
    with pytest.raises(HardwareError, match="'Apple M9 Hyper' is not in the hardware catalog"):
        get_target("mlx-metal").hardware_spec()
