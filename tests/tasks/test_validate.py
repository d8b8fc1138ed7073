"""Bad input through the CLI (`ksearch tasks show`, `ksearch eval`), one case per kind of fault in task files,
workloads, kernel files and candidate JSON (`ksearch.tasks.validate`): each ends with its exit status, one line on
stderr that names the fault, no traceback and no hang (a FIFO, /dev/zero, a YAML bomb, a megabyte expression)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from ksearch.cli import main

from ..targets.test_null import SPEC

DEFINITION = {
    "name": "vadd",
    "axes": {"n": {"type": "var"}},
    "inputs": {"a": {"shape": ["n"], "dtype": "float32"}, "b": {"shape": ["n"], "dtype": "float32"}},
    "outputs": {"c": {"shape": ["n"], "dtype": "float32"}},
    "reference_backend": "numpy",
    "reference": "import numpy as np\n\ndef run(a, b):\n    return np.asarray(a, np.float64) + b\n",
}
KERNEL = "def run(a, b, c, n):\n    c[...] = a + b\n"


def _task(tmp_path, definition=None, workloads=('{"name": "s", "axes": {"n": 16}}',), raw: bytes | None = None):
    """A task directory (definition.json + workloads.jsonl); ``raw``: the definition file's bytes as given."""
    d = tmp_path / "task"
    d.mkdir(exist_ok=True)
    (d / "definition.json").write_bytes(raw if raw is not None else json.dumps(definition or DEFINITION).encode())
    (d / "workloads.jsonl").write_text("\n".join(workloads) + "\n")
    return str(d)


def _with(**changes):
    return {**DEFINITION, **changes}


def _fifo(tmp_path, name="fifo"):
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


