"""The target contract: compile in the parent, load and call in the worker.

``compile`` runs in the controller's process (the compiler is a subprocess with a timeout) and returns an
artifact path. ``load`` runs inside the sandboxed worker and returns a `Runner`, the one contract the worker
(`ksearch.eval.worker`) drives every target through: it says whose clock times it and takes the protocol's
requests (`ksearch.protocol`) as method calls.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, Sequence

from ksearch.errors import TargetError, UnsupportedOp
from ksearch.protocol import ArgRef, Clock, TimingPlan
from ksearch.records import Candidate, Profile
from ksearch.tasks.definition import Definition

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec
    from ksearch.tasks.loader import Task


@dataclass
class CompileResult:
    """``ok``: whether it built; ``artifact``: the built file; ``log``: compiler output; ``seconds``; ``cached``."""

    ok: bool
    artifact: Path | None
    log: str
    seconds: float
    cached: bool = False


@dataclass(frozen=True)
class OfflineChecks:
    """How ``ksearch run`` speaks of a target whose candidates it checks without the device (`Target`):
    ``kernels``: the kernels' language ("Metal"); ``device``: what judging them needs ("an Apple GPU with MLX");
    ``elsewhere``: where to run instead, ``{task}`` standing for the task ("on a Mac run `ksearch run {task}
    --target mlx`")."""

    kernels: str
    device: str
    elsewhere: str


class Target(Protocol):
    """A target: compiles, loads and calls candidates, and answers every fact about itself that the rest of
    ksearch needs (nothing outside ``ksearch.targets`` branches on a target's name; tests/test_target_names.py).

    A target lives in ``ksearch/targets/<module>.py`` (a module name without an underscore, not ``base``; helpers
    carry one: cuda_runtime.py), which declares ``TARGETS`` (concrete name -> factory of its Target), optionally
    ``ALIASES`` (a name that stands for one of them on this machine -> its resolver, ``mlx``) and ``ORDER`` (where
    its names are listed; 50 when absent). `get_target` finds it by name.
    """

    #: the concrete name (``--target``, ``Candidate.target``, the knowledge pack's and rule file's directory)
    name: str
    #: one line for ``--target`` help: what kernels it runs, where, through what
    summary: str
    #: file name suffixes a candidate's source files may have (a reply's named block must have one)
    source_suffixes: tuple[str, ...]
    #: suffix -> the Markdown fence language a source file is shown in (``.cu`` -> ``cuda``)
    fence_langs: dict[str, str]
    #: fence language -> the file an unnamed block of it becomes in a model's reply (``cpp`` -> ``kernel.cpp``);
    #: several files among the values are alternatives (C or C++): a reply may hold only one of them
    fence_files: dict[str, str]
    #: the fence language a prompt asks for (and error messages name)
    fence_lang: str
    #: the file the task's naive kernel (``naive.<name>.<ext>``) is given, the main file a prompt names
    naive_file: str
    #: whether a candidate carries a launch plan as data (``Candidate.launch``; a reply's ```yaml block;
    #: ``naive.<name>.launch.yaml``)
    takes_launch: bool
    #: the top-level keys of its launch plan, for messages ("" without one)
    launch_keys: str
    #: the dtype dialect of its ABI, dtype -> C type (one of `ksearch.targets.abi_types`' tables, shared by the
    #: targets that speak it, or its own); None when its kernels take no C types
    ctypes: Mapping[str, str] | None
    #: what its hardware spec describes: ``cpu`` or ``gpu`` (`ksearch.hardware.spec.HardwareSpec.kind`)
    hardware_kind: Literal["cpu", "gpu"]
    #: whether its worker must reach the GPU (`ksearch.jail.sandbox.Policy.gpu`; the judge then turns the
    #: namespaces and seccomp off: `ksearch.eval.evaluator.Evaluator.start_worker`)
    needs_gpu: bool
    #: with ``needs_gpu``: glob patterns of the device nodes its worker uses (NVIDIA's: ``/dev/nvidia*``, ...;
    #: `Policy.gpu_devices`), and the environment variables its GPU runtime needs kept (`Policy.gpu_env`)
    gpu_devices: tuple[str, ...]
    gpu_env: tuple[str, ...]
    #: whether workers started before the candidate is known save time (spare workers: the cpu's do, a GPU
    #: worker's time goes to loading the kernel, which no spare can do ahead)
    spare_workers: bool
    #: the static rule file its candidates are checked against (``eval/static_rules/<family>.yaml`` and
    #: ``<family>.symbols.yaml``); None: no static rules
    rule_family: str | None
    #: the rule file whose hard limits (shared / threadgroup memory, threads per group) its kernels hit on the
    #: device (triton: ``cuda``, mlx-metal: ``metal``); None: no limits
    limit_family: str | None
    #: the translation map (``knowledge/translation/cuda-to-<map>.yaml``) that leads to its kernels; None: none
    #: (cuda is the source of every map)
    translation_map: str | None
    #: the torch device a framework baseline runs on in a run on this target (``cuda``: its kernels run on an
    #: NVIDIA GPU; else ``cpu``), given to baselines as ``TORCH_DEVICE``
    torch_device: str
    #: whether its kernels run through MLX (a baseline written for MLX compares with them: ``RUNS_MLX``)
    runs_mlx: bool
    #: its section of the llm proposer's prompts, how a kernel for it is called and built: a Jinja template
    #: (``ksearch/targets/prompts/<module>.j2``) rendered with ``target`` and ``task``
    #: (`ksearch.proposers.llm.context.task_view`); None: no section
    prompt_template: Path | None
    #: the compile flags a candidate may add, in words for the coder's prompt (its reply's ```flags block); None:
    #: its candidates take none from the coder
    flags_help: str | None
    #: what a coder's reply must hold, for the prompts ("one ```cuda block (kernel.cu) and one ```yaml block ...")
    reply_format: str
    #: None, or: its device absent here, ``ksearch run`` with the offline proposer generates the search's first
    #: candidates and checks them statically (`ksearch.search.static_pass`), then stops, in these words
    checks_without_device: OfflineChecks | None
    #: the preprocessor's view of a candidate's own lines for the static checks (`ksearch.eval.static_checks`'
    #: ``Expander``: the cpu target runs the C preprocessor in the compile jail), or None: the sources as written
    expand: Callable[[Candidate], Any] | None

    def available(self) -> str | None:
        """None when this machine can run the target, else the reason it cannot."""

    def evict_library(self) -> Path | None:
        """The judge's cache-eviction library for host memory (``targets/native/evict.c``, built once), which the
        worker loads before the kernel and hands to the runner (`Runner.evict`); None: the runner's arguments are
        not host memory the judge evicts line by line (device memory), or the library cannot be built here (a
        controller-clock runner then writes a buffer)."""

    def abi(self, definition: Definition) -> str:
        """The entry point's calling convention for ``definition``, as code for a prompt (a C prototype, the
        signature MLX generates around a body, a Python call)."""

    def naive_candidate(self, task: Task) -> Candidate | None:
        """The task's naive kernel for this target (``meta.role`` ``naive``), None when the task ships none."""

    def hardware_spec(self) -> HardwareSpec:
        """The spec its roofline comes from (measured, or the hardware catalog's). Raises HardwareError (or
        TargetError) naming what is missing."""

    def launch_problem(self, candidate: Candidate, definition: Definition, axes: dict[str, int]) -> str | None:
        """Why the candidate's launch cannot run a workload with these axes, or None (also for a target without
        launch plans); for checks made without the device (`ksearch.search.static_pass`)."""

    def compile(self, candidate: Candidate, definition: Definition, timeout_s: float) -> CompileResult: ...

    def compile_report(self, candidate: Candidate, definition: Definition, timeout_s: float) -> Profile | None:
        """What the compiler says of the candidate's code, for the prompts (the cpu target: its vectorizer's report,
        from a build like `compile`'s whose flags change no code); asked by the judge for a passing candidate when
        profiling is on (`ksearch.eval.evaluator.EvalConfig.profile`). None: the target has no such report. A report
        that cannot be made is a Profile with its ``error``; never raises for the candidate's sake."""

    def profiler(self) -> RunProfiler | None:
        """The profiler a passing candidate's worker is run under once, untimed, when profiling is on (cuda: Nsight
        Compute); None: the target has none (an installed one missing here is the RunProfiler's ``available``)."""

    def load(self, artifact: Path, candidate: Candidate, definition: Definition) -> Runner:
        """Inside the worker: the candidate's `Runner` (its arguments in definition order: inputs, outputs,
        axes)."""


class RunProfiler(Protocol):
    """A profiler the judge runs a candidate's worker under (`Target.profiler`; `ksearch.eval.profiling`): the
    worker's own program, loading the candidate as it always does, started by the profiler, which writes its
    report to a file when the program ends. One call of the candidate on one workload is profiled; nothing of it
    is timed or judged."""

    #: the tool and its version, as `Profile.tool` names it ("ncu 2025.3.1")
    tool: str

    def available(self) -> str | None:
        """None when the tool is installed here, else why not (then `Profile.error` says so)."""

    def command(self, candidate: Candidate, definition: Definition, report: Path) -> list[str]:
        """The argv that starts a program under the profiler (the worker's command line is appended), its report
        written to ``report``."""

    def read(self, report: Path, candidate: Candidate, workload: str) -> list[Profile]:
        """The profiles in ``report`` (one per kernel of the candidate's that ran; a Profile whose ``error`` says
        why when there is none)."""


#: the judge's line-by-line cache eviction of host memory, ``ksearch_evict(address, bytes)``
#: (`ksearch.targets.cpu.CpuTarget.evict_library`)
Evict = Callable[[int, int], None]


class Runner(Protocol):
    """A loaded candidate inside the worker, whatever its target: what `Target.load` returns.

    ``clock`` says who times it. ``controller``: the judge times each call from outside the worker with its own
    clock, as `prepare` (outside the timed region) then `go` (the call). ``device``: the runner times blocks of
    repeats itself with the device's events (`timed`). Every runner has `call` (one untimed call, whose outputs
    the judge checks). A method its clock does not support raises UnsupportedOp (`ControllerClockRunner`,
    `DeviceClockRunner` give those methods).

    ``evict``: the judge's eviction of host memory (`Evict`; None: none), loaded by the worker before the kernel
    (what the kernel does at load cannot reach it) and set here after `Target.load`, before any call. A runner
    on the controller's clock evicts its arguments with it in `prepare`; others may ignore it.

    ``args`` of every method: `ksearch.protocol.ArgRef` s in ABI order (inputs, outputs, axes). Outputs are
    written to the output files before a method returns (a timed block: the last timed call's).
    """

    clock: Clock
    evict: Evict | None

    def call(self, args: Sequence[ArgRef]) -> None:
        """One untimed call on ``args``."""

    def prepare(self, args: Sequence[ArgRef], flush_bytes: int) -> None:
        """Controller clock: make ``args`` ready for the next `go` (inputs at a new address) and, ``flush_bytes``
        > 0, evict the caches (the arguments with ``evict``, else by writing ``flush_bytes`` of a buffer)."""

    def go(self) -> None:
        """Controller clock: one call on the prepared arguments (what the judge times). Raises UnsupportedOp
        without a `prepare` since the last call."""

    def timed(self, args: Sequence[ArgRef], warmup_args: Sequence[ArgRef] | None,
              plan: TimingPlan) -> tuple[list[float], list[list[float]]]:
        """Device clock: ``plan.warmup`` calls on ``warmup_args`` (None: ``args``), then repeats on ``args`` per
        ``plan``, each timed by the device's events. Returns (times in ms, per timed call [non-finite output
        values, sum of |finite output values|], taken after the clock stopped)."""
        ...


class ControllerClockRunner:
    """Base of a runner on the controller's clock: `timed` raises UnsupportedOp."""

    clock: Clock = "controller"
    evict: Evict | None = None

    def timed(self, args: Sequence[ArgRef], warmup_args: Sequence[ArgRef] | None,
              plan: TimingPlan) -> tuple[list[float], list[list[float]]]:
        raise UnsupportedOp(f"{type(self).__name__} is timed by the controller's clock (prepare, go), not by a "
                            "timed call")


class DeviceClockRunner:
    """Base of a runner on the device's clock: `prepare` and `go` raise UnsupportedOp."""

    clock: Clock = "device"
    evict: Evict | None = None

    def prepare(self, args: Sequence[ArgRef], flush_bytes: int) -> None:
        raise UnsupportedOp(f"{type(self).__name__} is timed by the device's events (a timed call), not by "
                            "prepare and go")

    def go(self) -> None:
        raise UnsupportedOp(f"{type(self).__name__} is timed by the device's events (a timed call), not by "
                            "prepare and go")


# -- the registry: target modules found by name ------------------------------------------------------------

#: where a target module without ``ORDER`` is listed
DEFAULT_ORDER = 50


def _module_names() -> list[str]:
    """The target modules of this package: no underscore in the name, not ``base`` (see `Target`)."""
    return list(_package_modules())


@lru_cache(maxsize=1)
def _package_modules() -> tuple[str, ...]:
    import ksearch.targets as package

    return tuple(sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                        if not m.ispkg and "_" not in m.name and m.name != "base"))


