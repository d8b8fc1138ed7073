"""What ksearch accepts from the user's files before it trusts them: task files, workloads, kernel files, candidate
JSON and launch plans. Each check raises `TaskError` with one line that names the file or value, never a traceback,
and none of them can hang or exhaust memory on what it is given.

- Files (`read_text`, `open_regular`): regular files only (a FIFO would block the read forever, ``/dev/zero`` never
  ends), at most a size limit per kind (`LIMITS`), UTF-8 text.
- Parsed data (`parse_mapping`, `check_data_size`): JSON or YAML nested at most `MAX_DEPTH` deep, YAML aliases
  expanding to at most `MAX_NODES` values (a "billion laughs" file is small on disk and endless in memory), no alias
  cycles, plain data only (no YAML dates, sets or binary: what is read is hashed and stored as JSON). The llm coder's
  launch plans are read the same way (`ksearch.proposers.llm.parse`).
- Definitions (`check_definition`): axis, input and output names that are identifiers (they become Python keyword
  arguments, C parameters and file names); a name of printable characters without a path separator; expressions
  (constraints, cost model) of at most `MAX_EXPR_CHARS` characters (`check_raw_definition`, before they are parsed).
- Workloads (`check_workload`): axis values and element counts that fit int64; no zero-size input or output unless
  the task allows it (an axis that gives the empty size declares ``min: 0``, or is a const axis); memory that fits
  the machine, checked before anything is allocated (`check_fits_memory`).
- Candidates (`read_candidate`, `check_candidate`): at least one source; source names that are plain file names (no directory, no
  NUL or control character); an entry point that is an identifier; compile flags without NUL.
- A reference's outputs (`check_reference_outputs`): the shapes the definition gives; a wrong one is the task's
  error, not the kernel's INCORRECT_SHAPE.
"""

from __future__ import annotations

import json
import keyword
import math
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ksearch import yamlio
from ksearch.errors import TaskError

if TYPE_CHECKING:
    import numpy as np

    from ksearch.records import Candidate
    from ksearch.tasks.definition import Definition, Workload

MiB = 1 << 20
#: bytes a file of each kind may hold: definitions embed their reference (KernelBench's, GPU MODE's modules), a
#: workloads file holds a line per workload (flashinfer-bench's largest published ones are well under a MiB)
LIMITS: dict[str, int] = {"task file": 16 * MiB, "workloads file": 64 * MiB, "kernel file": 4 * MiB,
                          "candidate JSON": 16 * MiB, "launch plan": 1 * MiB, "baseline file": 4 * MiB}
#: how deep JSON or YAML may nest (a definition is a few levels deep)
MAX_DEPTH = 64
#: values a YAML document may expand to through its aliases
MAX_NODES = 1_000_000
#: characters of one constraint or cost expression
MAX_EXPR_CHARS = 4096
#: characters of a task's, an axis', an input's or a workload's name
MAX_NAME_CHARS = 256
INT64_MAX = (1 << 63) - 1

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shown(path: str | os.PathLike) -> str:
    """A path for a one-line message: as it is, or repr'd when it holds a control character (a newline)."""
    text = os.fspath(path)
    return repr(text) if _CONTROL.search(text) else text


def _show(value: str, most: int = 60) -> str:
    """A value for a message: repr'd (control characters shown escaped), cut at ``most`` characters."""
    return repr(value[:most]) + (f"... ({len(value)} characters)" if len(value) > most else "")


# -- files ------------------------------------------------------------------------------------------------------


