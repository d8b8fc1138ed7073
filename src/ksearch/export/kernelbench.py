"""``ksearch export --format kernelbench``: the kernel as a KernelBench ``ModelNew`` module.

KernelBench's harness imports a module defining ``class ModelNew(torch.nn.Module)``, builds it with the problem's
``get_init_inputs()`` under the same seed as the reference ``Model`` and compares ``ModelNew(*init)(*get_inputs())``
with ``Model(*init)(*get_inputs())``. The module written here:

- for a task imported from a KernelBench problem file (`ksearch.tasks.kernelbench`): carries the problem's source
  (its ``Model``, ``get_inputs``, ``get_init_inputs`` are the module's too) and defines ``ModelNew`` as a subclass
  of ``Model``, so its constructor, parameters and buffers are the reference's, made in the same order under the
  harness's seed; its ``forward`` hands the forward's arguments and the module's weights to the kernel as the
  task's inputs (KernelBench's own harness, and `ksearch.tasks.kernelbench`, name them alike);
- for any other task: ``ModelNew()`` takes no arguments and ``forward`` takes the task's inputs in definition order.

``forward`` returns the task's output (a tuple where it has several), on the device of its inputs. Kernels: see
`ksearch.export.kernel` (a C kernel runs on the CPU, built at the first call; a triton kernel on the GPU).
"""

from __future__ import annotations

from datetime import datetime, timezone

from ksearch.errors import ExportError
from ksearch.export.kernel import constants, kernel_kind, module
from ksearch.records import Candidate
from ksearch.tasks.definition import Definition

_PROBLEM = '''

# --- the KernelBench problem the kernel was searched for (its Model, get_inputs, get_init_inputs)
_PROBLEM = {"__name__": "kernelbench_problem"}
exec(compile(PROBLEM_SOURCE, "kernelbench_problem.py", "exec"), _PROBLEM)  # noqa: S102 - the task's own source
Model, get_inputs, get_init_inputs = _PROBLEM["Model"], _PROBLEM["get_inputs"], _PROBLEM["get_init_inputs"]


class ModelNew(Model):
    """The problem's Model (same constructor, parameters and buffers) whose forward runs the searched kernel."""

    def forward(self, *args):
        named = dict(zip(_PROBLEM["_KSEARCH_FORWARD"], args))
        if "_ksearch_state_of" in _PROBLEM:  # parameters, buffers and plain tensor attributes (level 3's h0)
            state = _PROBLEM["_ksearch_state_of"](self)
        else:  # a task imported before plain tensor attributes were inputs
            state = dict(self.named_parameters())
            state.update(self.named_buffers())
        named.update({name: state[path] for name, path in _PROBLEM["_KSEARCH_STATE"].items()})
        out = _call(named)
        return out[0] if len(out) == 1 else out
'''

_PLAIN = '''

class ModelNew(torch.nn.Module):
    """forward(inputs...) in the task's definition order -> its output (a tuple where it has several)."""

    def forward(self, *args):
        if len(args) != len(INPUTS):
            raise TypeError(f"forward takes {len(INPUTS)} inputs ({', '.join(INPUTS)}), got {len(args)}")
        out = _call(dict(zip(INPUTS, args)))
        return out[0] if len(out) == 1 else out
'''


def from_kernelbench(definition: Definition) -> bool:
    """Whether ``definition`` was imported from a KernelBench problem file (its reference defines the forward's
    argument names and the weights' paths, `ksearch.tasks.kernelbench`)."""
    ref = definition.reference or ""
    return "kernelbench" in definition.tags and "_KSEARCH_FORWARD" in ref and "_KSEARCH_STATE" in ref


def module_source(candidate: Candidate, definition: Definition, provenance: dict) -> str:
    """The text of the ``ModelNew`` module for ``candidate`` (see the module docstring). Raises ExportError for a
    kernel with no counterpart (a CUDA kernel with a launch plan, an MLX kernel) or a var axis no input gives."""
    kind = kernel_kind(candidate)
    if kind is None:
        raise ExportError(f"--format kernelbench: a {candidate.target} kernel has no ModelNew form yet (export "
                          "writes C kernels, called through ctypes, and triton modules)")
    consts = constants(candidate, definition, kind)
    consts["PROVENANCE"] = provenance
    problem = from_kernelbench(definition)
    if problem:
        consts["PROBLEM_SOURCE"] = definition.reference
    where = "the CPU (built with the system compiler at the first call)" if kind == "c" else "the GPU"
    doc = (f"{definition.name} on {candidate.target} as a KernelBench ModelNew: exported by `ksearch export` on "
           f"{datetime.now(timezone.utc).date().isoformat()}.\n\n"
           + ("ModelNew(*get_init_inputs()) is the problem's Model with its forward replaced: "
              "ModelNew(...)(*get_inputs()) -> the Model's output. " if problem else
              f"ModelNew()({', '.join(definition.inputs)}) -> ({', '.join(definition.outputs)}). ")
           + f"The kernel runs on {where}; shapes and dtypes: INPUT_SHAPES, INPUT_DTYPES, OUTPUT_SHAPES, "
           "OUTPUT_DTYPES below (inputs of another dtype are cast). Raises ValueError for inputs whose shapes "
           "disagree, RuntimeError when the kernel cannot be built.\n"
           "Where it came from: PROVENANCE. Generated file: re-export rather than edit.\n")
    return module(doc, kind, consts, _PROBLEM if problem else _PLAIN)
