"""KernelBench problem files as ksearch tasks (https://github.com/ScalingIntelligence/KernelBench, MIT).

A problem file defines ``class Model(nn.Module)``, ``get_inputs()`` (the forward's arguments) and
``get_init_inputs()`` (the constructor's), with the sizes as module-level constants. It loads as:

- inputs: the forward's arguments (named after ``Model.forward``'s parameters), then every parameter and buffer of
  ``Model(*get_init_inputs())`` and every tensor it keeps as a plain attribute (level 3's ``self.h0 =
  torch.randn(...)``; named by their path, dots as underscores: ``gemm.weight`` -> ``gemm_weight``), so a kernel
  receives the weights and that state; outputs: ``output`` (``output0``, ``output1``, ... for a tuple), ``result``
  where the forward has an argument of that name (``out`` where it has both);
- axes: every dimension of an input or output, ``const`` (a problem fixes its sizes), named after the first
  module-level integer constant of that value (in source order, the first not yet used by the same tensor; a
  dimension of 1 is never named after one; never one named like an input or ``seed``), else ``<tensor>_d<i>``.
  Where constants share a value the name is a guess (``in_features`` may name an ``out_features`` dimension), the
  value is right either way;
- one workload, ``problem-sizes`` (``scaled-sizes`` where `load_kernelbench`'s ``sizes`` override constants);
- inputs per (workload, seed) made by the problem itself, as KernelBench's harness makes them:
  ``torch.manual_seed(seed); get_inputs()``, then ``torch.manual_seed(seed); Model(*get_init_inputs())`` for the
  weights (the definition's ``input_generator``). The faithful option: ``torch.rand`` stays uniform [0, 1),
  ``torch.randn`` normal, integer targets keep their range, and the weights have PyTorch's own initialisation
  (``nn.Linear``'s kaiming-uniform, ``LayerNorm``'s ones and zeros). One difference: KernelBench initialises the
  weights under one fixed seed for all its trials; here they are drawn again under each check's seed (a kernel
  cannot bake them in);
- the reference: the module's forward with the given inputs, parameters and buffers
  (``torch.func.functional_call``; the module stays in training mode, as KernelBench runs it);
- tolerance: KernelBench's ``get_tolerance_for_precision`` (atol = rtol = 1e-4 for float32, 1e-2 for float16 and
  bfloat16).

Shapes are learnt at load time on torch's ``meta`` device (no memory, whatever the sizes), falling back to real
tensors where a problem's code cannot run there (refused where its inputs and weights are over
`CPU_FALLBACK_BYTES`: shrink it). Each attempt is stopped after `LOAD_SECONDS` (a forward that never returns is a
TaskError, not a hung command). The problem file is trusted code run in this process, as
every reference is. ``sizes`` replaces the value of top-level assignments (``batch_size = 16``) in the source
before it runs, so constants derived from them follow (``bias_shape = (out_features,)``): the tests use it to
shrink GPU-sized problems, and a command line spells it ``PROBLEM.py:batch_size=4,dim=256`` (`split_sizes`).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from ksearch.errors import TaskError, TaskTimeout
from ksearch.tasks.definition import ConstAxis, Definition, TensorSpec, Workload
from ksearch.tasks.guard import task_code
from ksearch.tasks.importers import Source, register
from ksearch.tasks.loader import Task

#: KernelBench's correctness tolerance per output dtype (src/kernelbench/eval.py, get_tolerance_for_precision)
TOLERANCE = {"float32": {"rtol": 1e-4, "atol": 1e-4}, "float16": {"rtol": 1e-2, "atol": 1e-2},
             "bfloat16": {"rtol": 1e-2, "atol": 1e-2}}

_WRAPPER = '''

# --- added by ksearch's KernelBench importer: the forward with its weights as inputs, and the inputs' generator
_KSEARCH_FORWARD = {forward!r}  # the forward's arguments, in order
_KSEARCH_STATE = {state!r}  # input name -> the module's parameter, buffer or plain tensor attribute
_KSEARCH_MODEL = []


{state_of}

def _ksearch_model():
    import torch

    if not _KSEARCH_MODEL:
        torch.manual_seed(0)  # the values are replaced by the inputs' at every call
        _KSEARCH_MODEL.append(Model(*get_init_inputs()))
    return _KSEARCH_MODEL[0]


def run(**inputs):
    import torch

    state = {{path: inputs[name] for name, path in _KSEARCH_STATE.items()}}
    args = tuple(inputs[name] for name in _KSEARCH_FORWARD)
    return torch.func.functional_call(_ksearch_model(), state, args)


def generate(seed, **axes):
    import torch

    torch.manual_seed(seed)
    values = dict(zip(_KSEARCH_FORWARD, get_inputs()))
    torch.manual_seed(seed)
    model = Model(*get_init_inputs())
    tensors = _ksearch_state_of(model)
    values.update({{name: tensors[path].detach() for name, path in _KSEARCH_STATE.items()}})
    return values
'''


def split_sizes(path: Path) -> tuple[Path, dict[str, int] | None]:
    """``PROBLEM.py:batch_size=4,dim=300`` (the spelling that shrinks a problem on the command line) -> (the file,
    the size overrides); a plain path -> (path, None). Raises TaskError for an override that is not NAME=INTEGER."""
    text = str(path)
    if ".py:" not in text:
        return path, None
    file, _, spec = text.rpartition(".py:")
    sizes: dict[str, int] = {}
    for item in filter(None, spec.split(",")):
        name, eq, value = item.partition("=")
        try:
            sizes[name.strip()] = int(value)
        except ValueError:
            eq = ""
        if not eq or not name.strip().isidentifier():
            raise TaskError(f"{path}: size override {item!r} is not NAME=INTEGER (e.g. {file}.py:batch_size=4,dim=256)")
    return Path(file + ".py"), sizes


def is_kernelbench(path: Path) -> bool:
    """A ``.py`` file defining ``Model``, ``get_inputs`` or ``get_init_inputs`` at its top level (one is enough: the
    loader says which of the three is missing)."""
    try:
        path = split_sizes(path)[0]
    except TaskError:
        return True  # a malformed override of a problem file: its loader says why
    if path.suffix != ".py" or not path.is_file():
        return False
    try:
        tree = ast.parse(path.read_text())
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return False
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    return bool({"Model", "get_inputs", "get_init_inputs"} & names)


def _constants(tree: ast.Module) -> list[str]:
    """Names assigned at the module's top level, in source order."""
    out: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        out += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in out]
    return out