@lru_cache(maxsize=None)
def _module(name: str) -> ModuleType | str:
    """The target module ``name``, or why it does not import (a broken module hides only its own targets)."""
    try:
        return importlib.import_module(f"ksearch.targets.{name}")
    except Exception as e:  # a missing library, or a module broken some other way (a syntax error, a bad table)
        return f"{type(e).__name__}: {e}"


def _modules() -> list[ModuleType]:
    mods = [m for m in map(_module, _module_names()) if not isinstance(m, str)]
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", DEFAULT_ORDER), m.__name__))


def _declaring(name: str) -> ModuleType | None:
    """The module that declares target or alias ``name``: tried first by the name itself and its part before
    a ``-`` (``mlx-metal`` -> mlx.py), then every target module."""
    names = _module_names()
    for mod_name in dict.fromkeys([name, name.split("-")[0], *names]):
        mod = _module(mod_name) if mod_name in names else None
        if isinstance(mod, ModuleType) and (name in getattr(mod, "TARGETS", {}) or name in getattr(mod, "ALIASES", {})):
            return mod
    return None


def target_names() -> list[str]:
    """Every target name ``--target`` takes, module by module (``ORDER``), each module's aliases first (``mlx``
    resolves to mlx-metal or mlx-cuda: `resolve_target`)."""
    out: list[str] = []
    for mod in _modules():
        aliases = list(getattr(mod, "ALIASES", {}))
        out += aliases + [n for n in getattr(mod, "TARGETS", {}) if n not in aliases]
    return out


