"""What the exported torch modules share: which kernels can be carried out, and the code that calls one.

A kernel goes out in one of two kinds, told apart by its target's facts (`ksearch.targets.base.Target`), never by
its name:

- ``c``: C or C++ sources on the host behind a C ABI (``ctypes`` set, no GPU, no launch plan: the cpu target),
  ``void entry(inputs..., outputs..., axes...)`` (docs/cpu-target.md). The exported module builds it with the
  system compiler (``$CC``/``$CXX``, the target's base flags plus the candidate's) at its first call, caches the
  library under ``$XDG_CACHE_HOME/ksearch-export`` (default ``~/.cache``) by the hash of sources, flags and
  compiler, and calls it through ctypes on contiguous CPU tensors (inputs on another device are copied to the CPU
  and the outputs moved back).
- ``torch``: one Python module whose entry point takes torch tensors in destination-passing style,
  ``run(inputs..., outputs...)`` on the GPU (the triton target). The exported module writes it to the same cache
  (Triton reads a kernel's source from its file) and imports it at the first call.

Other kernels (a CUDA kernel with a launch plan as data, MLX kernels) have no such form yet: `kernel_kind` says
None and each format refuses them in one line.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from ksearch.errors import ExportError
from ksearch.records import Candidate
from ksearch.tasks.definition import Definition


def kernel_kind(candidate: Candidate) -> str | None:
    """``c``, ``torch`` or None for ``candidate``'s target (see the module docstring). Raises ExportError for a
    target this installation does not know."""
    from ksearch.errors import TargetError
    from ksearch.targets import get_target

    try:
        target = get_target(candidate.target)
    except TargetError as e:
        raise ExportError(f"the kernel's target {candidate.target!r} is unknown here: {e}") from None
    if target.ctypes is not None and not target.needs_gpu and not target.takes_launch and not target.runs_mlx:
        return "c"
    if target.ctypes is None and target.torch_device == "cuda" and target.fence_lang == "python" \
            and not target.takes_launch:
        return "torch"
    return None


def axis_sources(definition: Definition) -> dict[str, object]:
    """Per axis of ``definition``: its constant value, or ``(input name, dimension)`` it is read from. Raises
    ExportError for a var axis that is in no input's shape (an exported function could not infer it)."""
    out: dict[str, object] = {}
    for name, axis in definition.axes.items():
        if getattr(axis, "type", "var") == "const":
            out[name] = int(axis.value)
            continue
        for inp, spec in definition.inputs.items():
            if spec.shape and name in spec.shape:
                out[name] = (inp, spec.shape.index(name))
                break
        else:
            raise ExportError(f"axis {name!r} is in no input's shape: the exported function could not infer it")
    return out


def constants(candidate: Candidate, definition: Definition, kind: str) -> dict[str, object]:
    """The literals an exported torch module carries: the kernel (``SOURCES``, ``ENTRY``, ``FLAGS``), the task's
    names, dtypes and shapes (None for a scalar input), and ``AXES`` (`axis_sources`)."""
    flags: list[str] = []
    if kind == "c":
        from ksearch.targets.cpu import BASE_FLAGS

        flags = [*BASE_FLAGS, *candidate.compile_flags]
    return {
        "KIND": kind, "TARGET": candidate.target, "SOURCES": dict(candidate.sources), "ENTRY": candidate.entry_point,
        "FLAGS": flags, "INPUTS": list(definition.inputs), "OUTPUTS": list(definition.outputs),
        "INPUT_DTYPES": {n: s.dtype for n, s in definition.inputs.items()},
        "OUTPUT_DTYPES": {n: s.dtype for n, s in definition.outputs.items()},
        "INPUT_SHAPES": {n: s.shape for n, s in definition.inputs.items()},
        "OUTPUT_SHAPES": {n: s.shape or [] for n, s in definition.outputs.items()},
        "AXES": axis_sources(definition),
    }


def literals(consts: dict[str, object]) -> str:
    return "\n".join(f"{k} = {v!r}" for k, v in consts.items())


