"""The mlx targets: MLX custom kernels, Metal (``mlx-metal``) or CUDA (``mlx-cuda``) kernel bodies.

A candidate is a kernel *body* (MLX generates the signature) plus its launch as data; the format, the names
the body sees and the limits are in docs/mlx-target.md. ``mlx`` is not a target of its own: `resolve_mlx`
turns it into ``mlx-metal`` or ``mlx-cuda`` for the machine at hand (the run records the resolved name).

The controller's side (`MlxTarget.compile`) needs neither MLX nor a GPU: it checks the files, splits a header
off the body (a ``header.metal``/``header.cuh`` file, or the part of the body file above a line
``// ksearch: kernel body``), validates the launch (`parse_launch`) and writes the artifact the worker loads,
``$KSEARCH_HOME/cache/<target>/<candidate id>.json``. MLX compiles the kernel in the worker, at its first call
(a check call, never a timed one): a compiler error there is a COMPILE_ERROR with MLX's message.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ksearch import config
from ksearch.errors import PlanError, TargetError
from ksearch.jail.sandbox import CUDA_ENV, NVIDIA_DEVICES
from ksearch.records import Candidate
from ksearch.targets.abi_types import METAL_TYPES, MLX_CUDA_TYPES, c_type
from ksearch.targets.base import PROMPTS_DIR, CompileResult, OfflineChecks, DeviceTargetDefaults
# launch expressions and their errors as the cuda target has them: the same rules, the same messages
from ksearch.targets.cuda_launch import Expr, _int, field_errors
from ksearch.tasks.definition import Definition

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec

#: the line that separates a header (helper functions, includes) from the kernel body in one source file
BODY_MARKER = "// ksearch: kernel body"

BACKENDS = {"mlx-metal": "metal", "mlx-cuda": "cuda"}
BODY_FILE = {"mlx-metal": "kernel.metal", "mlx-cuda": "kernel.cu"}
HEADER_FILE = {"mlx-metal": "header.metal", "mlx-cuda": "header.cuh"}
#: threads per threadgroup: Metal's maxTotalThreadsPerThreadgroup on Apple GPUs and CUDA's per block
MAX_THREADS = 1024
#: MLX dtypes the runner can move between NumPy and MLX
DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "int16", "int8", "uint8", "uint32", "bool")

class MlxLaunch(BaseModel):
    """How MLX launches the body: ``grid`` (threads in total per axis, MLX's convention), ``threadgroup``
    (threads per threadgroup / block), ``template`` (extra int constants), ``shared_memory`` (mlx-cuda: bytes
    of dynamic shared memory). Every value an integer or an expression over the task's axes."""

    model_config = ConfigDict(extra="forbid")

    grid: list[Expr] = Field(min_length=1, max_length=3)
    threadgroup: list[Expr] = Field(min_length=1, max_length=3)
    template: dict[str, Expr] = Field(default_factory=dict)
    shared_memory: Expr = 0
    #: ``template``: the axes are int template constants (one compile per distinct shape); ``shapes``: they
    #: are not passed, the body reads them from its inputs' shapes (``u_shape[2]``; MLX passes ``<input>_shape``
    #: for every input the body names), so one compile serves every workload
    axes: Literal["template", "shapes"] = "template"


@dataclass(frozen=True)
class ResolvedMlxLaunch:
    """A launch with every expression evaluated for one workload's axes."""

    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    template: tuple[tuple[str, int], ...]
    shared_memory: int


def parse_launch(launch: dict, definition: Definition, target: str) -> MlxLaunch:
    """Validate ``Candidate.launch`` for an mlx target.

    Raises:
        PlanError: the field and what is wrong (``grid.1: ...``), a template constant that reuses an input,
            output or axis name or is not a C identifier, ``shared_memory`` on mlx-metal.
    """
    if not launch:
        raise PlanError(f"the {target} target needs a launch (grid, threadgroup): see docs/mlx-target.md")
    try:
        plan = MlxLaunch.model_validate(launch)
    except ValidationError as e:
        raise field_errors("launch", e) from None
    taken = set(definition.inputs) | set(definition.outputs) | set(definition.axes)
    for name in plan.template:
        if not name.isidentifier():
            raise PlanError(f"launch: template constant {name!r} is not a C identifier")
        if name in taken:
            raise PlanError(f"launch: template constant {name!r} reuses the name of an input, output or axis "
                            "(the axes are passed as template constants already)")
    if target == "mlx-metal" and plan.shared_memory not in (0, "0"):
        raise PlanError("launch: shared_memory is for mlx-cuda; Metal bodies declare threadgroup arrays")
    return plan


def resolve_launch(plan: MlxLaunch, axes: dict[str, int], max_threads: int = MAX_THREADS) -> ResolvedMlxLaunch:
    """Evaluate the launch for these axes: the axes themselves first among the template constants.

    Raises:
        PlanError: a value that is not a positive integer (``template`` and ``shared_memory`` may be 0), a
            threadgroup over ``max_threads`` threads, a grid dimension over 2**31 - 1.
    """
    grid = [_int(x, axes, f"grid.{i}", 1) for i, x in enumerate(plan.grid)] + [1] * (3 - len(plan.grid))
    group = [_int(x, axes, f"threadgroup.{i}", 1) for i, x in enumerate(plan.threadgroup)]
    group += [1] * (3 - len(group))
    if math.prod(group) > max_threads:
        raise PlanError(f"threadgroup: {group} is {math.prod(group)} threads, over the {max_threads} per "
                        "threadgroup (Metal) / block (CUDA)")
    for i, n in enumerate(grid):
        if n > 2**31 - 1:
            raise PlanError(f"grid.{i}: {n} threads for axes {axes}, over 2**31 - 1")
    template = (tuple(axes.items()) if plan.axes == "template" else ()) + \
        tuple((k, _int(v, axes, f"template.{k}", 0)) for k, v in plan.template.items())
    shared = _int(plan.shared_memory, axes, "shared_memory", 0)
    return ResolvedMlxLaunch(tuple(grid), tuple(group), template, shared)


def split_sources(candidate: Candidate, target: str) -> tuple[str, str]:
    """(header, body) of a candidate: one body file (``*.metal`` for mlx-metal, ``*.cu`` for mlx-cuda; the
    packs name it kernel.metal / kernel.cu) and at most one header file (header.metal / header.cuh), whose
    text comes first, then the part of the body file above `BODY_MARKER`.

    Raises:
        PlanError: not exactly one body file, another file, or an empty body.
    """
    header_name = HEADER_FILE[target]
    ext = Path(BODY_FILE[target]).suffix
    bodies = sorted(n for n in candidate.sources if n != header_name and n.endswith(ext))
    extra = sorted(set(candidate.sources) - set(bodies) - {header_name})
    if len(bodies) != 1 or extra:
        raise PlanError(f"the {target} target takes one kernel body file (*{ext}, e.g. {BODY_FILE[target]}) and "
                        f"optionally {header_name}; got {sorted(candidate.sources)}")
    header = candidate.sources.get(header_name, "")
    body = candidate.sources[bodies[0]]
    lines = body.splitlines(keepends=True)
    cut = next((i for i, line in enumerate(lines) if line.strip() == BODY_MARKER), None)
    if cut is not None:
        header = header + "".join(lines[:cut])
        body = "".join(lines[cut + 1:])
    if not body.strip():
        raise PlanError(f"{bodies[0]}: the kernel body is empty")
    return header, body


def mlx_status(target: str) -> str | None:
    """None when MLX imports and its backend for ``target`` (mlx-metal: Metal, mlx-cuda: CUDA) is
    available, else why not."""
    try:
        import mlx.core as mx
    except ImportError:
        return ("mlx is not installed (Apple silicon: pip install mlx; NVIDIA: pip install mlx-cuda-13 or "
                "'mlx[cuda]')")
    except Exception as e:
        return f"mlx does not import: {type(e).__name__}: {e}"
    backend = BACKENDS[target]
    try:
        ok = bool(mx.metal.is_available()) if backend == "metal" else bool(mx.cuda.is_available())
    except Exception as e:  # an mlx without that backend module
        return f"mlx {getattr(mx, '__version__', '?')} has no {backend} backend ({type(e).__name__}: {e})"
    if not ok:
        where = "an Apple GPU (Metal)" if backend == "metal" else "an NVIDIA GPU with MLX's CUDA backend (mlx-cuda)"
        return f"MLX's {backend} backend is not available here ({target} needs {where})"
    return None


def resolve_mlx(name: str) -> str:
    """``mlx`` -> ``mlx-metal`` when MLX's Metal backend is available, else ``mlx-cuda`` when its CUDA backend
    is; other names unchanged. Raises TargetError listing the targets this machine can run when neither is."""
    if name != "mlx":
        return name
    reasons = {}
    for target in ("mlx-metal", "mlx-cuda"):
        why = mlx_status(target)
        if why is None:
            return target
        reasons[target] = why
    from ksearch.targets.base import available_targets

    here = ", ".join(available_targets()) or "none"
    raise TargetError("--target mlx needs MLX with its Metal backend (Apple silicon) or its CUDA backend (NVIDIA): "
                      f"{reasons['mlx-metal']}; {reasons['mlx-cuda']}. Targets available on this machine: {here}")


class MlxTarget(DeviceTargetDefaults):
    """``mlx-metal`` or ``mlx-cuda`` (see the module docstring)."""

    takes_launch = True
    launch_keys = "grid, threadgroup"
    hardware_kind = "gpu"
    needs_gpu = True
    spare_workers = False
    runs_mlx = True

    def __init__(self, name: str):
        if name not in BACKENDS:
            raise TargetError(f"unknown mlx target {name!r}; known: {sorted(BACKENDS)}")
        self.name = name
        self.backend = BACKENDS[name]
        metal = self.backend == "metal"
        self.summary = ("the Metal body of an MLX custom kernel on an Apple GPU, mx.fast.metal_kernel" if metal else
                        "the CUDA body of an MLX custom kernel through MLX's CUDA backend, mx.fast.cuda_kernel")
        self.naive_file = BODY_FILE[name]
        self.source_suffixes: tuple[str, ...] = (".metal",) if metal else (".cu", ".cuh")
        self.fence_lang = "metal" if metal else "cuda"
        self.fence_langs = {ext: self.fence_lang for ext in self.source_suffixes}
        langs = ("metal", "msl", "cpp", "c++") if metal else ("cuda", "cu", "cpp", "c++")
        self.fence_files = {lang: self.naive_file for lang in langs}
        self.ctypes = METAL_TYPES if metal else MLX_CUDA_TYPES
        #: MLX's CUDA backend reaches the NVIDIA driver as CuPy does; Metal needs no device node
        self.gpu_devices: tuple[str, ...] = () if metal else NVIDIA_DEVICES
        self.gpu_env: tuple[str, ...] = () if metal else CUDA_ENV
        self.rule_family = name  # mlx-metal.yaml includes metal.yaml
        self.limit_family = "metal" if metal else "cuda"
        self.translation_map: str | None = "metal" if metal else None
        #: torch's SDPA baseline runs on the NVIDIA GPU beside mlx-cuda; beside mlx-metal it is MLX's own
        self.torch_device = "cpu" if metal else "cuda"
        #: the offline proposer's candidates are checked statically where no Apple GPU is (a Linux machine)
        self.prompt_template: Path | None = PROMPTS_DIR / "mlx.j2"
        self.reply_format = (f"one ```{self.fence_lang} block ({self.naive_file}: the body, helpers above a line "
                             f"`{BODY_MARKER}`) and one ```yaml block with the launch")
        self.checks_without_device = OfflineChecks("Metal", "an Apple GPU with MLX",
                                                   "on a Mac run `ksearch run {task} --target mlx`") if metal else None

    def available(self) -> str | None:
        return mlx_status(self.name)

    def abi(self, definition: Definition) -> str:
        """The signature MLX generates around a candidate's body (the candidate writes only the body), types
        from the target's dialect (`ctypes`, `abi_types`)."""
        metal = self.backend == "metal"
        space = ("const device ", "device ") if metal else ("const ", "")
        params = [f"{space[0]}{c_type(self.ctypes, s.dtype)}* {n}" for n, s in definition.inputs.items()]
        params += [f"{space[1]}{c_type(self.ctypes, s.dtype)}* {n}" for n, s in definition.outputs.items()]
        consts = " ".join(f"constexpr int {a} = ...;" for a in definition.axes)
        head = "[[kernel]] void custom_kernel" if metal else "__global__ void custom_kernel"
        extra = ", uint3 thread_position_in_grid [[thread_position_in_grid]], ... (the attributes the body names)" \
            if metal else ""
        return (f"// generated by MLX, not by you:\n{head}({', '.join(params)}{extra}) {{\n"
                f"  {consts}  // launch axes: template (default)\n  /* your body */\n}}")

    def hardware_spec(self) -> HardwareSpec:
        """mlx-cuda: the NVIDIA GPU measured through CuPy's probes where CuPy sees it, else the hardware catalog's
        figures for the GPU MLX names; mlx-metal: the catalog's for the Apple GPU MLX names. Raises HardwareError
        when MLX is missing or its GPU is not in the catalog."""
        if self.backend == "cuda":
            from ksearch.targets import cuda

            if cuda.cupy_status() is None:  # the same NVIDIA GPU, probed through CuPy: measured ceilings
                from ksearch.hardware.gpu import load_or_measure_gpu

                return load_or_measure_gpu()
            return _catalog_spec("NVIDIA GPU")
        return _catalog_spec("Apple GPU")

    def launch_problem(self, candidate: Candidate, definition: Definition, axes: dict[str, int]) -> str | None:
        """Why the launch does not resolve for these axes (`parse_launch`, `resolve_launch`), or None."""
        try:
            resolve_launch(parse_launch(candidate.launch, definition, self.name), axes)
        except PlanError as e:
            return str(e)
        return None

    def compile(self, candidate: Candidate, definition: Definition, timeout_s: float = 120.0) -> CompileResult:
        """Check the files and the launch and write the artifact the worker loads (MLX compiles there).
        A bad file set, launch or flag is ok=False with the reason."""
        t0 = time.perf_counter()
        if candidate.compile_flags:
            return CompileResult(False, None, f"the {self.name} target takes no compile flags (MLX compiles the "
                                 f"kernel with its own options); got {candidate.compile_flags}", 0.0)
        try:
            header, body = split_sources(candidate, self.name)
            parse_launch(candidate.launch, definition, self.name)
        except PlanError as e:
            return CompileResult(False, None, str(e), 0.0)
        for name, spec in list(definition.inputs.items()) + list(definition.outputs.items()):
            if spec.dtype not in DTYPES:
                return CompileResult(False, None, f"{name}: dtype {spec.dtype!r} is not supported by the {self.name} "
                                     f"target ({DTYPES})", 0.0)
        cache = config.home_dir() / "cache" / self.name
        cache.mkdir(parents=True, exist_ok=True)
        artifact = cache / f"{candidate.id}.json"
        if artifact.is_file():
            return CompileResult(True, artifact, "(cached; MLX compiles in the worker)", time.perf_counter() - t0,
                                 cached=True)
        payload = {"target": self.name, "header": header, "body": body, "launch": candidate.launch,
                   "kernel_name": f"ksearch_{candidate.id}"}
        partial = artifact.with_suffix(f".{time.monotonic_ns()}.tmp")
        partial.write_text(json.dumps(payload))
        partial.replace(artifact)
        return CompileResult(True, artifact, "(MLX compiles in the worker)", time.perf_counter() - t0)

    def load(self, artifact: Path, candidate: Candidate, definition: Definition):
        """Inside the worker: a `ksearch.targets.mlx_runtime.MlxRunner` for the artifact.

        Raises:
            TargetError: MLX or its backend is missing in the worker.
        """
        from ksearch.targets.mlx_runtime import MlxRunner

        payload = json.loads(Path(artifact).read_text())
        return MlxRunner(payload, definition)


def _catalog_spec(what: str) -> HardwareSpec:
    """The catalog's spec of the GPU MLX reports (``mx.device_info()["device_name"]``: "Apple M2 Max", "NVIDIA
    H200"; `ksearch.hardware.cache.catalog_spec`). Raises HardwareError when MLX is missing or the GPU is not in
    the catalog."""
    from ksearch.errors import HardwareError
    from ksearch.hardware.cache import catalog_spec

    try:
        import mlx.core as mx

        name = str(mx.device_info().get("device_name", ""))
    except Exception as e:
        raise HardwareError(f"cannot ask MLX for the {what}'s name: {type(e).__name__}: {e}") from None
    return catalog_spec(name, what)


#: the targets this module provides (`ksearch.targets.base.get_target`), the name that stands for one of them
#: on this machine, and where they are listed
TARGETS = {"mlx-metal": partial(MlxTarget, "mlx-metal"), "mlx-cuda": partial(MlxTarget, "mlx-cuda")}
ALIASES = {"mlx": resolve_mlx}
ORDER = 30


#: what stands in for MLX's device header when nvcc compiles an mlx-cuda translation unit outside MLX
NVCC_PRELUDE = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cooperative_groups.h>\n#include <cstdint>\n"
                "struct Shape { int32_t d[10]; __host__ __device__ int32_t operator[](int i) const { return d[i]; } };\n")


