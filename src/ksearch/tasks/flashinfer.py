"""flashinfer-bench inputs: its dataset layout, workloads found beside a definition, and its judging rules.

A flashinfer-bench dataset (a *TraceSet* root, as the flashinfer-trace dataset is laid out) holds::

    ROOT/definitions/<op_type>/<name>.json     one Definition each (the <op_type> folder may be absent)
    ROOT/workloads/<op_type>/<name>.jsonl      one trace per line, its ``workload`` field a Workload
    ROOT/blob/...                              safetensors files named by workloads (paths relative to ROOT)

ksearch loads one definition of a dataset as ``ROOT/NAME`` (the dataset root, then the definition's name: a path
that does not exist on disk), e.g. ``ksearch run flashinfer-trace/gqa_paged_decode_h32_kv8_d128_ps1``; a definition
file loads with the workloads found beside it (`workloads_beside`). Workload lines carry no names: each gets a
readable one (`label_workloads`) that ``-w`` selects.

Judging follows flashinfer-bench's default evaluator (flashinfer_bench/bench/utils.py ``compute_error_stats`` and
bench/config.py, Apache-2.0): an element is wrong when |got - want| > atol *and* |got - want| / (|want| + 1e-8) >
rtol, with atol = rtol = 1e-2, and an output passes when the share of right elements is at least
``required_matched_ratio`` (1.0 by default; 0.95 for ``op_type`` ``moe`` per bench/eval_config.yaml and for
definitions named ``*moe_fp8_block_scale*`` per bench/evaluators/lowbit.py). `fib_tolerance` gives that rule as a
ksearch Tolerance for definitions that carry no ``tolerance`` of their own.
"""

from __future__ import annotations

from pathlib import Path

from ksearch.errors import TaskError
from ksearch.tasks.definition import Definition, SafetensorsInput, Tolerance, Workload

#: flashinfer-bench's default evaluator tolerance (bench/config.py ResolvedEvalConfig: rtol = atol = 1e-2)
FIB_ATOL = 1e-2
FIB_RTOL = 1e-2
#: its matched-ratio overrides: bench/eval_config.yaml (op_type moe) and bench/evaluators/lowbit.py (by name)
FIB_MATCHED_RATIO_BY_OP_TYPE = {"moe": 0.95}
FIB_MATCHED_RATIO_BY_NAME_PART = {"moe_fp8_block_scale": 0.95}


def fib_tolerance(definition: Definition) -> Tolerance:
    """flashinfer-bench's default judging rule for ``definition`` (module docstring) as a Tolerance."""
    ratio = FIB_MATCHED_RATIO_BY_OP_TYPE.get(definition.op_type, 1.0)
    for part, r in FIB_MATCHED_RATIO_BY_NAME_PART.items():
        if part in definition.name:
            ratio = min(ratio, r)
    return Tolerance(atol=FIB_ATOL, rtol=FIB_RTOL, rule="either", matched_ratio=ratio)


def is_dataset_root(path: Path) -> bool:
    """Whether ``path`` is a folder laid out as a flashinfer-bench dataset (it has ``definitions/``)."""
    return path.is_dir() and (path / "definitions").is_dir()


def dataset_root_of(path: Path) -> Path | None:
    """The dataset root above a file under its ``definitions/`` or ``workloads/`` folder, or None."""
    full = path.resolve()
    for parent in full.parents:
        if parent.name in ("definitions", "workloads") and (is_dataset_root(parent.parent)
                                                            or (parent.parent / "workloads").is_dir()):
            return parent.parent
    return None


def definition_files(root: Path) -> dict[str, Path]:
    """Definition name (file stem) -> file, for every ``.json`` under ``root/definitions`` (any depth)."""
    return {f.stem: f for f in sorted((root / "definitions").rglob("*.json"))}


def resolve_dataset_name(path: Path) -> Path | None:
    """The definition file a ``ROOT/NAME`` spelling names (``ROOT`` a dataset root, ``NAME`` a definition's name
    or file stem), or None when ``path`` is not that spelling.

    Raises:
        TaskError: ``ROOT`` is a dataset root but has no definition ``NAME`` (the message lists close names).
    """
    if path.exists() or not is_dataset_root(path.parent):
        return None
    files = definition_files(path.parent)
    if path.name in files:
        return files[path.name]
    near = [n for n in files if path.name.split("_")[0] in n][:12] or list(files)[:12]
    raise TaskError(f"dataset {path.parent} has no definition {path.name!r}; some it has: {', '.join(near)}")


