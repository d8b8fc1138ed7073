"""Hardware specs: detection of the local CPU, its measured ceilings, the on-disk cache and roofline math."""

from ksearch.hardware.cache import cached_local_spec, home_dir, load_or_measure, load_spec, save_spec
from ksearch.hardware.ceilings import measure_ceilings
from ksearch.hardware.cpu import CpuInfo, detect_cpu
from ksearch.hardware.load import LoadMeter, LoadReading, measure_load
from ksearch.hardware.local import measure_local_spec
from ksearch.hardware.roofline import Roofline, achieved_gbs, bound, floor_s, pct_of_floor, roofline
from ksearch.hardware.spec import CacheBandwidth, CacheLevel, HardwareSpec, Measurement

__all__ = [
    "CacheBandwidth",
    "CacheLevel",
    "CpuInfo",
    "HardwareSpec",
    "LoadMeter",
    "LoadReading",
    "Measurement",
    "Roofline",
    "achieved_gbs",
    "bound",
    "cached_local_spec",
    "detect_cpu",
    "floor_s",
    "home_dir",
    "load_or_measure",
    "load_spec",
    "measure_ceilings",
    "measure_load",
    "measure_local_spec",
    "pct_of_floor",
    "roofline",
    "save_spec",
]