def mlx_cuda_translation_unit(candidate: Candidate, definition: Definition, axes: dict[str, int],
                              prelude: str = NVCC_PRELUDE) -> str:
    """The CUDA translation unit MLX builds for an mlx-cuda candidate (as mlx 0.32's
    backend/cuda/custom_kernel.cpp does: header, then in ``namespace mlx::core::cu`` a ``__global__``
    function taking the inputs as ``const T*`` and the outputs as ``T*``, the template constants as
    ``constexpr int`` at the top of the body), with ``prelude`` in place of MLX's own device header. For
    compiling a candidate with nvcc where MLX's CUDA backend is absent (tests, debugging); MLX's own build is
    the one that counts. Raises PlanError for a bad file set or launch."""
    header, body = split_sources(candidate, "mlx-cuda")
    launch = resolve_launch(parse_launch(candidate.launch, definition, "mlx-cuda"), axes)
    params = []
    for n, spec in definition.inputs.items():
        params.append(f"    const {MLX_CUDA_TYPES[spec.dtype]}* {n}")
        if spec.shape and f"{n}_shape" in body:  # as MLX: the shape of an input the body names
            params.append(f"    const __grid_constant__ Shape {n}_shape")
    params += [f"    {MLX_CUDA_TYPES[s.dtype]}* {n}" for n, s in definition.outputs.items()]
    consts = "".join(f"  constexpr int {k} = {v};\n" for k, v in launch.template)
    return (f"{prelude}{header}\nnamespace mlx::core::cu {{\n\nnamespace cg = cooperative_groups;\n\n"
            f"__global__ void custom_kernel_ksearch(\n" + ",\n".join(params) + ") {\n" + consts + "\n" + body +
            "\n}\n\n} // namespace mlx::core::cu\n")
