"""GPU MODE problem folders as ksearch tasks (the layout of https://github.com/gpu-mode/reference-kernels).

A problem folder holds ``task.yml`` (``files``: the modules of the problem, e.g. ``utils.py`` from ``../utils.py``;
``tests`` and ``benchmarks``: lists of sizes with a seed) and ``reference.py`` with ``generate_input(**sizes, seed)``
(the problem's data: a tensor or a tuple of tensors), ``ref_kernel(data)`` (the expected output) and
``check_implementation(data, output)`` (the problem's own verdict; it may scale its tolerance with the size). It
loads as:

- axes: each size of ``tests``/``benchmarks`` is a ``var`` axis; every dimension of the data and of the output is
  named after the size it equals in every workload (``size``), else it is a ``const`` axis ``<tensor>_d<i>`` where
  it never changes, else a ``var`` axis of that name that each workload gives, tied to the sizes by a constraint
  (`relation`: ``x_d1 == size + 2``, else the workloads' own pairs), so another workload must keep it consistent;
- inputs: the parts of the data, named as ``ref_kernel`` unpacks them (``A, B = data``), else ``input0``, ...; a
  part that is an output buffer (GPU MODE's ``(input, output)`` pairs) is a read-only input like the others, and the
  kernel writes its own output; outputs: ``output`` (``result`` where an input is named so), ``output0``, ... for a
  tuple;
- workloads: ``test<i>-<sizes>`` (purpose ``check``) and ``bench<i>-<sizes>`` (purpose ``bench``). Their seeds are not
  kept: every check draws fresh data with ``generate_input(**sizes, seed=<the check's seed>)`` (the definition's
  ``input_generator``);
- the reference: ``ref_kernel``; the verdict: ``check_implementation`` on the data and the candidate's output (the
  definition's ``checker``, `ksearch.eval.evaluator.Evaluator` calls it instead of the tolerance; a non-finite value
  where the reference is finite fails first). Both get the data on the device ``generate_input`` put it on at import
  (``cuda`` for most GPU MODE problems), the candidate's output moved there too.

The problem's modules are bundled into the definition (a task folder written by ``ksearch tasks import`` stands
alone) and imported from the bundle when first needed; they are trusted code, run in this process as every
reference is. A problem that allocates on ``cuda`` needs a CUDA build of torch to load.
"""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from ksearch import yamlio
from ksearch.errors import TaskError, TaskTimeout
from ksearch.tasks.definition import ConstAxis, Definition, TensorSpec, VarAxis, Workload
from ksearch.tasks.guard import task_code
from ksearch.tasks.importers import Source, register
from ksearch.tasks.loader import Task, load_workloads

_BUNDLE = '''# --- GPU MODE problem modules, bundled by ksearch's importer: module name -> source
_KSEARCH_SOURCES = {sources!r}


def _ksearch_reference():
    """The problem's ``reference`` module; its imports of the bundled modules are served from the bundle."""
    import importlib
    import importlib.abc
    import importlib.util
    import sys

    if "_ksearch_module" in globals():
        return globals()["_ksearch_module"]

    class _Bundle(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            return importlib.util.spec_from_loader(name, self) if name in _KSEARCH_SOURCES else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            code = compile(_KSEARCH_SOURCES[module.__name__], module.__name__ + ".py", "exec")
            exec(code, module.__dict__)

    saved = {{n: sys.modules.pop(n) for n in list(_KSEARCH_SOURCES) if n in sys.modules}}
    bundle = _Bundle()
    sys.meta_path.insert(0, bundle)
    try:
        module = importlib.import_module("reference")
    finally:
        sys.meta_path.remove(bundle)
        for n in _KSEARCH_SOURCES:
            sys.modules.pop(n, None)
        sys.modules.update(saved)
    globals()["_ksearch_module"] = module
    return module
'''

