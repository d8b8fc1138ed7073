from ksearch.hardware.cpu import detect_cpu, isa_from_flags, parse_cpuinfo, parse_lscpu, read_sysfs_caches

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Gold 6338
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512_vnni

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Gold 6338
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512_vnni

processor\t: 2
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Gold 6338
physical id\t: 0
core id\t\t: 1
flags\t\t: fpu sse2 sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512_vnni
"""

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm asimdhp asimddp sve
CPU implementer\t: 0x41
"""

LSCPU = """Vendor ID:               AuthenticAMD
Model name:              AMD EPYC 9654
Flags:                   sse2 avx avx2 fma
L1d cache:               64 KiB (2 instances)
L2 cache:                2 MiB (2 instances)
L3 cache:                32 MiB (1 instance)
"""


def test_parse_cpuinfo_counts_cores_and_threads():
    info = parse_cpuinfo(CPUINFO)
    assert info["threads"] == 3 and info["cores"] == 2
    assert info["model"] == "Intel(R) Xeon(R) Gold 6338" and info["vendor"] == "GenuineIntel"


def test_parse_cpuinfo_arm():
    info = parse_cpuinfo(ARM_CPUINFO)
    assert info["vendor"] == "ARM" and info["threads"] == 1
    assert isa_from_flags(info["flags"]) == (["neon", "neon-fp16", "neon-dotprod", "sve"], 128)


def test_isa_from_flags():
    isa, width = isa_from_flags(parse_cpuinfo(CPUINFO)["flags"])
    assert isa == ["sse2", "sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512vnni"]
    assert width == 512
    assert isa_from_flags(["sse2", "avx", "avx2"])[1] == 256


def test_parse_lscpu_caches_per_instance():
    info = parse_lscpu(LSCPU, cores=2)
    assert info["model"] == "AMD EPYC 9654"
    by_level = {(c.level, c.kind): c for c in info["caches"]}
    assert by_level[(1, "data")].size_bytes == 32 * 1024 and by_level[(1, "data")].shared_by_cores == 1
    assert by_level[(3, "unified")].size_bytes == 32 * 2**20 and by_level[(3, "unified")].shared_by_cores == 2


def test_read_sysfs_caches(tmp_path):
    for i, (level, kind, size, shared) in enumerate([(1, "Data", "48K", "0,4"), (3, "Unified", "30720K", "0-7")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")
    caches = read_sysfs_caches(tmp_path, threads_per_core=2)
    assert [(c.level, c.kind, c.size_bytes, c.shared_by_cores) for c in caches] == [
        (1, "data", 48 * 1024, 1),
        (3, "unified", 30 * 2**20, 4),
    ]
    assert read_sysfs_caches(tmp_path / "missing") == []


def test_detect_cpu_here_is_sane():
    info = detect_cpu()
    assert info.model and 1 <= info.cores <= info.threads <= 4096
    assert info.simd_width_bits in (128, 256, 512) and info.simd_width == info.simd_width_bits // 32
    llc = info.last_level_cache_bytes()
    assert llc is None or 64 * 1024 <= llc <= 2**31
