"""What the worker checks about a cuda candidate that the static rules cannot promise: state kept between calls.

A kernel that can keep anything from one call to the next can replay an answer in the timed repeats (which
run on the same input data) instead of computing it. The static rules (eval/static_rules/cuda.yaml) refuse the
usual spellings, but NVRTC (through CuPy, with ``--device-as-default-execution-space``) makes *any* variable at
file scope or ``static`` in a function a device variable, and a macro can spell ``__device__`` so that no
pattern sees it. So the worker checks what was compiled and what the kernel did:

- `module_state`: the compiled module (a cubin, an ELF file) may hold no object in its global memory sections
  (``.nv.global``, ``.nv.global.init``: ``__device__`` / ``__managed__`` variables, function-scope statics,
  ``__device__ const`` tables and string literals, all writable by a cast) and may call neither the device
  heap (``malloc``/``free``: a block freed by one call is handed out again, contents included, to the next,
  as measured on the H200) nor ``vprintf``. ``__constant__`` data is allowed: writing it faults.
- `CheckedRunner`: before each call's outputs are written back, the kernel's device inputs must still equal
  the data they were bound with (inputs are ``const`` by the ABI, but a cast gets around that, and the timed
  repeats reuse the same device copies: a kernel could park its answer in them).

Either finding raises `KernelRejected` (REJECTED). What remains is documented in docs/evaluation.md.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from ksearch.errors import KernelRejected, PlanError, TargetError
from ksearch.protocol import ArgRef
from ksearch.targets.cuda_launch import ResolvedLaunch, resolve
from ksearch.targets.cuda_runtime import CudaRunner

#: device-side calls that keep or leak state (the device heap outlives a launch) or flood stderr
STATEFUL_CALLS = ("malloc", "free", "__nv_aligned_device_malloc", "vprintf")

_SHT_SYMTAB, _STT_OBJECT, _STT_FUNC, _SHN_UNDEF = 2, 1, 2, 0


def module_state(image: bytes) -> list[str]:
    """What in a compiled CUDA module (a 64-bit cubin) can keep state between calls: the names of objects in
    its ``.nv.global*`` sections and of the `STATEFUL_CALLS` it makes. An image that is not a 64-bit
    little-endian ELF file (PTX) gives []."""
    if image[:4] != b"\x7fELF" or image[4:6] != b"\x02\x01":
        return []
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    # each section: name, type, flags, addr, offset, size, link, info, addralign, entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]

    def cstr(offset: int) -> str:
        return image[offset:image.index(b"\0", offset)].decode(errors="replace")

    names = [cstr(sections[shstrndx][4] + s[0]) for s in sections]
    found: list[str] = []
    for sec in sections:
        if sec[1] != _SHT_SYMTAB:
            continue
        strtab = sections[sec[6]][4]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, st_info, _, st_shndx, _, _ = struct.unpack_from("<IBBHQQ", image, off)
            name, kind = cstr(strtab + st_name), st_info & 0xF
            if kind == _STT_OBJECT and 0 < st_shndx < len(names) and names[st_shndx].startswith(".nv.global"):
                found.append("a string literal" if name.startswith("$str") else name)
            elif kind == _STT_FUNC and st_shndx == _SHN_UNDEF and name in STATEFUL_CALLS:
                found.append(f"{name}()")
    return list(dict.fromkeys(found))


def check_module(images: list[bytes]) -> None:
    """Raise KernelRejected if a compiled module of ``images`` (the cubins `CudaRunner` compiled and loaded)
    can keep state (`module_state`).

    Raises:
        KernelRejected: the module defines global variables or calls the device heap or printf.
        TargetError: an image is not a cubin (an ELF file; PTX would pass `module_state` unread).
    """
    for image in images:
        if image[:4] != b"\x7fELF":
            raise TargetError(f"the compiled module is not a cubin (starts {image[:16]!r}): its state "
                              "cannot be checked (CUPY_COMPILE_WITH_PTX set?)")
    state = list(dict.fromkeys(x for image in images for x in module_state(image)))
    if state:
        raise KernelRejected(
            f"the compiled module keeps state between calls: {', '.join(state[:8])}"
            f"{' ...' if len(state) > 8 else ''} (variables at file scope or `static` in device code, string "
            "literals, and the device heap persist from one call to the next; use a temporary of the launch "
            "plan for scratch, __constant__ for read-only tables)")


class CheckedRunner(CudaRunner):
    """A CudaRunner that, before a call's outputs are written back, verifies that the kernel left its device
    inputs as they were bound (bit for bit, against a host copy taken at binding); and that resolves launch plans
    against the device's shared-memory limit too (a plan error naming the launch, not the driver's
    CUDA_ERROR_INVALID_VALUE)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_shared = int(self.cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))
        self._bound: list[dict] = []  # the input sets of the last bind (the timed repeats rotate among them)
        self._pristine: dict = {}  # name -> the input's data as bound (host memory)

    def _launches(self, axes: dict[str, int]) -> list[ResolvedLaunch]:
        key = tuple(sorted(axes.items()))
        if key not in self._resolved:
            try:
                self._resolved[key] = resolve(self.plan, self.definition, axes, self.max_threads, self.max_shared)
            except PlanError as e:
                raise TargetError(str(e)) from None
        return self._resolved[key]

    def _bind(self, refs: Sequence[ArgRef], copies: int = 1):
        sets, outputs, temps, axes = super()._bind(refs, copies)
        self._bound = sets
        self._pristine = {name: a.get() for name, a in sets[0].items() if isinstance(a, self.cp.ndarray) and a.size}
        return sets, outputs, temps, axes

    def _write_back(self, outputs: dict) -> None:
        # compared on the host: copies only (a CuPy comparison kernel would be compiled afresh in every worker,
        # seconds on its first call)
        for i, inputs in enumerate(self._bound):
            for name, want in self._pristine.items():
                if not np.array_equal(inputs[name].get().view(np.uint8), want.view(np.uint8)):
                    raise KernelRejected(
                        f"the kernel wrote into its input {name!r} on the device (input copy {i + 1} of "
                        f"{len(self._bound)}): inputs are read-only, and a kernel could keep an answer in them "
                        "for the next call on the same buffers")
        super()._write_back(outputs)