_WRAPPER = '''

# --- the task's functions over the problem's (added by ksearch's GPU MODE importer)
_KSEARCH_SIZES = {sizes!r}  # generate_input's size arguments
_KSEARCH_PARTS = {parts!r}  # the data's parts, in order
_KSEARCH_TUPLE = {is_tuple!r}  # the data is a tuple (else one tensor)
_KSEARCH_OUTPUTS = {outputs!r}
_KSEARCH_OUT_TUPLE = {out_tuple!r}  # ref_kernel returns a tuple (its check indexes it, even with one part)
_KSEARCH_DEVICE = {device!r}  # where generate_input put the data when the task was imported


def _ksearch_data(inputs):
    parts = tuple(inputs[n].to(_KSEARCH_DEVICE) if hasattr(inputs[n], "to") else inputs[n] for n in _KSEARCH_PARTS)
    return parts if _KSEARCH_TUPLE else parts[0]


def run(**inputs):
    out = _ksearch_reference().ref_kernel(_ksearch_data(inputs))
    return tuple(o.cpu() for o in out) if isinstance(out, (tuple, list)) else out.cpu()


def generate(seed, **axes):
    data = _ksearch_reference().generate_input(**{{k: axes[k] for k in _KSEARCH_SIZES}}, seed=seed)
    return dict(zip(_KSEARCH_PARTS, data if _KSEARCH_TUPLE else (data,)))


def check(inputs, outputs):
    out = tuple(outputs[n].to(_KSEARCH_DEVICE) for n in _KSEARCH_OUTPUTS)
    return _ksearch_reference().check_implementation(_ksearch_data(inputs), out if _KSEARCH_OUT_TUPLE else out[0])
'''


def is_gpumode(path: Path) -> bool:
    """A folder holding ``task.yml`` and ``reference.py``."""
    return path.is_dir() and (path / "task.yml").is_file() and (path / "reference.py").is_file()


def _read_spec(path: Path) -> dict:
    try:
        spec = yamlio.safe_load((path / "task.yml").read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TaskError(f"{path}/task.yml does not read: {e}") from None
    if not isinstance(spec, dict):
        raise TaskError(f"{path}/task.yml must hold a mapping, found {type(spec).__name__}")
    return spec


def _modules(path: Path, spec: dict) -> dict[str, str]:
    """The problem's Python modules by name, from task.yml's ``files`` (the submission and the ``config.main``
    harness left out), else the folder's own ``task.py``, ``utils.py`` and ``reference.py``."""
    main = (spec.get("config") or {}).get("main", "eval.py")
    entries = spec.get("files") or [{"name": n, "source": n} for n in ("task.py", "utils.py", "reference.py")
                                     if (path / n).is_file()]
    out: dict[str, str] = {}
    for entry in entries:
        if not isinstance(entry, dict) or "name" not in entry or "source" not in entry:
            raise TaskError(f"{path}/task.yml: a files entry must give name and source, found {entry!r}")
        name, src = str(entry["name"]), str(entry["source"])
        if src == "@SUBMISSION@" or name == main or not name.endswith(".py"):
            continue
        try:
            out[name.removesuffix(".py")] = (path / src).read_text()
        except OSError as e:
            raise TaskError(f"{path}/task.yml: file {name!r} from {src!r} does not read: {e.strerror}") from None
    if "reference" not in out:
        raise TaskError(f"{path}/task.yml lists no reference.py among its files")
    return out


def _workload_sizes(path: Path, spec: dict) -> tuple[list[str], list[tuple[str, str, dict[str, int], int]]]:
    """(size names, [(workload name, purpose, sizes, seed)]) from task.yml's tests and benchmarks."""
    rows = []
    for key, prefix, purpose in (("tests", "test", "check"), ("benchmarks", "bench", "bench")):
        for i, entry in enumerate(spec.get(key) or []):
            if not isinstance(entry, dict):
                raise TaskError(f"{path}/task.yml: {key}[{i}] must be a mapping of sizes, found {entry!r}")
            sizes = {k: int(v) if isinstance(v, bool) else v for k, v in entry.items() if k != "seed"}
            bad = {k: v for k, v in sizes.items() if type(v) is not int}
            if bad:
                raise TaskError(f"{path}/task.yml: {key}[{i}] gives {bad}; ksearch axes are integers (a true/false "
                                "flag is read as 1/0)")
            label = "-".join(f"{k}{v}" for k, v in sizes.items())
            rows.append((f"{prefix}{i}-{label}" if label else f"{prefix}{i}", purpose, sizes, int(entry.get("seed", 0))))
    if not rows:
        raise TaskError(f"{path}/task.yml has no tests or benchmarks: no sizes to load the problem at")
    names = list(rows[0][2])
    for name, _, sizes, _ in rows:
        if list(sizes) != names:
            raise TaskError(f"{path}/task.yml: workload {name} gives sizes {list(sizes)}, the first {names}")
    return names, rows


def _part_names(reference_source: str, count: int, is_tuple: bool) -> list[str]:
    """Names of the data's parts, as ``ref_kernel`` unpacks its argument (``a, b, c = data``), else
    ``input0``, ...; a single tensor is named after ``ref_kernel``'s parameter (``data``)."""
    try:
        tree = ast.parse(reference_source)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "ref_kernel"), None)
    param = fn.args.args[0].arg if fn is not None and fn.args.args else "data"
    if not is_tuple:
        return [param]
    for node in ast.walk(fn) if fn is not None else []:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == param \
                and isinstance(node.targets[0], ast.Tuple) and len(node.targets[0].elts) == count \
                and all(isinstance(e, ast.Name) for e in node.targets[0].elts):
            names = [e.id for e in node.targets[0].elts]  # type: ignore[attr-defined]
            if len(set(names)) == count:
                return names
    return [f"input{i}" for i in range(count)]