def override_sizes(source: str, sizes: dict[str, int], origin: str) -> str:
    """The problem's source with the value of each top-level assignment ``NAME = ...`` named in ``sizes`` replaced
    by the given integer (text outside those values untouched). Raises TaskError for a name the file does not
    assign at its top level."""
    small = sorted(k for k, v in sizes.items() if int(v) < 1)
    if small:  # a size of 0 makes empty tensors, which any kernel "passes"
        raise TaskError(f"{origin}: sizes {small} must be at least 1, got {[sizes[k] for k in small]}")
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits = []
    assigned: set[str] = set()
    for node in tree.body:  # NAME = value and NAME: type = value alike
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        assigned.add(name)
        if name in sizes:
            edits.append((value, sizes[name]))
    missing = set(sizes) - assigned
    if missing:
        raise TaskError(f"{origin}: no top-level constant {sorted(missing)} to override; it assigns "
                        f"{_constants(tree)}")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode()))
    data = source.encode()
    for value, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        start = offsets[value.lineno - 1] + value.col_offset
        end = offsets[value.end_lineno - 1] + value.end_col_offset  # type: ignore[operator]
        data = data[:start] + repr(int(new)).encode() + data[end:]
    return data.decode()


def _run_problem(source: str, origin: str) -> dict:
    """Execute the problem file; its namespace. Raises TaskError for a broken file or one without Model,
    get_inputs or get_init_inputs."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TaskError(f"{origin}: KernelBench problems need PyTorch; install it with `pip install torch==2.13.0` "
                        "(CPU build)") from None
    namespace: dict = {"__name__": "kernelbench_problem"}
    with task_code(f"{origin} does not run:", LOAD_SECONDS, late=f"{origin} does not finish running its top level"):
        exec(compile(source, origin, "exec"), namespace)  # noqa: S102 - a task file, trusted as a reference is
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not callable(namespace.get(n))]
    if missing:
        raise TaskError(f"{origin} is not a KernelBench problem: it defines no {', '.join(missing)}")
    return namespace


#: seconds the problem may take to build and run its forward once at load time (meta tensors, then the CPU)
LOAD_SECONDS = 30.0
#: the most bytes of inputs, parameters and buffers loaded on the CPU where the forward cannot run on meta tensors
CPU_FALLBACK_BYTES = 1 << 30


def _instantiate(ns: dict, origin: str, device: str):
    """(forward arguments, model, output) of the problem on ``device`` (``meta``: shapes only). Raises TaskError
    where a step raises or the whole takes over `LOAD_SECONDS`."""
    with task_code(f"{origin}:", LOAD_SECONDS, late=f"{origin}: building the model and running its forward "
                   f"once on {device} tensors did not finish"):
        return _instantiate_unlimited(ns, origin, device)


def _meta_bytes(ns: dict) -> int | None:
    """Bytes of the problem's forward arguments, parameters and buffers, learnt on meta tensors (None where
    ``get_inputs`` or the constructor cannot run there)."""
    import torch

    try:
        with task_code("on meta tensors:", LOAD_SECONDS), torch.device("meta"):
            torch.manual_seed(0)
            model = ns["Model"](*ns["get_init_inputs"]())
            tensors = [a for a in ns["get_inputs"]() if hasattr(a, "nbytes")]
            tensors += [*model.parameters(), *model.buffers()]
            return sum(int(t.nbytes) for t in tensors)
    except TaskError:
        return None


def _instantiate_unlimited(ns: dict, origin: str, device: str):
    import torch

    with torch.device(device):
        torch.manual_seed(0)
        with task_code(f"{origin}: get_init_inputs() raised"):
            init = ns["get_init_inputs"]()
        with task_code(f"{origin}: Model(*get_init_inputs()) raised"):
            model = ns["Model"](*init)
        with task_code(f"{origin}: get_inputs() raised"):
            args = list(ns["get_inputs"]())
        with task_code(f"{origin}: the forward raised"), torch.no_grad():
            out = model(*args)
    return args, model, out


def _dtype_name(t, what: str, origin: str) -> str:
    name = str(t.dtype).removeprefix("torch.")
    from ksearch.tasks.definition import DTYPE_BYTES

    if name not in DTYPE_BYTES:
        raise TaskError(f"{origin}: {what} is {name}, a dtype ksearch cannot hold ({', '.join(DTYPE_BYTES)})")
    return name


def _constructor(ns: dict) -> str:
    """``Model(in_features=16, multiplier=2.0)``: the constructor's arguments by name (the place they have in the
    task: its description; their values are baked into the reference and the inputs' generator)."""
    init = list(ns["get_init_inputs"]())
    try:
        names = [p for p in inspect.signature(ns["Model"].__init__).parameters if p != "self"]
    except (TypeError, ValueError):
        names = []
    names += [f"arg{i}" for i in range(len(names), len(init))]
    text = ", ".join(f"{n}={v!r}" if len(repr(v)) <= 40 else f"{n}=<{type(v).__name__}>" for n, v in zip(names, init))
    return f"Model({text})"