def _sparse(tmp_path, name, size):
    path = tmp_path / name
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def _file(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def _candidate(tmp_path, **fields):
    body = {"target": "null", "sources": {"kernel.py": KERNEL}, **fields}
    return _file(tmp_path, "cand.json", json.dumps(body))


def _eval(task, kernel, *more):
    return ["eval", task, kernel, "--target", "null", "--seeds", "1", "--no-naive", "--json", *more]


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

# (id, argv from tmp_path, exit status, words the error line holds)
CASES = [
    # task files: encoding, kind of file, size, syntax, nesting, aliases
    ("definition-not-utf8", lambda t: ["tasks", "show", _task(t, raw=b'{"name": "v\xff\xfe"}')], 2, "not UTF-8"),
    ("yaml-definition-not-utf8", lambda t: ["tasks", "show", _file(t, "d.yaml", b"name: \xc3\x28\n")], 2,
     "not UTF-8"),
    ("workloads-not-utf8", lambda t: ["tasks", "show", _task(t), "--workloads-file",
                                      _file(t, "w.jsonl", b'{"axes": {"n": 1}, "name": "\xff"}\n')], 2, "not UTF-8"),
    ("workloads-file-is-a-fifo", lambda t: ["tasks", "show", _task(t), "--workloads-file", _fifo(t)], 2,
     "is a FIFO"),
    ("workloads-file-is-dev-zero", lambda t: ["tasks", "show", _task(t), "--workloads-file", "/dev/zero"], 2,
     "is a device"),
    ("workloads-file-is-a-directory", lambda t: ["tasks", "show", _task(t), "--workloads-file", str(t)], 2,
     "is a directory"),
    ("definition-too-large", lambda t: ["tasks", "show", _sparse(t, "big.json", 17 << 20)], 2, "more than"),
    ("workloads-file-too-large", lambda t: ["tasks", "show", _task(t), "--workloads-file",
                                            _sparse(t, "w.jsonl", 65 << 20)], 2, "more than"),
    ("definition-is-a-list", lambda t: ["tasks", "show", _file(t, "d.yaml", "- 1\n- 2\n")], 2, "one object"),
    ("definition-not-yaml", lambda t: ["tasks", "show", _file(t, "d.yaml", "name: [vadd\n")], 2, "not valid YAML"),
    ("yaml-alias-bomb", lambda t: ["tasks", "show", _file(t, "d.yaml", BOMB)], 2, "expand to more than"),
    ("yaml-alias-cycle", lambda t: ["tasks", "show", _file(t, "d.yaml", "name: &a [*a]\n")], 2, "cycle"),
    ("json-nested-too-deep", lambda t: ["tasks", "show", _task(t, raw=b'{"tags": ' + b"[" * 100000 + b"]" * 100000
                                                              + b"}")], 2, "nested too deep"),
    ("workload-line-nested-too-deep", lambda t: ["tasks", "show", _task(t, workloads=(
        '{"axes": {"n": 1}, "x": ' + "[" * 200 + "]" * 200 + "}",))], 2, "nested too deep"),
    # names
    ("input-name-with-slash", lambda t: ["tasks", "show", _task(t, _with(
        inputs={"a/b": {"shape": ["n"], "dtype": "float32"}},
        reference="def run(**kw):\n    return kw['a/b']\n"))], 2, "not an identifier"),
    ("output-name-a-keyword", lambda t: ["tasks", "show", _task(t, _with(
        outputs={"lambda": {"shape": ["n"], "dtype": "float32"}}))], 2, "not an identifier"),
    ("axis-name-with-space", lambda t: ["tasks", "show", _task(t, _with(
        axes={"n m": {"type": "var"}}, inputs={"a": {"shape": ["n m"], "dtype": "float32"}},
        outputs={"c": {"shape": ["n m"], "dtype": "float32"}}), ('{"axes": {"n m": 4}}',))], 2, "not an identifier"),
    ("task-name-a-path", lambda t: ["tasks", "show", _task(t, _with(name="../../etc/vadd"))], 2, "without /"),
    ("task-name-with-nul", lambda t: ["tasks", "show", _task(t, _with(name="va\x00dd"))], 2, "printable"),
    ("workload-name-with-newline", lambda t: ["tasks", "show", _task(t, workloads=(
        '{"name": "s\\nx", "axes": {"n": 4}}',))], 2, "workload name"),
    # expressions
    ("huge-constraint", lambda t: ["tasks", "show", _task(t, _with(constraints=["n" + " + n" * 300000 + " > 0"]))],
     2, "characters long"),
    ("deeply-nested-constraint", lambda t: ["tasks", "show", _task(t, _with(constraints=["-" * 3000 + "n < 0"]))],
     2, "nests too deep"),
    ("constraint-not-python", lambda t: ["tasks", "show", _task(t, _with(constraints=["n >"]))], 2, "not valid"),
    # workloads: sizes
    ("elements-overflow-int64", lambda t: ["tasks", "show", _task(t, _with(
        axes={"n": {"type": "var"}, "m": {"type": "var"}},
        inputs={"a": {"shape": ["n", "m", "m"], "dtype": "float32"}, "b": {"shape": ["n"], "dtype": "float32"}},
        reference="def run(a, b):\n    return b\n"), ('{"axes": {"n": 4, "m": 4294967296}}',))], 2, "int64"),
    ("axis-beyond-int64", lambda t: ["tasks", "show", _task(t, workloads=('{"axes": {"n": 100000000000000000000}}',))],
     2, "beyond int64"),
    ("zero-size-workload", lambda t: ["tasks", "show", _task(t, workloads=('{"name": "empty", "axes": {"n": 0}}',))],
     2, "empty"),
    ("negative-axis", lambda t: ["tasks", "show", _task(t, workloads=('{"axes": {"n": -3}}',))], 2, "allows >= 0"),
    ("workload-not-json", lambda t: ["tasks", "show", _task(t, workloads=('{"axes": {"n": 4}',))], 2,
     "not valid JSON"),
    ("workload-unknown-input", lambda t: ["tasks", "show", _task(t, workloads=(
        '{"axes": {"n": 4}, "inputs": {"zz": {"type": "random"}}}',))], 2, "does not have"),
    ("unknown-dtype", lambda t: ["tasks", "show", _task(t, _with(
        outputs={"c": {"shape": ["n"], "dtype": "float128"}}))], 2, "unknown dtype"),
    # kernel paths
    ("kernel-is-a-fifo", lambda t: _eval(_task(t), _fifo(t, "k.py")), 2, "is a FIFO"),
    ("kernel-is-dev-zero", lambda t: _eval(_task(t), "/dev/zero"), 2, "is a device"),
    ("kernel-too-large", lambda t: _eval(_task(t), _sparse(t, "k.py", 5 << 20)), 2, "more than"),
    ("kernel-not-utf8", lambda t: _eval(_task(t), _file(t, "k.py", b"def run(a, b, c, n):\n    pass # \xff\n")), 2,
     "not UTF-8"),
    ("kernel-missing", lambda t: _eval(_task(t), str(t / "nope.py")), 2, "No such file"),
    ("kernel-name-with-newline", lambda t: _eval(_task(t), _file(t, "k\nx.py", KERNEL)), 2, "plain file name"),
    ("entry-not-an-identifier", lambda t: _eval(_task(t), _file(t, "k.py", KERNEL), "--entry", "run; rm"), 2,
     "entry point"),
    # candidate JSON
    ("candidate-source-name-with-nul", lambda t: _eval(_task(t), _candidate(t, sources={"ker\x00nel.py": KERNEL})),
     2, "plain file name"),
    ("candidate-source-name-a-path", lambda t: _eval(_task(t), _candidate(t, sources={"../../x.py": KERNEL})), 2,
     "plain file name"),
    ("candidate-without-sources", lambda t: _eval(_task(t), _candidate(t, sources={})), 2, "at least one source"),
    ("candidate-entry-point", lambda t: _eval(_task(t), _candidate(t, entry_point="run()")), 2, "entry point"),
    ("candidate-flag-with-nul", lambda t: _eval(_task(t), _candidate(t, compile_flags=["-O2\x00-x"])), 2, "NUL"),
    ("candidate-not-json", lambda t: _eval(_task(t), _file(t, "c.json", "{sources")), 2, "not a candidate JSON"),
    ("candidate-too-large", lambda t: _eval(_task(t), _sparse(t, "c.json", 17 << 20)), 2, "more than"),
    # what only judging finds: checked before anything is allocated, or blamed on the task
    ("workload-larger-than-memory", lambda t: _eval(_task(t, workloads=('{"axes": {"n": 1000000000000000}}',)),
                                                    _file(t, "k.py", KERNEL)), 2, "this machine has"),
    ("reference-output-of-wrong-shape", lambda t: _eval(_task(t, _with(
        reference="import numpy as np\n\ndef run(a, b):\n    return np.zeros(len(a) + 1)\n")),
        _file(t, "k.py", KERNEL)), 2, "the task is wrong"),
    ("safetensors-input-is-a-fifo", lambda t: _eval(_task(t, workloads=(json.dumps(
        {"axes": {"n": 4}, "inputs": {"a": {"type": "safetensors", "path": _fifo(t, "a.safetensors"),
                                            "tensor_key": "a"}}}),)), _file(t, "k.py", KERNEL)), 2, "is a FIFO"),
    ("safetensors-input-is-dev-zero", lambda t: _eval(_task(t, workloads=(json.dumps(
        {"axes": {"n": 4}, "inputs": {"a": {"type": "safetensors", "path": "/dev/zero", "tensor_key": "a"}}}),)),
        _file(t, "k.py", KERNEL)), 2, "is a device"),
]


@pytest.fixture
def null_spec(monkeypatch):
    from ksearch.targets import get_target

    monkeypatch.setattr(type(get_target("null")), "hardware_spec", lambda self: SPEC)  # no probing of this machine


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make, code, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(make, code, words, tmp_path, capsys, monkeypatch, null_spec):
    argv = make(tmp_path)
    monkeypatch.setattr(sys, "argv", ["ksearch", *argv])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_.value.code == code, err
    assert "Traceback" not in err + out
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert words in lines[0], err


def test_a_task_may_allow_empty_workloads(tmp_path, capsys, monkeypatch):
    """``min: 0`` on the axis says the task means to judge empty inputs: the zero-size workload loads."""
    task = _task(tmp_path, _with(axes={"n": {"type": "var", "min": 0}}), ('{"name": "empty", "axes": {"n": 0}}',))
    monkeypatch.setattr(sys, "argv", ["ksearch", "tasks", "show", task])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code in (0, None), capsys.readouterr().err
