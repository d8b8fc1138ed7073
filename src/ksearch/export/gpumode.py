"""``ksearch export --format gpumode``: the kernel as a GPU MODE ``submission.py``.

GPU MODE's harness imports ``submission.py`` and calls ``custom_kernel(data)`` on what the problem's
``generate_input`` returns, then hands the result to the problem's ``check_implementation``. The module written here
unpacks ``data`` as the task does: for a task imported from a GPU MODE folder (`ksearch.tasks.gpumode`) the data's
parts in the order the importer named them (a single tensor where the data is one), and the result as the problem's
``ref_kernel`` returns it (a tuple where it returns one, even of one tensor); for any other task, ``data`` is the
tuple of the task's inputs in definition order (the input itself where there is one) and the result its output (a
tuple where there are several). Outputs are on the device of the data. Kernels: see `ksearch.export.kernel`.
Nothing of the problem's own files is copied into the submission.
"""

from __future__ import annotations

import ast
from datetime import datetime, timezone

from ksearch.errors import ExportError
from ksearch.export.kernel import constants, kernel_kind, module
from ksearch.records import Candidate
from ksearch.tasks.definition import Definition

_TAIL = '''

def custom_kernel(data):
    """GPU MODE's entry point: the problem's data -> the kernel's output (see DATA_TUPLE, OUTPUT_TUPLE)."""
    parts = tuple(data) if DATA_TUPLE else (data,)
    if len(parts) != len(INPUTS):
        raise ValueError(f"the data has {len(parts)} parts, the kernel takes {len(INPUTS)} ({', '.join(INPUTS)})")
    out = _call(dict(zip(INPUTS, parts)))
    return out if OUTPUT_TUPLE or len(out) > 1 else out[0]
'''


def _assigned(source: str, names: tuple[str, ...]) -> dict[str, object]:
    """The literal values of top-level assignments to ``names`` in ``source`` (those it has)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in names:
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def data_layout(definition: Definition) -> tuple[bool, bool]:
    """(whether ``data`` is a tuple, whether the result is one) for ``definition``: read from a GPU MODE import's
    reference (`ksearch.tasks.gpumode`: ``_KSEARCH_TUPLE``, ``_KSEARCH_OUT_TUPLE``), else from the numbers of
    inputs and outputs. Raises ExportError where the imported data's parts are not the task's inputs in order."""
    found = _assigned(definition.reference or "", ("_KSEARCH_TUPLE", "_KSEARCH_OUT_TUPLE", "_KSEARCH_PARTS"))
    if "gpumode" in definition.tags and {"_KSEARCH_TUPLE", "_KSEARCH_OUT_TUPLE"} <= set(found):
        parts = found.get("_KSEARCH_PARTS", list(definition.inputs))
        if list(parts) != list(definition.inputs):  # type: ignore[call-overload]
            raise ExportError(f"the problem's data parts {parts} are not the task's inputs {list(definition.inputs)}")
        return bool(found["_KSEARCH_TUPLE"]), bool(found["_KSEARCH_OUT_TUPLE"])
    return len(definition.inputs) > 1, False


def module_source(candidate: Candidate, definition: Definition, provenance: dict) -> str:
    """The text of ``submission.py`` for ``candidate`` (see the module docstring). Raises ExportError for a kernel
    with no counterpart (a CUDA kernel with a launch plan, an MLX kernel) or a var axis no input gives."""
    kind = kernel_kind(candidate)
    if kind is None:
        raise ExportError(f"--format gpumode: a {candidate.target} kernel has no submission.py form yet (export "
                          "writes C kernels, called through ctypes, and triton modules)")
    consts = constants(candidate, definition, kind)
    consts["DATA_TUPLE"], consts["OUTPUT_TUPLE"] = data_layout(definition)
    consts["PROVENANCE"] = provenance
    where = "the CPU (built with the system compiler at the first call; data elsewhere is copied)" if kind == "c" \
        else "the GPU"
    doc = (f"{definition.name} on {candidate.target} as a GPU MODE submission: exported by `ksearch export` on "
           f"{datetime.now(timezone.utc).date().isoformat()}.\n\n"
           f"custom_kernel(data) with data = ({', '.join(definition.inputs)}) -> "
           f"({', '.join(definition.outputs)}). The kernel runs on {where}; shapes and dtypes: INPUT_SHAPES, "
           "INPUT_DTYPES, OUTPUT_SHAPES, OUTPUT_DTYPES below. Raises ValueError for data whose shapes disagree, "
           "RuntimeError when the kernel cannot be built.\n"
           "Where it came from: PROVENANCE. Generated file: re-export rather than edit.\n")
    return module(doc, kind, consts, _TAIL)