def aliases() -> dict[str, list[str]]:
    """Each alias (a name that stands for one target on this machine: ``mlx``) -> the targets of the module that
    declares it, one of which it resolves to."""
    return {a: list(getattr(mod, "TARGETS", {})) for mod in _modules() for a in getattr(mod, "ALIASES", {})}


def resolve_target(name: str) -> str:
    """The concrete target a name stands for: an alias is resolved for this machine by the module that declares
    it (``mlx`` becomes ``mlx-metal`` or ``mlx-cuda``); others are unchanged. Raises TargetError (listing the
    targets available here) when an alias has nothing to stand for here."""
    mod = _declaring(name)
    aliases = getattr(mod, "ALIASES", {}) if mod is not None else {}
    return aliases[name](name) if name in aliases else name


def available_targets() -> list[str]:
    """The concrete targets this machine can run now (each target's ``available()`` is None)."""
    alias = aliases()
    out = []
    for name in target_names():
        if name in alias:
            continue
        try:
            if get_target(name).available() is None:
                out.append(name)
        except Exception:  # a broken installation of one target's libraries hides only that target
            continue
    return out


def get_target(name: str) -> Target:
    """The target called ``name`` (an alias: the target it resolves to here). Raises TargetError naming the known
    targets (and any target module that does not import), or as `resolve_target` does for an alias."""
    mod = _declaring(name)
    if mod is None:
        broken = [f"{n}.py ({err})" for n in _module_names() if isinstance(err := _module(n), str)]
        also = f"; target modules that do not import: {', '.join(broken)}" if broken else ""
        raise TargetError(f"unknown target {name!r}; known: {', '.join(target_names())}{also}")
    if name in getattr(mod, "ALIASES", {}):
        return get_target(resolve_target(name))
    return mod.TARGETS[name]()