def _ksearch_state_of(model):
    """path -> tensor of what a kernel receives besides the forward's arguments: the module's parameters, its
    buffers, and the tensors it keeps as plain attributes (KernelBench's level-3 RNNs: ``self.h0 = torch.randn(...)``
    in the constructor), which the reference then takes from the inputs as it takes the weights. Its source is
    carried in the task's reference and generator (the wrapper), so a written task folder stands alone."""
    import torch

    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    for prefix, mod in model.named_modules():
        for key, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not key.startswith("_"):
                tensors.setdefault(f"{prefix}.{key}" if prefix else key, value)
    return tensors


#: names a kernel's arguments share with the outputs (an input may not take them) and the generator's ``seed``
RESERVED = ("seed",)


def output_names(count: int, taken: set[str]) -> list[str]:
    """The outputs' names: ``output`` (``output0``, ``output1``, ... for a tuple), else, where the forward already
    has an argument of that name, ``result`` (``result0``, ...), else ``out``."""
    for base in ("output", "result", "out"):
        names = [base] if count == 1 else [f"{base}{i}" for i in range(count)]
        if not taken & set(names):
            return names
    raise TaskError(f"the forward's arguments {sorted(taken)} take every output name ksearch would give")


def load_kernelbench(path: Path, workloads: Path | None = None, sizes: dict[str, int] | None = None) -> Task:
    """A KernelBench problem file as a Task (see the module docstring).

    Args:
        path: the problem ``.py`` file.
        workloads: must be None (a problem fixes its sizes; override them with ``sizes``).
        sizes: top-level constants to replace before the problem runs, e.g. ``{"batch_size": 4}``.

    Raises:
        TaskError: a workloads file, an unreadable file, a file without Model/get_inputs/get_init_inputs, a
            constructor, get_inputs or forward that raises, an input or output of a dtype ksearch cannot hold,
            or torch missing.
    """
    origin = str(path)
    if workloads is not None:
        raise TaskError(f"{origin}: a KernelBench problem fixes its sizes in the file; a workloads file does not "
                        "apply (shrink its size constants with PROBLEM.py:NAME=VALUE,...)")
    try:
        source = path.read_text()
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"cannot read {origin}: {e}") from None
    except SyntaxError as e:
        raise TaskError(f"{origin} is not valid Python: line {e.lineno}: {e.msg}") from None
    if sizes:
        source = override_sizes(source, sizes, origin)
    ns = _run_problem(source, origin)
    try:
        args, model, out = _instantiate(ns, origin, "meta")
    except TaskTimeout:  # not tried again on the CPU
        raise
    except TaskError as on_meta:
        nbytes = _meta_bytes(ns)
        if nbytes is not None and nbytes > CPU_FALLBACK_BYTES:
            raise TaskError(f"{on_meta}; its inputs and weights are {nbytes / 2**20:.0f} MiB, over the "
                            f"{CPU_FALLBACK_BYTES // 2**20} MiB built on the CPU to learn its shapes: shrink its "
                            "sizes with PROBLEM.py:NAME=VALUE,...") from None
        args, model, out = _instantiate(ns, origin, "cpu")
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    forward = [p.name for p in params[:len(args)]] + [f"input{i}" for i in range(len(params), len(args))]
    tensors = _ksearch_state_of(model)
    state: dict[str, str] = {}  # input name -> the tensor's path in the module
    for path_ in tensors:
        name = path_.replace(".", "_")
        state[f"param_{name}" if name in forward else name] = path_
    # an axis shares the kernel's arguments with the inputs (and the generator's with its seed): a constant named
    # like one of them does not name an axis
    taken = set(forward) | set(state) | set(RESERVED)
    constants = [(n, ns[n]) for n in _constants(tree) if type(ns.get(n)) is int and ns[n] > 1 and n not in taken]
    axes: dict[str, ConstAxis] = {}

    def shape(name: str, t) -> list[str]:
        dims = []
        for i, d in enumerate(t.shape):
            # equal-valued constants: the first not yet used in this tensor (a guess; the values agree either way)
            same = [c for c, v in constants if v == d]
            ax = next((c for c in same if c not in dims), same[0] if same else f"{name}_d{i}")
            axes.setdefault(ax, ConstAxis(type="const", value=int(d)))
            dims.append(ax)
        return dims

    def spec(name: str, value, what: str) -> TensorSpec:
        if hasattr(value, "shape"):
            return TensorSpec(shape=shape(name, value), dtype=_dtype_name(value, what, origin), description=what)
        if not isinstance(value, (bool, int, float)):  # a tuple, a string, None: nothing a kernel argument holds
            raise TaskError(f"{origin}: {what} is {type(value).__name__} {str(value)[:60]!r}; ksearch passes tensors "
                            "and numbers to a kernel")
        kind = "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) else "float64"
        return TensorSpec(shape=None, dtype=kind, description=what)

    inputs = {name: spec(name, a, f"the forward's argument {name!r}") for name, a in zip(forward, args)}
    kinds = {**{p: "buffer" for p, _ in model.named_buffers()}, **{p: "parameter" for p, _ in model.named_parameters()}}
    for name, path_ in state.items():
        inputs[name] = spec(name, tensors[path_], f"the module's {kinds.get(path_, 'tensor attribute')} {path_!r}")
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    out_names = output_names(len(outs), set(inputs))
    outputs = {n: spec(n, o, "the forward's result" if len(outs) == 1 else f"the forward's result {i}")
               for i, (n, o) in enumerate(zip(out_names, outs))}
    if any(s.shape is None for s in outputs.values()):
        raise TaskError(f"{origin}: the forward returns a non-tensor; ksearch compares tensors")
    level = path.parent.name if path.parent.name.startswith("level") else None
    doc = inspect.getdoc(ns["Model"]) or ""
    wrapper = _WRAPPER.format(forward=forward, state=state, state_of=inspect.getsource(_ksearch_state_of))
    try:
        definition = Definition(
            name=f"{level}-{path.stem}" if level else path.stem, op_type="kernelbench",
            tags=["kernelbench", *([level] if level else [])],
            description=(doc.strip().splitlines() or [f"KernelBench problem {path.name}"])[0] + f" ({path.name}; "
            f"{_constructor(ns)})",
            axes=dict(axes), inputs=inputs, outputs=outputs, reference=source + wrapper,
            input_generator=source + wrapper, tolerance=TOLERANCE, reference_backend="torch")
    except ValueError as e:
        raise TaskError(f"{origin}: cannot describe the problem as a task: {e}") from None
    workload = Workload(axes={}, name="scaled-sizes" if sizes else "problem-sizes")
    return Task(definition, [workload], {}, origin)


def _load(path: Path, workloads: Path | None) -> Task:
    file, sizes = split_sizes(path)
    return load_kernelbench(file, workloads, sizes)


register(Source(kind="kernelbench", detect=is_kernelbench, load=_load,
                summary="a KernelBench problem file (Model, get_inputs, get_init_inputs); PROBLEM.py:NAME=N,... "
                        "overrides its size constants"))