def open_regular(path: str | os.PathLike, what: str) -> BinaryIO:
    """``path`` opened for reading in binary, refused unless it is a regular file (checked on the descriptor,
    opened without blocking: a FIFO is refused, not waited on). Raises TaskError."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TaskError(f"cannot read {what} {shown(path)}: {e.strerror or e}") from None
    except ValueError:  # an embedded NUL in the path
        raise TaskError(f"cannot read {what} {_show(str(path))}: the path holds a NUL character") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise TaskError(f"{what} {shown(path)} is a directory, not a file")
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
            raise TaskError(f"{what} {shown(path)} is {kind}: give a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str | os.PathLike, what: str, limit: int | None = None) -> str:
    """The text of a regular file of at most ``limit`` bytes (`LIMITS` of ``what`` by default), as UTF-8.

    The file is opened without blocking and checked on the open descriptor, so a FIFO (or a file swapped for one
    after a check) is refused, not waited on, and a device (``/dev/zero``) is refused before a byte is read.

    Raises:
        TaskError: missing or unreadable, not a regular file, too large, or not UTF-8 (naming the byte).
    """
    path = Path(path)
    limit = LIMITS.get(what, 16 * MiB) if limit is None else limit
    with open_regular(path, what) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise TaskError(f"{what} {shown(path)} is {size} bytes, more than the {limit} a {what} may have")
            data = f.read(limit + 1)
        except OSError as e:
            raise TaskError(f"cannot read {what} {shown(path)}: {e.strerror or e}") from None
    if len(data) > limit:  # it grew while being read
        raise TaskError(f"{what} {shown(path)} is more than the {limit} bytes a {what} may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"{what} {shown(path)} is not UTF-8 text (byte {e.start}: {e.reason})") from None


# -- parsed data ------------------------------------------------------------------------------------------------


def parse_mapping(text: str, source: str, as_json: bool) -> Any:
    """JSON (``as_json``) or YAML (safe: plain data only) parsed, nested at most `MAX_DEPTH` deep and, for YAML,
    expanding to at most `MAX_NODES` values without cycles.

    Raises:
        TaskError: not valid JSON/YAML, nested too deep, or aliases that expand too far or refer to themselves.
    """
    import yaml

    kind = "JSON" if as_json else "YAML"
    try:
        # libyaml's loader where PyYAML has it: it refuses deep nesting at once, where the Python one recurses
        # until the stack runs out (seconds for a few thousand "[")
        data = json.loads(text) if as_json else yamlio.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise TaskError(f"{source} is not valid {kind}: {' '.join(str(e).split())[:300]}") from None
    except (RecursionError, MemoryError):
        raise TaskError(f"{source}: {kind} nested too deep (at most {MAX_DEPTH} levels)") from None
    check_data_size(data, source)
    return data


def check_data_size(data: Any, source: str) -> None:
    """Raises TaskError when ``data`` (parsed JSON or YAML) nests deeper than `MAX_DEPTH`, holds more than
    `MAX_NODES` values counting every alias' expansion, contains itself, or holds a value JSON has no word for (a
    YAML date, set or binary: the data is hashed and stored as JSON). Linear in the distinct values."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        obj, done = stack.pop()
        if not isinstance(obj, (dict, list)):
            if not isinstance(obj, (str, int, float, bool, type(None))):  # YAML's dates, sets, binary
                raise TaskError(f"{source}: holds a {type(obj).__name__} value ({_show(repr(obj), 40)}), where plain "
                                "data (text, numbers, lists, mappings) is expected")
            continue
        key = id(obj)
        children = list(obj.keys()) + list(obj.values()) if isinstance(obj, dict) else obj
        if done:
            active.discard(key)
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            depths[key] = 1 + max((depths.get(id(c), 0) for c in children), default=0)
            if sizes[key] > MAX_NODES:
                raise TaskError(f"{source}: its aliases expand to more than {MAX_NODES} values")
            if depths[key] > MAX_DEPTH:
                raise TaskError(f"{source}: nested too deep (at most {MAX_DEPTH} levels)")
            continue
        if key in sizes:
            continue
        if key in active:
            raise TaskError(f"{source}: an alias refers to a value that contains it (a cycle)")
        active.add(key)
        stack.append((obj, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


# -- definitions ------------------------------------------------------------------------------------------------


def check_raw_definition(data: dict, source: str) -> None:
    """What must hold before a definition's data is validated: its expressions (constraints, cost model) at most
    `MAX_EXPR_CHARS` long (a megabyte-long sum overflows the parser's stack). Raises TaskError."""
    exprs: list[tuple[str, Any]] = []
    constraints = data.get("constraints")
    if isinstance(constraints, list):
        exprs += [(f"constraint {i}", c) for i, c in enumerate(constraints)]
    cost = data.get("cost")
    if isinstance(cost, dict):
        exprs += [(f"cost.{k}", cost.get(k)) for k in ("bytes", "flops", "transcendentals")]
    for where, expr in exprs:
        if isinstance(expr, str) and len(expr) > MAX_EXPR_CHARS:
            raise TaskError(f"{source}: {where} is {len(expr)} characters long, more than the {MAX_EXPR_CHARS} an "
                            f"expression may have: {_show(expr)}")


def check_name(name: str, what: str) -> None:
    """A task's or workload's name: printable, no path separator, at most `MAX_NAME_CHARS`. Raises TaskError."""
    if not name.strip() or len(name) > MAX_NAME_CHARS or _CONTROL.search(name) or "/" in name or "\\" in name:
        raise TaskError(f"{what} name {_show(name)} must be 1 to {MAX_NAME_CHARS} printable characters without / "
                        "or \\")


def check_identifier(name: str, what: str) -> None:
    """A name that becomes a Python argument, a C parameter or a file name: ``[A-Za-z_][A-Za-z0-9_]*``, not a
    Python keyword, at most `MAX_NAME_CHARS`. Raises TaskError."""
    if not _IDENTIFIER.fullmatch(name) or keyword.iskeyword(name) or len(name) > MAX_NAME_CHARS:
        raise TaskError(f"{what} name {_show(name)} is not an identifier (letters, digits and _, not starting with "
                        "a digit, not a Python keyword)")


def check_definition(definition: Definition, source: str) -> None:
    """Names of a definition: the task's (`check_name`), its axes', inputs' and outputs' (`check_identifier`).
    Raises TaskError naming ``source``."""
    source = shown(source)
    try:
        check_name(definition.name, "task")
        for kind, names in (("axis", definition.axes), ("input", definition.inputs),
                            ("output", definition.outputs)):
            for name in names:
                check_identifier(name, kind)
    except TaskError as e:
        raise TaskError(f"{source}: {e}") from None


# -- workloads --------------------------------------------------------------------------------------------------


def check_workload(definition: Definition, workload: Workload, values: dict[str, int]) -> None:
    """A workload's sizes (``values``: its axis values, `Definition.axis_values`): every axis value and element
    count fits int64, and no input or output is empty unless an axis that makes it so allows 0 (a var axis with
    ``min: 0`` given, or a const axis of 0). Raises TaskError."""
    from ksearch.tasks.definition import ConstAxis

    check_name(workload.label, "workload")
    for name, v in values.items():
        if abs(v) > INT64_MAX:
            raise TaskError(f"workload {workload.label!r} gives {name}={v}, beyond int64")
    for kind, specs in (("input", definition.inputs), ("output", definition.outputs)):
        for name, spec in specs.items():
            if spec.shape is None:
                continue
            shape = [values[a] for a in spec.shape]
            count = math.prod(shape)
            if count > INT64_MAX:
                raise TaskError(f"workload {workload.label!r}: {kind} {name!r} of shape {shape} has {count} "
                                "elements, more than int64 can count")
            if count == 0:
                zero = [a for a in spec.shape if values[a] == 0]
                allowed = [a for a in zero if isinstance(definition.axes[a], ConstAxis)
                           or "min" in definition.axes[a].model_fields_set]
                if not allowed:
                    raise TaskError(f"workload {workload.label!r} makes {kind} {name!r} empty ({', '.join(f'{a}=0' for a in zero)}): "
                                    "nothing would be checked; a task that means to judge empty inputs says so with "
                                    f"`min: 0` on the axis {zero[0]!r}")


def machine_memory_bytes() -> int | None:
    """The memory this process may use: physical memory, less where a cgroup limits it; None when unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = None
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(f).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
    return total


def workload_bytes(definition: Definition, values: dict[str, int]) -> int:
    """Bytes judging a workload holds at once, about: its inputs and outputs as stored, and a float64 copy of each
    for the reference (the reference sees its inputs widened, and its outputs are kept in float64)."""
    from ksearch.tasks.definition import DTYPE_BYTES

    total = 0
    for spec in list(definition.inputs.values()) + list(definition.outputs.values()):
        if spec.shape is not None:
            count = math.prod(values[a] for a in spec.shape)
            total += int(count * DTYPE_BYTES[spec.dtype]) + count * 8
    return total


def check_fits_memory(definition: Definition, workload: Workload, values: dict[str, int]) -> None:
    """Raises TaskError, before anything is allocated, when a workload's arrays (`workload_bytes`) do not fit in
    this machine's memory (`machine_memory_bytes`)."""
    need, have = workload_bytes(definition, values), machine_memory_bytes()
    if have is not None and need > have:
        raise TaskError(f"workload {workload.label!r} of {definition.name!r} does not fit in memory: it needs about "
                        f"{need / 1e9:.3g} GB for its inputs and outputs (and their float64 copies for the reference); "
                        f"this machine has {have / 1e9:.3g} GB")


def check_reference_outputs(definition: Definition, values: dict[str, int], outputs: dict[str, np.ndarray],
                            case: str) -> None:
    """Raises TaskError when the reference's outputs do not have the shapes the definition gives: the task is wrong,
    and a kernel judged against it would be blamed (INCORRECT_SHAPE) for the reference's fault. ``case``: the
    workload and seed, for the message."""
    for name, out in outputs.items():
        spec = definition.outputs.get(name)
        if spec is None:
            continue
        want = () if spec.shape is None else tuple(values[a] for a in spec.shape)
        if tuple(out.shape) != want:
            raise TaskError(f"the reference of {definition.name!r} returned output {name!r} of shape "
                            f"{tuple(out.shape)} {case}; the definition gives {list(spec.shape or [])} = {want}: "
                            "the task is wrong, not the kernel")


# -- candidates -------------------------------------------------------------------------------------------------


def read_candidate(path: str | os.PathLike) -> Candidate:
    """A candidate JSON file (`ksearch knowledge render -o`, a run's ``best/candidate.json``): read as `read_text`
    does, decoded, and checked (`check_candidate`).

    Raises:
        TaskError: the file cannot be read, is not a candidate, or a candidate with bad names.
    """
    from ksearch.records import Candidate

    text = read_text(path, "candidate JSON")
    try:
        candidate = Candidate.model_validate_json(text)
    except ValueError as e:  # pydantic's ValidationError, a JSON error
        raise TaskError(f"{shown(path)} is not a candidate JSON: {' '.join(str(e).split())[:300]}") from None
    check_candidate(candidate, str(path))
    return candidate


def check_candidate(candidate: Candidate, source: str) -> None:
    """A candidate from outside (a JSON file, a kernel path): at least one source, each named by a plain file name
    (no directory part, no NUL or control character, not ``.``/``..``, at most 255 bytes), an identifier as its
    entry point, compile flags without NUL. Raises TaskError naming ``source``."""
    source = shown(source)
    if not candidate.sources:
        raise TaskError(f"{source}: a candidate needs at least one source file")
    for name in candidate.sources:
        if not name or name in (".", "..") or "/" in name or "\\" in name or _CONTROL.search(name) \
                or len(name.encode("utf-8", "surrogatepass")) > 255:
            raise TaskError(f"{source}: source name {_show(name)} is not a plain file name (no directory, no control "
                            "character, at most 255 bytes)")
    if not _IDENTIFIER.fullmatch(candidate.entry_point) or len(candidate.entry_point) > MAX_NAME_CHARS:
        raise TaskError(f"{source}: entry point {_show(candidate.entry_point)} is not an identifier")
    for flag in candidate.compile_flags:
        if "\x00" in flag:
            raise TaskError(f"{source}: compile flag {_show(flag)} holds a NUL character")
