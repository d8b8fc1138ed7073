"""``ksearch export --format mlx``: a run's best mlx kernel as an importable Python module (an MLX function).

The module needs only MLX at import and call time (not ksearch): it holds the kernel's header, body and launch
as literals, the task's names, dtypes and shapes, and a function named after the task's operation
(``selective_scan`` for the selective-scan tasks; ``run`` is the same function) that takes the task's inputs as
MLX arrays in definition order, reads the axes from their shapes, builds the MLX custom kernel once per
distinct launch, and returns the outputs (a tuple when the task has several). ``ksearch.integrations.mlx_lm``
loads such a module to patch mlx-lm's Mamba.
"""

from __future__ import annotations

from datetime import datetime, timezone

from ksearch.errors import ExportError
from ksearch.export.kernel import axis_sources
from ksearch.records import Candidate
from ksearch.targets.mlx import BACKENDS, parse_launch, split_sources
from ksearch.tasks.definition import Definition


def module_source(candidate: Candidate, definition: Definition, provenance: dict) -> str:
    """The text of the exported module for an mlx candidate. Raises ExportError for another target or a bad
    candidate (file set, launch)."""
    if candidate.target not in BACKENDS:
        raise ExportError(f"--format mlx writes MLX functions: the kernel is for target {candidate.target!r}, "
                          "not mlx-metal or mlx-cuda (search with --target mlx, or pick another --format: "
                          "kernelbench, gpumode, flashinfer-bench)")
    try:
        header, body = split_sources(candidate, candidate.target)
        parse_launch(candidate.launch, definition, candidate.target)
    except ValueError as e:
        raise ExportError(f"the candidate cannot be exported: {e}") from None
    op = definition.op_type if definition.op_type.isidentifier() and definition.op_type != "run" else "kernel"
    consts = {
        "TARGET": candidate.target, "BACKEND": BACKENDS[candidate.target], "HEADER": header, "BODY": body,
        "LAUNCH": candidate.launch, "KERNEL_NAME": f"ksearch_{candidate.id}",
        "INPUTS": list(definition.inputs), "OUTPUTS": list(definition.outputs),
        "INPUT_DTYPES": {n: s.dtype for n, s in definition.inputs.items()},
        "OUTPUT_DTYPES": {n: s.dtype for n, s in definition.outputs.items()},
        "INPUT_SHAPES": {n: s.shape or [] for n, s in definition.inputs.items()},
        "OUTPUT_SHAPES": {n: s.shape or [] for n, s in definition.outputs.items()},
        "AXES": axis_sources(definition), "PROVENANCE": provenance,
    }
    lines = [f'"""{definition.name} on {candidate.target}: exported by `ksearch export` on '
             f'{datetime.now(timezone.utc).date().isoformat()}.',
             "",
             f"{op}({', '.join(definition.inputs)}) -> ({', '.join(definition.outputs)}), MLX arrays; shapes and "
             "dtypes: INPUT_SHAPES, INPUT_DTYPES, OUTPUT_SHAPES, OUTPUT_DTYPES below (axis names as in the task "
             f"definition {definition.name}). Inputs of another dtype are cast. Raises ValueError for inputs whose "
             "shapes disagree, RuntimeError when MLX has no " + BACKENDS[candidate.target] + " backend here.",
             "Where it came from: PROVENANCE. Generated file: re-export rather than edit.", '"""', "",
             "import math", "", "import mlx.core as mx", ""]
    for k, v in consts.items():
        lines.append(f"{k} = {v!r}")
    lines += ["", _RUNTIME.replace("__OP__", op)]
    return "\n".join(lines)


_RUNTIME = '''_KERNELS = {}
_CALLS = {"min": min, "max": max, "abs": abs, "ceil": math.ceil, "floor": math.floor, "log2": math.log2}


def _value(expr, axes):
    if isinstance(expr, int):
        return expr
    value = eval(str(expr), {"__builtins__": {}}, {**_CALLS, **axes})  # ksearch-checked arithmetic
    if value != int(value):  # as the judge: a launch value is an integer, never truncated
        raise ValueError(f"launch value {expr!r} = {value!r} is not an integer for axes {axes}")
    return int(value)


def _kernel(shared):
    if shared not in _KERNELS:
        available = mx.metal.is_available() if BACKEND == "metal" else mx.cuda.is_available()
        if not available:
            raise RuntimeError(f"this kernel is for {TARGET}: MLX's {BACKEND} backend is not available here")
        if BACKEND == "metal":
            _KERNELS[shared] = mx.fast.metal_kernel(name=KERNEL_NAME, input_names=INPUTS, output_names=OUTPUTS,
                                                    source=BODY, header=HEADER, ensure_row_contiguous=True)
        else:
            _KERNELS[shared] = mx.fast.cuda_kernel(name=KERNEL_NAME, input_names=INPUTS, output_names=OUTPUTS,
                                                   source=BODY, header=HEADER, ensure_row_contiguous=True,
                                                   shared_memory=shared)
    return _KERNELS[shared]


def _axes(arrays):
    axes = {}
    for name, where in AXES.items():
        axes[name] = where if isinstance(where, int) else int(arrays[where[0]].shape[where[1]])
    for name, arr in arrays.items():
        want = tuple(axes[a] for a in INPUT_SHAPES[name])
        if tuple(arr.shape) != want:
            raise ValueError(f"{name}: shape {tuple(arr.shape)}, expected {want} ({INPUT_SHAPES[name]} with {axes})")
    return axes


def __OP__(*inputs):
    if len(inputs) != len(INPUTS):
        raise TypeError(f"__OP__ takes {len(INPUTS)} arrays ({', '.join(INPUTS)}), got {len(inputs)}")
    arrays = {n: (x if x.dtype == getattr(mx, INPUT_DTYPES[n]) else x.astype(getattr(mx, INPUT_DTYPES[n])))
              for n, x in zip(INPUTS, inputs)}
    axes = _axes(arrays)
    grid = [_value(x, axes) for x in LAUNCH["grid"]] + [1] * (3 - len(LAUNCH["grid"]))
    group = [_value(x, axes) for x in LAUNCH["threadgroup"]] + [1] * (3 - len(LAUNCH["threadgroup"]))
    template = (list(axes.items()) if LAUNCH.get("axes", "template") == "template" else []) + \
        [(k, _value(v, axes)) for k, v in LAUNCH.get("template", {}).items()]
    outs = _kernel(_value(LAUNCH.get("shared_memory", 0), axes))(
        inputs=[arrays[n] for n in INPUTS], template=template, grid=tuple(grid), threadgroup=tuple(group),
        output_shapes=[tuple(axes[a] for a in OUTPUT_SHAPES[n]) for n in OUTPUTS],
        output_dtypes=[getattr(mx, OUTPUT_DTYPES[n]) for n in OUTPUTS])
    return outs[0] if len(outs) == 1 else tuple(outs)


run = __OP__
'''

