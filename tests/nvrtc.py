"""Compile CUDA C++ with NVRTC, as the cuda target's worker does on the GPU machine (CuPy's RawModule), without a
GPU: NVRTC does not include the math headers nvcc does implicitly (INFINITY, for instance, is undefined), so a
kernel that nvcc compiles can still fail there. Uses the NVRTC of the ``nvidia-cuda-nvrtc`` wheel (test extras)
through ctypes, and the headers of the ``nvidia-cuda-runtime`` wheel (test extras) as CuPy on the GPU machine has
them (without ``crt/``: ``mma.h``'s WMMA does not compile there), else a local toolkit's; ``nvrtc_status()`` says
why not when either is missing."""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
from pathlib import Path

_LIB = None


def _toolkit_include() -> str | None:
    """The CUDA headers CuPy on the GPU machine compiles with: the ``nvidia-cuda-runtime`` wheel's (CuPy's CUDA
    path there is site-packages/nvidia/cu13, which has ``mma.h`` but not the ``crt/mma.h`` it includes), else a
    local toolkit's."""
    try:
        import nvidia
        for base in nvidia.__path__:
            for inc in sorted(glob.glob(os.path.join(base, "cu*", "include")), reverse=True):
                if Path(inc, "cuda_fp16.h").exists():
                    return inc
    except ImportError:
        pass
    for root in filter(None, [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME")]):
        if Path(root, "include", "cuda_fp16.h").exists():
            return str(Path(root, "include"))
    nvcc = shutil.which("nvcc")
    candidates = sorted(glob.glob("/usr/local/cuda*/include"), reverse=True)
    if nvcc:
        candidates.insert(0, str(Path(os.path.realpath(nvcc)).parent.parent / "include"))
    for inc in candidates:
        if Path(inc, "cuda_fp16.h").exists():
            return inc
    return None


def _library():
    global _LIB
    if _LIB is None:
        try:
            import nvidia
        except ImportError:
            return None
        for base in nvidia.__path__:
            found = sorted(glob.glob(os.path.join(base, "cu*", "lib", "libnvrtc.so.*")))
            found = [f for f in found if "alt" not in f and "builtins" not in f]
            if found:
                try:
                    for builtins in glob.glob(os.path.join(os.path.dirname(found[0]), "libnvrtc-builtins.so.*")):
                        if "alt" not in builtins:  # NVRTC dlopens it by name: load it first, globally
                            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                    _LIB = ctypes.CDLL(found[0])
                except OSError:  # a library that does not load here (glibc, architecture): as if missing
                    return None
                break
    return _LIB


def nvrtc_status() -> str | None:
    """None when nvrtc_compile can run, else why not."""
    if _library() is None:
        return "NVRTC not installed (pip install nvidia-cuda-nvrtc)"
    if _toolkit_include() is None:
        return "no CUDA toolkit headers (cuda_fp16.h) found"
    return None


def nvrtc_compile(source: str, options: list[str] | tuple[str, ...] = ("-std=c++17",), arch: str = "sm_90",
                  names: list[str] | tuple[str, ...] = (), cubin: list | None = None) -> tuple[bool, str]:
    """(compiled, log) for ``source`` under NVRTC with ``options`` plus ``-arch`` and the toolkit's include dir.
    ``names``: kernel name expressions (``flash_fwd<64, 128>``), instantiated as CuPy's RawModule does.
    ``cubin``: a list the compiled image (bytes, an ELF cubin for a real ``sm_`` arch) is appended to."""
    lib = _library()
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None)
    if rc != 0:
        return False, f"nvrtcCreateProgram failed ({rc})"
    for name in names:
        lib.nvrtcAddNameExpression(prog, name.encode())
    opts = [*options, f"-arch={arch}", f"-I{_toolkit_include()}"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    if rc == 0 and cubin is not None:
        n = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        image = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetCUBIN(prog, image)
        cubin.append(image.raw)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc == 0, buf.value.decode(errors="replace")