#: the targets' prompt sections (`Target.prompt_template`)
PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


def naive_from_task(target: Target, task: Task) -> Candidate | None:
    """The task's shipped naive kernel for ``target`` (``naive.<name>.<ext>`` as ``target.naive_file``, with its
    launch plan), or None: what `Target.naive_candidate` answers for a target that derives none."""
    source = task.naive_sources.get(target.name)
    if source is None:
        return None
    return Candidate(target=target.name, sources={target.naive_file: source},
                     launch=dict(task.naive_launch.get(target.name, {})), meta={"role": "naive"})



class DeviceTargetDefaults:
    """The answers a device target gives unless it says otherwise (a base class for its Target): the static checks
    read its sources as written (``expand`` None), no eviction library (its arguments live in device memory; the
    runner evicts the device's caches itself), the task's shipped naive kernel (`naive_from_task`), no launch plan
    to check without the device, no compiler report and no profiler."""

    expand = None
    flags_help: str | None = None

    def evict_library(self) -> Path | None:
        return None

    def compile_report(self, candidate: Candidate, definition: Definition, timeout_s: float) -> Profile | None:
        return None

    def profiler(self) -> RunProfiler | None:
        return None

    def naive_candidate(self, task: Task) -> Candidate | None:
        return naive_from_task(self, task)  # type: ignore[arg-type]  # a Target's class derives from this

    def launch_problem(self, candidate: Candidate, definition: Definition, axes: dict[str, int]) -> str | None:
        return None

# -- the hardware spec a run measures against ---------------------------------------------------------------


def spec_for_target(name: str) -> HardwareSpec:
    """The spec target ``name``'s roofline comes from (`Target.hardware_spec`). Raises HardwareError or
    TargetError naming what is missing."""
    return get_target(name).hardware_spec()


def spec_for_run(name: str, stored: dict | None) -> HardwareSpec:
    """The spec a run on target ``name`` measures against: the one it stored (``stored``, `Store.hardware()`)
    when that is a trusted spec of the device the target runs on here (`ksearch.hardware.cache.stored_spec`),
    so that a resumed run keeps the figures it started with; else a fresh `spec_for_target`. Raises as
    `spec_for_target` does."""
    from ksearch.hardware.cache import stored_spec

    spec = stored_spec(stored, get_target(name).hardware_kind) if stored else None
    return spec if spec is not None else spec_for_target(name)