#: the kernel's loader and caller for each kind: ``_kernel(inputs, outputs, axes)`` (lists in definition order)
RUNTIME = {"c": '''
def _cache():
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ksearch-export"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _entry():
    """The kernel's entry point, built once with the system compiler. Raises RuntimeError when the build fails."""
    if not _LOADED:
        cxx = any(n.endswith((".cpp", ".cc", ".cxx")) for n in SOURCES)
        cc = os.environ.get("CXX", "c++") if cxx else os.environ.get("CC", "cc")
        key = hashlib.sha256(repr((sorted(SOURCES.items()), FLAGS, cc)).encode()).hexdigest()[:24]
        lib = _cache() / f"{key}.so"
        if not lib.is_file():
            with tempfile.TemporaryDirectory(dir=_cache()) as tmp:
                for name, text in SOURCES.items():
                    (Path(tmp) / name).write_text(text)
                srcs = sorted(n for n in SOURCES if n.endswith((".c", ".cpp", ".cc", ".cxx")))
                built = subprocess.run([cc, *FLAGS, *srcs, "-lm", "-o", "kernel.so"], cwd=tmp, capture_output=True,
                                       text=True)
                if built.returncode != 0:
                    raise RuntimeError(f"building the kernel with {cc} failed:\\n{built.stderr[-4000:]}")
                os.replace(Path(tmp) / "kernel.so", lib)
        fn = getattr(ctypes.CDLL(str(lib)), ENTRY)
        fn.restype = None
        _LOADED.append(fn)
    return _LOADED[0]


def _kernel(inputs, outputs, axes):
    args = []
    for name, x in zip(INPUTS, inputs):
        if INPUT_SHAPES[name] is None:
            args.append(ctypes.c_double(x) if INPUT_DTYPES[name].startswith("float") else ctypes.c_int64(int(x)))
        else:
            args.append(ctypes.c_void_p(x.data_ptr()))
    args += [ctypes.c_void_p(y.data_ptr()) for y in outputs]
    _entry()(*args, *[ctypes.c_int64(a) for a in axes])
''', "torch": '''
def _entry():
    """The kernel module's entry point, imported once from a file (Triton reads a kernel's source there)."""
    if not _LOADED:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ksearch-export"
        key = hashlib.sha256(repr(sorted(SOURCES.items())).encode()).hexdigest()[:24]
        (root / key).mkdir(parents=True, exist_ok=True)
        (name, text), = SOURCES.items()
        path = root / key / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"ksearch_kernel_{key}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED.append(getattr(module, ENTRY))
    return _LOADED[0]


def _kernel(inputs, outputs, axes):
    _entry()(*inputs, *outputs)
'''}

#: imports of each kind's runtime
IMPORTS = {"c": ["ctypes", "hashlib", "os", "subprocess", "tempfile"], "torch": ["hashlib", "importlib.util", "os"]}

#: ``_call(named)``: the task's inputs by name -> its outputs (a tuple in definition order), for either kind
CALL = '''

def _dtype(name):
    return getattr(torch, name, None) or getattr(torch, name + "fn")


def _call(named):
    """The task's inputs by name (tensors, or numbers for scalar inputs) -> a tuple of its outputs. Raises
    ValueError for inputs whose shapes disagree with the task's."""
    device = next((x.device for x in named.values() if isinstance(x, torch.Tensor)), torch.device("cpu"))
    here = torch.device("cpu") if KIND == "c" else device
    axes = {}
    for name, where in AXES.items():
        axes[name] = where if isinstance(where, int) else int(named[where[0]].shape[where[1]])
    inputs = []
    for name in INPUTS:
        x = named[name]
        if INPUT_SHAPES[name] is None:
            inputs.append(x.item() if isinstance(x, torch.Tensor) else x)
            continue
        want = tuple(axes[a] for a in INPUT_SHAPES[name])
        if tuple(x.shape) != want:
            raise ValueError(f"{name}: shape {tuple(x.shape)}, expected {want} ({INPUT_SHAPES[name]} with {axes})")
        inputs.append(x.detach().to(device=here, dtype=_dtype(INPUT_DTYPES[name])).contiguous())
    outputs = [torch.empty(tuple(axes[a] for a in OUTPUT_SHAPES[n]), dtype=_dtype(OUTPUT_DTYPES[n]), device=here)
               for n in OUTPUTS]
    _kernel(inputs, outputs, [axes[a] for a in AXES])
    return tuple(y.to(device) for y in outputs)
'''


def module(doc: str, kind: str, consts: dict[str, object], tail: str) -> str:
    """An exported module's text: ``doc`` as its docstring, ``kind``'s imports, ``consts`` as literals, the kernel's
    runtime and `CALL`, then ``tail`` (the format's own code)."""
    text = "\n".join(textwrap.fill(line, 110) for line in doc.split("\n"))
    lines = [f'"""{text}"""', ""] + [f"import {m}" for m in IMPORTS[kind]] + ["from pathlib import Path", "",
                                                                              "import torch", "", ""]
    return "\n".join(lines) + literals(consts) + "\n_LOADED = []\n" + RUNTIME[kind] + CALL + tail


def write_text(out: Path, text: str) -> Path:
    """Write ``text`` at ``out`` whole or not at all (a temporary beside it, renamed). Raises ExportError naming the
    path when it cannot be written."""
    out = Path(out)
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text)
        partial.replace(out)
    except OSError as e:
        if partial.parent.is_dir():
            partial.unlink(missing_ok=True)
        raise ExportError(f"cannot write {out}: {e.strerror or e}") from None
    return out
