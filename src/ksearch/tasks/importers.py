"""Tasks from other ecosystems: a registry of *sources* (flashinfer-bench, KernelBench, GPU MODE, ...) and the
writer of ksearch's own task folder.

A source is registered once, by kind, with two functions: ``detect(path) -> bool`` says whether a path (a file, a
folder, or a ``ROOT/NAME`` spelling that need not exist on disk) is one of its tasks; ``load(path, workloads) ->
Task`` reads it (``workloads``: an optional workloads file given by the user, or None). `load_task` asks the
registry for any path that is not a built-in name, a ksearch task folder or a plain definition file;
``ksearch tasks import SRC -o DIR`` loads a source the same way and writes the task with `write_task_dir`, so a
user can edit it and load it back as a ksearch task folder.

Register a source with::

    from ksearch.tasks.importers import Source, register

    register(Source(kind="kernelbench", detect=is_kernelbench, load=load_kernelbench,
                    summary="a KernelBench problem file (Model, get_inputs, get_init_inputs)"))

Sources are tried in registration order; the first whose ``detect`` answers True loads the path. The built-in
sources register when this module is imported (`_builtin_sources`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ksearch.errors import TaskError
from ksearch.tasks.loader import Task


@dataclass(frozen=True)
class Source:
    """One kind of outside task: ``kind`` (its name, e.g. ``flashinfer-bench``), ``detect`` (whether a path is one
    of its tasks; must not raise for a path of another kind), ``load`` (the path and an optional workloads file ->
    the Task; raises TaskError for a malformed one) and ``summary`` (one line for help texts)."""

    kind: str
    detect: Callable[[Path], bool]
    load: Callable[[Path, Path | None], Task]
    summary: str = ""


_SOURCES: dict[str, Source] = {}


def register(source: Source) -> None:
    """Add (or replace, by kind) a source. Later registrations of a new kind are tried after earlier ones."""
    _SOURCES[source.kind] = source


def sources() -> list[Source]:
    """The registered sources, in the order they are tried."""
    _builtin_sources()
    return list(_SOURCES.values())


def detect(path: str | Path) -> Source | None:
    """The first registered source that claims ``path``, or None."""
    p = Path(path)
    for s in sources():
        try:
            if s.detect(p):
                return s
        except OSError:  # an unreadable file is not this source's; its loader would say why
            continue
    return None


def import_task(path: str | Path, workloads: str | Path | None = None, kind: str | None = None) -> Task:
    """Load an outside task: by ``kind`` when given, else by the first source that detects ``path``.

    Raises:
        TaskError: an unknown kind, a path no source claims (the message lists the kinds), or the source's own
            error for a malformed task.
    """
    p = Path(path)
    wl = Path(workloads) if workloads is not None else None
    if kind is not None:
        known = {s.kind: s for s in sources()}
        if kind not in known:
            raise TaskError(f"unknown task source kind {kind!r}; known: {', '.join(known) or 'none'}")
        return known[kind].load(p, wl)
    source = detect(p)
    if source is None:
        kinds = "; ".join(f"{s.kind} ({s.summary})" if s.summary else s.kind for s in sources())
        raise TaskError(f"{path} is not a task ksearch can import; it reads: {kinds}")
    return source.load(p, wl)


def write_task_dir(task: Task, out: str | Path, force: bool = False) -> Path:
    """Write ``task`` as ksearch's own task folder: ``definition.json``, ``workloads.jsonl`` (one workload per line),
    ``naive.<target>.<ext>`` per naive kernel (their launch plans beside them), baseline files, and every file a
    workload's safetensors input names (copied under ``blob/``, the workloads' paths rewritten to them, so the
    folder stands alone).

    Args:
        task: the task, e.g. from `import_task`.
        out: the folder to write; created if missing.
        force: write into an existing non-empty folder (else refused), first removing the task files there that
            the loader would read instead of or beside the new ones (definition.*, workloads.*, naive.*, blob/);
            other files are kept.

    Returns:
        The folder, loadable with ``load_task(out)``.

    Raises:
        TaskError: ``out`` is a file, or a non-empty folder without ``force``, a safetensors file a workload names
            does not exist (checked before anything is written), or a file cannot be written.
    """
    from ksearch.tasks.flashinfer import missing_blobs

    lacking = [(w, m) for w in task.workloads if (m := missing_blobs(w))]
    if lacking:
        w, missing = lacking[0]
        raise TaskError(f"workload {w.label!r} names safetensors file {missing[0]}, which does not exist ({len(lacking)} "
                        f"of the task's {len(task.workloads)} workloads name missing files): the folder would not "
                        "stand alone; get the dataset's blob/ folder, or pass a workloads file without those lines "
                        "with --workloads-file")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise TaskError(f"cannot write a task folder at {out}: it is a file")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise TaskError(f"{out} is not empty: choose another folder or pass --force to overwrite its files")
    try:
        if out.is_dir() and force:  # a stale definition.yaml would be read before the new definition.json
            import shutil

            for old in out.iterdir():
                if old.name == "blob" and old.is_dir():
                    shutil.rmtree(old)
                elif old.is_file() and old.name.startswith(("definition.", "workloads.", "naive.")):
                    old.unlink()
        out.mkdir(parents=True, exist_ok=True)
        data = task.definition.model_dump(mode="json", exclude_none=True, by_alias=True)
        for kind in ("inputs", "outputs"):  # a scalar's shape is null, which exclude_none dropped
            for spec in data[kind].values():
                spec.setdefault("shape", None)
        (out / "definition.json").write_text(json.dumps(data, indent=2) + "\n")
        lines = [json.dumps(w.model_dump(mode="json", exclude_none=True)) for w in _with_blobs(task.workloads, out)]
        (out / "workloads.jsonl").write_text("".join(line + "\n" for line in lines))
        for target, source in task.naive_sources.items():
            name = task.naive_files.get(target)
            if name is None:
                raise TaskError(f"task {task.name!r}: the naive kernel of target {target!r} has no file name "
                                "(Task.naive_files)")
            (out / name).write_text(source)
        for target, plan in task.naive_launch.items():
            (out / f"naive.{target}.launch.yaml").write_text(json.dumps(plan, indent=2) + "\n")
        for name, rel in task.definition.baselines.items():
            if name in task.baseline_sources:
                dest = out.joinpath(*rel.split("/"))
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(task.baseline_sources[name])
    except OSError as e:
        raise TaskError(f"cannot write the task folder {out}: {e.strerror} ({e.filename})") from None
    return out


def _with_blobs(workloads, out: Path):
    """Copies of ``workloads`` whose safetensors files are copied under ``out/blob/`` (named by their own file
    names, a number added where two differ), the paths rewritten relative to ``out``."""
    from ksearch.tasks.definition import SafetensorsInput

    copied: dict[str, str] = {}
    result = []
    for w in workloads:
        w = w.model_copy(deep=True)
        for how in w.inputs.values():
            if not isinstance(how, SafetensorsInput):
                continue
            src = Path(how.path)
            if str(src) not in copied:
                rel = f"blob/{src.name}"
                n = 1
                while rel in copied.values():
                    rel, n = f"blob/{src.stem}-{n}{src.suffix}", n + 1
                (out / "blob").mkdir(exist_ok=True)
                shutil.copyfile(src, out / rel)
                copied[str(src)] = rel
            how.path = copied[str(src)]
        result.append(w)
    return result


_LOADED = False


def _builtin_sources() -> None:
    """Register the sources that ship with ksearch (once; imported lazily, as each imports this module)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    from ksearch.tasks import flashinfer  # noqa: F401 - registers itself
    from ksearch.tasks import kernelbench  # noqa: F401 - registers itself
    from ksearch.tasks import gpumode  # noqa: F401 - registers itself
