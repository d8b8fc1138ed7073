"""Load tasks: built-in ones by name, or flashinfer-bench-style files from disk.

A task is a definition plus its workloads, plus (for built-ins) a naive kernel per target that every speedup
is measured against. Accepted on disk:

- a directory holding ``definition.json`` or ``definition.yaml`` and optionally ``workloads.jsonl`` and
  ``naive.<target>.<ext>`` files (the built-in layout; any target name, one kernel per target), with
  ``naive.<target>.launch.yaml`` beside the naive kernel of a target that takes a launch plan;
- a definition file (``.json`` as flashinfer-bench writes it, judged by flashinfer-bench's tolerance rule when it
  gives no ``tolerance``: `ksearch.tasks.flashinfer.fib_tolerance`; or ``.yaml``) with its workloads: a JSONL file
  whose lines are Workload objects, or flashinfer-bench traces with a ``workload`` field, given separately or
  found beside it (``<stem>.jsonl``, or flashinfer-bench's dataset layout: `ksearch.tasks.flashinfer`);
- anything a registered outside source claims (`ksearch.tasks.importers`): a flashinfer-bench dataset root plus a
  definition name (``ROOT/NAME``), and the sources other modules register.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from ksearch.errors import TaskError
from ksearch.tasks import validate
from ksearch.tasks.definition import Definition, Workload

_BUILTIN_ROOT = resources.files("ksearch.tasks") / "builtin"
#: a naive kernel's file: ``naive.<target>.<ext>``, or its launch plan ``naive.<target>.launch.yaml`` (any target
#: name: the loader knows none, the target gives the kernel its file name)
_NAIVE_FILE = re.compile(r"naive\.(?P<target>[A-Za-z0-9_][A-Za-z0-9_+-]*)\.(?P<ext>launch\.yaml|[A-Za-z0-9_+-]+)")


@dataclass
class Task:
    """A definition, its workloads, and the naive kernel source per target name (``{<target>: source}``; the
    target names its file: `ksearch.targets.base.Target.naive_file`)."""

    definition: Definition
    workloads: list[Workload]
    naive_sources: dict[str, str] = field(default_factory=dict)
    origin: str = ""
    #: Python baselines: name -> source defining ``run`` (see Definition.baselines)
    baseline_sources: dict[str, str] = field(default_factory=dict)
    #: launch plan of a GPU target's naive kernel (``naive.<target>.launch.yaml``; see docs/cuda-target.md)
    naive_launch: dict[str, dict] = field(default_factory=dict)
    #: the file name of each naive kernel, ``{<target>: naive.<target>.<ext>}`` (`ksearch.tasks.importers`
    #: writes them back under these names)
    naive_files: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.definition.name

    def workload(self, name: str) -> Workload:
        """The workload with this name (or uuid). Raises TaskError listing the known names."""
        for w in self.workloads:
            if name in (w.name, w.uuid):
                return w
        raise TaskError(f"task {self.name!r} has no workload {name!r}; known: {[w.label for w in self.workloads]}")

    def select(self, names: list[str] | None) -> list[Workload]:
        """The named workloads in the order given, or all of them when ``names`` is None/empty.

        Raises:
            TaskError: an unknown name, or a task without workloads (nothing to check a kernel on).
        """
        if not self.workloads:
            raise TaskError(f"task {self.name!r} ({self.origin}) has no workloads: put a workloads.jsonl (one "
                            "workload per line) beside its definition")
        return [self.workload(n) for n in names] if names else list(self.workloads)


def builtin_names() -> list[str]:
    """Names of the built-in tasks."""
    return sorted(p.name for p in _BUILTIN_ROOT.iterdir() if (p / "definition.yaml").is_file())


def _read_mapping(path: Path, what: str = "task file") -> dict:
    data = validate.parse_mapping(validate.read_text(path, what), str(path), as_json=path.suffix == ".json")
    if not isinstance(data, dict):
        raise TaskError(f"{path} must hold one object (a task definition), found {type(data).__name__}")
    return data


def _format_validation(e: ValidationError) -> str:
    """The first errors of a validation, on one line: ``loc: msg; loc: msg; ... and N more``."""
    parts = []
    for err in e.errors()[:8]:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        parts.append(f"{loc}: {' '.join(str(err['msg']).split())}")
    more = f"; ... and {e.error_count() - 8} more" if e.error_count() > 8 else ""
    return "; ".join(parts) + more


def load_definition(path: str | Path) -> Definition:
    """Read one definition file (JSON or YAML). Raises TaskError naming the file and the bad fields."""
    path = Path(path)
    data = _read_mapping(path)
    validate.check_raw_definition(data, str(path))
    try:
        definition = Definition.model_validate(data)
    except ValidationError as e:
        raise TaskError(f"{path} is not a valid task definition: {_format_validation(e)}") from None
    except (RecursionError, MemoryError):  # an expression that parses into too deep a tree
        raise TaskError(f"{path}: an expression nests too deep to parse") from None
    validate.check_definition(definition, str(path))
    return definition


def parse_workloads(text: str, source: str = "<workloads>") -> list[Workload]:
    """Parse JSONL workloads: one Workload per line, or a trace object with a ``workload`` field."""
    out: list[Workload] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{source}:{lineno}: not valid JSON: {e.msg}") from None
        except (RecursionError, MemoryError):
            raise TaskError(f"{source}:{lineno}: JSON nested too deep") from None
        validate.check_data_size(obj, f"{source}:{lineno}")
        if isinstance(obj, dict) and isinstance(obj.get("workload"), dict):
            obj = obj["workload"]
        try:
            out.append(Workload.model_validate(obj))
        except ValidationError as e:
            raise TaskError(f"{source}:{lineno}: not a valid workload: {_format_validation(e)}") from None
    return out


def load_workloads(path: str | Path) -> list[Workload]:
    path = Path(path)
    return parse_workloads(validate.read_text(path, "workloads file"), str(path))


def _load_dir(d, origin: str) -> Task:
    def_file = next((d / n for n in ("definition.yaml", "definition.json") if (d / n).is_file()), None)
    if def_file is None:
        raise TaskError(f"{origin}: no definition.yaml or definition.json")
    definition = load_definition(Path(str(def_file)))
    wl_file = d / "workloads.jsonl"
    workloads = parse_workloads(validate.read_text(Path(str(wl_file)), "workloads file"),
                                f"{origin}/workloads.jsonl") if wl_file.is_file() else []
    naive, launches, files = _naive_kernels(d, origin)
    baselines = {}
    for bname, rel in definition.baselines.items():
        f = d.joinpath(*rel.split("/"))
        if not f.is_file():
            raise TaskError(f"{origin}: baseline {bname!r} file {rel!r} not found")
        baselines[bname] = validate.read_text(Path(str(f)), "baseline file")
    from ksearch.tasks import flashinfer

    flashinfer.resolve_blobs(workloads, Path(str(d)))  # relative to the task folder
    flashinfer.label_workloads(definition, workloads)
    return Task(definition, workloads, naive, origin, baselines, launches, files)


def _naive_kernels(d, origin: str) -> tuple[dict[str, str], dict[str, dict], dict[str, str]]:
    """The naive kernels of a task directory, ``{target: source}`` from each ``naive.<target>.<ext>``, and their
    launch plans, ``{target: plan}`` from each ``naive.<target>.launch.yaml`` beside a kernel. Raises TaskError
    for two kernels of one target (``naive.cpu.c`` and ``naive.cpu.cpp``) or an unreadable plan."""
    files: dict[str, str] = {}
    plans: dict[str, dict] = {}
    for f in sorted(d.iterdir(), key=lambda p: p.name):
        m = _NAIVE_FILE.fullmatch(f.name)
        if m is None or not f.is_file():
            continue
        target = m.group("target")
        if m.group("ext") == "launch.yaml":
            plans[target] = _read_mapping(Path(str(f)), "launch plan")
        elif target in files:
            raise TaskError(f"{origin}: two naive kernels for target {target!r}: {files[target]} and {f.name}")
        else:
            files[target] = f.name
    naive = {target: validate.read_text(Path(str(d / name)), "kernel file") for target, name in files.items()}
    return naive, {target: plan for target, plan in plans.items() if target in naive}, files


def _check_workloads(definition: Definition, workloads: list[Workload]) -> None:
    """Every workload must satisfy the definition (`Definition.check_workload`) and have a name and uuid of its
    own (``-w NAME`` must pick one workload)."""
    seen: set[str] = set()
    for w in workloads:
        validate.check_workload(definition, w, definition.check_workload(w))
        for key in {w.name, w.uuid} - {None}:
            if key in seen:
                raise TaskError(f"task {definition.name!r} has two workloads named {key!r}")
            seen.add(key)


def load_task(name_or_path: str | Path, workloads: str | Path | None = None) -> Task:
    """Load a built-in task by name, or a task from a directory or definition file.

    Args:
        name_or_path: a built-in name (see ``builtin_names()``), a task directory, or a definition file.
        workloads: optional JSONL file of workloads, replacing any found beside the definition.

    A task whose reference is torch and which lists no baselines gets its reference as one
    (`ksearch.tasks.own_reference`).

    Raises:
        TaskError: unknown name, unreadable or malformed file, a workload that breaks the definition.
    """
    from ksearch.tasks import flashinfer

    name = str(name_or_path)
    path = Path(name)
    if name in builtin_names():
        task = _load_dir(_BUILTIN_ROOT / name, f"builtin:{name}")
    elif path.is_dir() and any((path / n).is_file() for n in ("definition.yaml", "definition.json")):
        task = _load_dir(path, str(path))
    elif path.is_file() and path.suffix in (".json", ".yaml", ".yml"):
        definition = load_definition(path)
        if path.suffix == ".json" and "tolerance" not in definition.model_fields_set:  # flashinfer-bench's rule
            definition.tolerance = {spec.dtype: flashinfer.fib_tolerance(definition)
                                    for spec in definition.outputs.values()}
        task = Task(definition, [], {}, str(path))
        found = flashinfer.workloads_beside(path) if workloads is None else None
        if found is not None:
            task.workloads = _read_workloads(found, definition)
    else:
        from ksearch.tasks.importers import detect, import_task

        if detect(path) is None and not path.exists():
            import difflib

            close = difflib.get_close_matches(name, builtin_names(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TaskError(f"no task {name!r}{hint}: not a built-in ({', '.join(builtin_names())}) nor a file or "
                            "directory")
        task = import_task(path, workloads)  # its workloads file read by its source
        workloads = None
    if workloads is not None:
        task.workloads = _read_workloads(Path(workloads), task.definition)
    validate.check_definition(task.definition, task.origin or name)  # whatever source the task came from
    _check_workloads(task.definition, task.workloads)  # once, whichever source gave them
    from ksearch.tasks.own_reference import with_reference_baseline

    return with_reference_baseline(task)  # a torch reference without baselines: timed as one (the final table)


def _read_workloads(path: Path, definition: Definition) -> list[Workload]:
    """A workloads file for ``definition``: its safetensors paths made absolute (`ksearch.tasks.flashinfer`), its
    unnamed workloads named (checked against the definition by `load_task`)."""
    from ksearch.tasks import flashinfer

    out = load_workloads(path)
    flashinfer.resolve_blobs(out, flashinfer.blob_root(path))
    flashinfer.label_workloads(definition, out)
    return out
