"""Where a cuda worker's load time goes (2026-11-30, sixth session): imports, context, one NVRTC compile
via compile_module against the old RawModule(code=) + second check compile, the judge's own module."""
import json, sys, time, tempfile, os
t = time.perf_counter
T0 = t()
import numpy  # noqa
import cupy as cp
T1 = t()
cp.cuda.Device(0).use(); cp.zeros(1).sum(); cp.cuda.Device().synchronize()
T2 = t()
from ksearch.targets.cuda_runtime import compile_module
from ksearch.targets.cuda_judge_kernels import JudgeKernels
T3 = t()
c = json.load(open(sys.argv[1]))
src = c["sources"]["kernel.cu"]
names = [l["kernel"] for l in c["launch"]["launches"]]
os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp()
T4 = t(); imgs, fns = compile_module(cp, src, ["-std=c++17"], names); T5 = t(); img = b"".join(imgs)
T4b = t(); compile_module(cp, src, ["-std=c++17", "-DPROBE_ONE=1"], names, threads=1); T5b = t()
mod = cp.RawModule(code=src, options=("-std=c++17", "-DPROBE_OLD=1"), name_expressions=names)
_ = [mod.get_function(n) for n in names]; T6 = t()
from cupy._core.core import assemble_cupy_compiler_options
from cupy.cuda import compiler
compiler.compile_using_nvrtc(src, assemble_cupy_compiler_options(("-std=c++17", "-DPROBE_OLD=2")), name_expressions=names, cache_in_memory=True)
T7 = t()
JudgeKernels(cp)._fn("ks_summary_f32")
T8 = t()
print(f"import numpy+cupy {T1-T0:.2f} s | context {T2-T1:.2f} s | import ksearch runtime {T3-T2:.2f} s")
print(f"one thread {T5b-T4b:.2f} s | ")
print(f"compile_module ({len(names)} instances, cubin {len(img)} B) {T5-T4:.2f} s | old RawModule(code=) {T6-T5:.2f} s + check compile {T7-T6:.2f} s | judge module {T8-T7:.2f} s")