def _dtype(value, what: str, origin: str) -> str:
    from ksearch.tasks.definition import DTYPE_BYTES

    if not hasattr(value, "shape"):
        return "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) else "float64"
    name = str(value.dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise TaskError(f"{origin}: {what} is {name}, a dtype ksearch cannot hold ({', '.join(DTYPE_BYTES)})")
    return name


#: seconds generate_input, or ref_kernel, may take on one workload at load time
PROBE_SECONDS = 120.0


def _probe(ns: dict, origin: str, rows) -> tuple[list, list, bool, bool, str]:
    """The data and the reference output of every workload, as meta tensors (shapes and dtypes): ([data parts per
    workload], [outputs per workload], whether the data is a tuple, whether ref_kernel returns a tuple (a
    one-element one included), the first workload's data's torch device). Each call is stopped after
    `PROBE_SECONDS`."""
    import torch

    ref = ns["_ksearch_reference"]()
    data_all, out_all, device = [], [], "cpu"
    is_tuple = out_tuple = False
    for name, _, sizes, seed in rows:
        call = f"{origin}: generate_input({sizes}, seed={seed}) for {name}"
        try:
            with task_code(f"{call} raised", PROBE_SECONDS):
                data = ref.generate_input(**sizes, seed=seed)
        except TaskTimeout:
            raise
        except TaskError as e:
            torch_device = "cuda"  # torch's device, named in the problem's own error (not a ksearch target)
            hint = "" if torch.cuda.is_available() or torch_device not in str(e).lower() else \
                " (the problem allocates on CUDA, which this torch cannot reach: load it where a CUDA build of torch sees a GPU)"
            raise TaskError(f"{e}{hint}") from None
        is_tuple = isinstance(data, (tuple, list))
        parts = list(data) if is_tuple else [data]
        if not all(hasattr(p, "shape") or isinstance(p, (int, float)) for p in parts):
            raise TaskError(f"{origin}: generate_input returns {type(data).__name__} with parts "
                            f"{[type(p).__name__ for p in parts]}; ksearch reads a tensor or a tuple of tensors")
        meta = [p.to("meta") if hasattr(p, "to") else p for p in parts]
        kernel = f"{origin}: ref_kernel on {name}"
        try:  # shapes only: on the meta device where the reference runs there, else on the data itself
            with task_code(f"{kernel} raised", PROBE_SECONDS), torch.device("meta"):
                out = ref.ref_kernel(tuple(meta) if isinstance(data, (tuple, list)) else meta[0])
        except TaskTimeout:
            raise
        except TaskError:
            copies = [p.clone() if hasattr(p, "clone") else p for p in parts]
            with task_code(f"{kernel} raised", PROBE_SECONDS):
                out = ref.ref_kernel(tuple(copies) if isinstance(data, (tuple, list)) else copies[0])
            del copies
        out_tuple = isinstance(out, (tuple, list))
        outs = list(out) if out_tuple else [out]
        if not all(hasattr(o, "shape") for o in outs):
            raise TaskError(f"{origin}: ref_kernel returns {type(out).__name__}; ksearch compares tensors")
        if data_all and (len(parts), len(outs)) != (len(data_all[0]), len(out_all[0])):
            raise TaskError(f"{origin}: {name} has {len(parts)} data parts and {len(outs)} outputs, the first "
                            f"workload {len(data_all[0])} and {len(out_all[0])}")
        if not data_all:
            device = next((str(p.device) for p in parts if hasattr(p, "device")), "cpu")
        # shapes and dtypes are all that is read on: every workload's data held at once could be gigabytes
        data_all.append(meta)
        out_all.append([o.to("meta") if hasattr(o, "to") else o for o in outs])
        del data, parts, out, outs
    return data_all, out_all, is_tuple, out_tuple, device


def relation(axis: str, values: list[int], sizes: list[dict[str, int]]) -> str:
    """A constraint tying a derived dimension to the sizes: ``axis == a * size + b`` (integers a, b) where one size
    explains its values in every workload, else the workloads' own pairs (``(size == 16 and x_d1 == 20) or ...``).
    A workload given later (a user's, a hidden one) must then keep the dimension consistent with the sizes."""
    for name in sizes[0]:
        xs = [w[name] for w in sizes]
        pairs = sorted(set(zip(xs, values)))
        if len({x for x, _ in pairs}) != len(pairs):
            continue  # one size value with two dimension values: not a function of this size
        if len(pairs) == 1:
            continue
        (x0, y0), (x1, y1) = pairs[0], pairs[1]
        if (y1 - y0) % (x1 - x0):
            continue
        a = (y1 - y0) // (x1 - x0)
        b = y0 - a * x0
        if all(y == a * x + b for x, y in pairs):
            term = name if a == 1 else f"{a} * {name}"
            return f"{axis} == {term}" + (f" + {b}" if b > 0 else f" - {-b}" if b < 0 else "")
    cases = sorted({(tuple(w.items()), v) for w, v in zip(sizes, values)})
    return " or ".join("(" + " and ".join(f"{k} == {x}" for k, x in w) + f" and {axis} == {v})" for w, v in cases)


def load_gpumode(path: Path, workloads: Path | None = None) -> Task:
    """A GPU MODE problem folder as a Task (see the module docstring).

    Args:
        path: the problem folder (``task.yml``, ``reference.py``).
        workloads: an optional JSONL workloads file replacing task.yml's tests and benchmarks (each must give every
            var axis, the sizes and any derived dimension).

    Raises:
        TaskError: an unreadable task.yml, a missing module, no tests or benchmarks, non-integer sizes, a reference
            without generate_input, ref_kernel or check_implementation, one of them raising, data or outputs ksearch
            cannot represent (a dict, a dtype it cannot hold, ranks that change between workloads), or torch missing.
    """
    origin = str(path)
    spec = _read_spec(path)
    modules = _modules(path, spec)
    size_names, rows = _workload_sizes(path, spec)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TaskError(f"{origin}: GPU MODE problems are PyTorch code; install it with `pip install torch==2.13.0` "
                        "(CPU build)") from None
    bundle = _BUNDLE.format(sources=modules)
    ns: dict = {"__name__": "ksearch_gpumode"}
    with task_code(f"{origin}: reference.py does not import:", PROBE_SECONDS,
                   late=f"{origin}: reference.py does not finish importing"):
        exec(compile(bundle, origin, "exec"), ns)  # noqa: S102 - task code, trusted as a reference is
        ref = ns["_ksearch_reference"]()
    missing = [f for f in ("generate_input", "ref_kernel", "check_implementation") if not callable(getattr(ref, f, None))]
    if missing:
        raise TaskError(f"{origin}: reference.py defines no {', '.join(missing)}")
    data_all, out_all, is_tuple, out_tuple, device = _probe(ns, origin, rows)
    parts = _part_names(modules["reference"], len(data_all[0]), is_tuple)
    out_names = ["result" if "output" in parts else "output"] if len(out_all[0]) == 1 else \
        [f"output{i}" for i in range(len(out_all[0]))]
    axes: dict[str, ConstAxis | VarAxis] = {n: VarAxis(type="var") for n in size_names}
    derived: list[dict[str, int]] = [{} for _ in rows]
    constraints: list[str] = []

    def specs(names: list[str], per_wl: list[list], what: str) -> dict[str, TensorSpec]:
        out = {}
        for j, name in enumerate(names):
            values = [row[j] for row in per_wl]
            if not hasattr(values[0], "shape"):
                out[name] = TensorSpec(shape=None, dtype=_dtype(values[0], f"{what} {name!r}", origin),
                                       description=f"{what}, part {j}" if len(names) > 1 else what)
                continue
            ranks = {len(v.shape) for v in values}
            if len(ranks) > 1:
                raise TaskError(f"{origin}: {what} {name!r} has ranks {sorted(ranks)} across workloads")
            dims: list[str] = []
            for i in range(ranks.pop()):
                vec = [int(v.shape[i]) for v in values]
                same = [s for s in size_names if [r[2][s] for r in rows] == vec]
                ax = next((s for s in same if s not in dims), same[0] if same else f"{name}_d{i}")
                if not same and len(set(vec)) == 1:
                    axes[ax] = ConstAxis(type="const", value=vec[0])
                elif not same:
                    axes[ax] = VarAxis(type="var")
                    constraints.append(relation(ax, vec, [r[2] for r in rows]))
                    for w, v in zip(derived, vec):
                        w[ax] = v
                dims.append(ax)
            out[name] = TensorSpec(shape=dims, dtype=_dtype(values[0], f"{what} {name!r}", origin),
                                   description=f"{what}, part {j}" if len(names) > 1 else what)
        return out

    inputs = specs(parts, data_all, "generate_input's data")
    outputs = specs(out_names, out_all, "ref_kernel's result")
    source = bundle + _WRAPPER.format(sizes=size_names, parts=parts, is_tuple=is_tuple, outputs=out_names,
                                      out_tuple=out_tuple, device=device)
    description = str(spec.get("description") or f"GPU MODE problem {path.name}").strip().splitlines()[0] + \
        f" (GPU MODE problem {path.name}; the verdict is its own check_implementation, not the tolerance)"
    try:
        definition = Definition(name=path.name, op_type="gpumode", tags=["gpumode"], description=description,
                                axes=axes, inputs=inputs, outputs=outputs, reference=source, input_generator=source,
                                checker=source, reference_backend="torch", constraints=constraints)
    except ValueError as e:
        raise TaskError(f"{origin}: cannot describe the problem as a task: {e}") from None
    if workloads is not None:
        wls = load_workloads(workloads)
    else:
        wls = [Workload(axes={**sizes, **extra}, name=name, purpose=purpose)
               for (name, purpose, sizes, _), extra in zip(rows, derived)]
    for w in wls:
        definition.check_workload(w)
    return Task(definition, wls, {}, origin)


register(Source(kind="gpumode", detect=is_gpumode, load=load_gpumode,
                summary="a GPU MODE problem folder (task.yml, reference.py with generate_input, ref_kernel, "
                        "check_implementation)"))