def workloads_beside(def_file: Path) -> Path | None:
    """The workloads file of a definition file: ``<stem>.jsonl`` beside it, else (inside a dataset)
    ``ROOT/workloads/<op_type folder>/<stem>.jsonl`` or any ``ROOT/workloads/**/<stem>.jsonl``; None if none."""
    same = def_file.with_suffix(".jsonl")
    if same.is_file():
        return same
    root = dataset_root_of(def_file)
    if root is None:
        return None
    rel = def_file.resolve().relative_to((root / "definitions").resolve())
    mirror = (root / "workloads" / rel).with_suffix(".jsonl")
    if mirror.is_file():
        return mirror
    found = sorted((root / "workloads").rglob(f"{def_file.stem}.jsonl"))
    return found[0] if found else None


def blob_root(workloads_file: Path) -> Path:
    """The folder a workloads file's relative safetensors paths are relative to: its dataset root when it lies in
    one (flashinfer-bench: relative to the TraceSet root), else its own folder."""
    return dataset_root_of(workloads_file) or workloads_file.resolve().parent


def resolve_blobs(workloads: list[Workload], root: Path) -> None:
    """Make every safetensors input path of ``workloads`` absolute (relative ones taken from ``root``), in place.

    A named file that does not exist is not an error here: the flashinfer-trace dataset ships its workload lines
    apart from its ``blob/`` folder, and a definition loaded with lines whose blobs are absent can still be shown,
    and run on its other workloads; drawing such a workload's inputs (`ksearch.tasks.inputs.make_inputs`) fails
    with a TaskError naming the file. `missing_blobs` lists them.
    """
    for w in workloads:
        for how in w.inputs.values():
            if isinstance(how, SafetensorsInput):
                p = Path(how.path)
                how.path = str((p if p.is_absolute() else root / p).resolve())


def missing_blobs(workload: Workload) -> list[str]:
    """The safetensors files ``workload``'s inputs name (absolute after `resolve_blobs`) that do not exist."""
    return sorted({how.path for how in workload.inputs.values()
                   if isinstance(how, SafetensorsInput) and not Path(how.path).is_file()})


def label_workloads(definition: Definition, workloads: list[Workload]) -> None:
    """Give each unnamed workload a readable name, in place: the values of the var axes that differ among the
    unnamed workloads (all var axes when none differ), joined by ``+`` so that ``-w`` (comma-separated) takes it
    whole, e.g. ``M=256`` or ``batch_size=4+num_kv_indices=512``; where two share those, the first 8 characters of
    the uuid are added (``M=256@1a2b3c4d``)."""
    unnamed = [w for w in workloads if w.name is None]
    var = [a for a in definition.var_axes if any(a in w.axes for w in unnamed)]
    differ = [a for a in var if len({w.axes.get(a) for w in unnamed}) > 1] or var

    def axes_text(w: Workload) -> str:
        return "+".join(f"{a}={w.axes[a]}" for a in differ if a in w.axes) or w.uuid[:8]

    counts: dict[str, int] = {}
    for w in unnamed:
        counts[axes_text(w)] = counts.get(axes_text(w), 0) + 1
    taken = {w.name for w in workloads if w.name is not None}
    for w in unnamed:
        text = axes_text(w)
        name = text if counts[text] == 1 and text not in taken else f"{text}@{w.uuid[:8]}"
        w.name = name
        taken.add(name)


def _detect(path: Path) -> bool:
    """A dataset root, or ``ROOT/NAME`` (a path that does not exist, in a dataset root)."""
    return is_dataset_root(path) or (not path.exists() and is_dataset_root(path.parent))


def _load(path: Path, workloads: Path | None):
    from ksearch.tasks.loader import load_task

    if is_dataset_root(path):
        names = list(definition_files(path))
        raise TaskError(f"{path} is a flashinfer-bench dataset: name one of its definitions as {path}/NAME; "
                        f"it has {len(names)}: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}")
    def_file = resolve_dataset_name(path)
    assert def_file is not None  # _detect: a ROOT/NAME spelling
    task = load_task(def_file, workloads=workloads)
    task.origin = str(path)
    return task


def _register() -> None:
    from ksearch.tasks.importers import Source, register

    register(Source(kind="flashinfer-bench", detect=_detect, load=_load,
                    summary="a flashinfer-bench dataset root plus a definition name, ROOT/NAME, or a definition "
                            ".json with its workloads .jsonl"))


_register()
