"""Fuzzing what ksearch reads from users (`ksearch.tasks.validate`, `ksearch.tasks.loader`): task definition files
(JSON and YAML, near-valid and arbitrary), workloads files, candidate JSON. Whatever the input, the only exception
is ksearch's own (`KsearchError`: the CLI's one line), nothing hangs. A fixed, derandomized example budget keeps CI
deterministic (a few seconds in all)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ksearch.errors import KsearchError
from ksearch.tasks import validate
from ksearch.tasks.loader import _check_workloads, load_definition, parse_workloads

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DEFINITION = {
    "name": "vadd",
    "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 4}},
    "inputs": {"a": {"shape": ["n", "h"], "dtype": "float32"}, "s": {"shape": None, "dtype": "float32"}},
    "outputs": {"c": {"shape": ["n", "h"], "dtype": "float32"}},
    "constraints": ["n % 2 == 0"],
    "cost": {"flops": "n * h"},
    "reference_backend": "numpy",
    "reference": "def run(a, s):\n    return a * s\n",
}

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)
names = st.one_of(st.sampled_from(["n", "h", "a", "s", "c", "m", "lambda", "a/b", "x\x00", "", " ", "ñ", "1x"]),
                  st.text(max_size=8))
axes = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["var", "const", "other"])},
                                       optional={"value": st.integers(-2, 1 << 64), "min": st.integers(-2, 8),
                                                 "max": st.integers(-2, 1 << 64)}), json_values)
specs = st.one_of(st.fixed_dictionaries({"shape": st.one_of(st.none(), st.lists(names, max_size=3)),
                                         "dtype": st.sampled_from(["float32", "int32", "bfloat16", "float128", ""])}),
                  json_values)
exprs = st.one_of(st.sampled_from(["n > 0", "n * h", "n ** 99999999", "max(n, h) // 0", "n.__class__", "(" * 50,
                                   "-" * 500 + "n", "n if h else 1/0", "kv_indptr[-1].item() == n"]),
                  st.text(max_size=30))


def _field(valid, arbitrary):
    """Mostly the valid value, sometimes something else."""
    return st.one_of(st.just(valid), st.just(valid), arbitrary)


definitions = st.fixed_dictionaries({
    "name": _field("vadd", st.one_of(names, json_values)),
    "axes": _field(DEFINITION["axes"], st.dictionaries(names, axes, max_size=3)),
    "inputs": _field(DEFINITION["inputs"], st.dictionaries(names, specs, max_size=3)),
    "outputs": _field(DEFINITION["outputs"], st.dictionaries(names, specs, max_size=2)),
    "constraints": _field(DEFINITION["constraints"], st.one_of(st.lists(exprs, max_size=3), json_values)),
    "cost": _field(DEFINITION["cost"], st.one_of(st.fixed_dictionaries({}, optional={"flops": exprs,
                                                                                    "bytes": exprs}), json_values)),
    "reference_backend": _field("numpy", json_values),
    "reference": _field(DEFINITION["reference"], st.one_of(st.text(max_size=40), json_values)),
}, optional={"tolerance": json_values, "tags": json_values, "extra": json_values})


def _write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def _allowed(call, *args):
    try:
        return call(*args)
    except KsearchError:
        return None


@FUZZ
@given(definition=definitions, as_json=st.booleans())
def test_definition_files(definition, as_json):
    with tempfile.TemporaryDirectory() as d:
        text = json.dumps(definition) if as_json else yaml.safe_dump(definition, allow_unicode=True)
        path = _write(Path(d), "d.json" if as_json else "d.yaml", text.encode("utf-8", "surrogatepass"))
        parsed = _allowed(load_definition, path)
        if parsed is not None:  # what loads is usable: its names and sizes checked on a workload
            wl = _allowed(parse_workloads, '{"axes": {"n": 2}}')
            if wl:
                _allowed(_check_workloads, parsed, wl)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "replace")),
                      st.sampled_from([b"a: &a [*a]\n", b"[" * 5000, b"\xff\xfe", b"name: !!python/object:os.system x",
                                       b"{" * 100 + b"}" * 100, b"---\n- 1\n---\n- 2\n", b"a: *undefined\n"])),
       suffix=st.sampled_from([".json", ".yaml"]))
def test_definition_files_of_arbitrary_bytes(data, suffix):
    with tempfile.TemporaryDirectory() as d:
        _allowed(load_definition, _write(Path(d), "d" + suffix, data))


workload_lines = st.one_of(
    st.fixed_dictionaries({"axes": st.one_of(st.dictionaries(names, st.one_of(st.integers(), scalars), max_size=3),
                                             json_values)},
                          optional={"name": st.one_of(names, json_values), "purpose": st.sampled_from(["check", "x"]),
                                    "inputs": st.one_of(st.dictionaries(names, st.one_of(
                                        st.fixed_dictionaries({"type": st.sampled_from(["random", "scalar",
                                                                                        "safetensors"])},
                                                              optional={"value": scalars, "path": st.text(max_size=10),
                                                                        "tensor_key": st.text(max_size=4)}),
                                        json_values), max_size=2), json_values),
                                    "distributions": json_values}).map(json.dumps),
    st.text(max_size=40))


@FUZZ
@given(lines=st.lists(workload_lines, max_size=4))
def test_workloads(lines):
    from ksearch.tasks.definition import Definition

    definition = Definition.model_validate(DEFINITION)
    workloads = _allowed(parse_workloads, "\n".join(lines), "w.jsonl")
    if workloads is None:
        return
    if _allowed(_check_workloads, definition, workloads) is None and workloads:
        return
    for w in workloads:  # a workload that loads: its bytes and memory check do not fail otherwise
        values = definition.axis_values(w)
        definition.bytes_of(w)
        _allowed(validate.check_fits_memory, definition, w, values)


candidates = st.one_of(
    st.fixed_dictionaries({"target": st.one_of(st.sampled_from(["null", "cpu"]), json_values),
                           "sources": st.one_of(st.dictionaries(names, st.text(max_size=20), max_size=3), json_values)},
                          optional={"entry_point": st.one_of(names, json_values),
                                    "compile_flags": st.one_of(st.lists(st.text(max_size=6), max_size=3), json_values),
                                    "launch": json_values, "meta": json_values}),
    json_values)


@FUZZ
@given(body=candidates)
def test_candidate_json(body):
    with tempfile.TemporaryDirectory() as d:
        path = _write(Path(d), "c.json", json.dumps(body).encode())
        cand = _allowed(validate.read_candidate, path)
        if cand is not None:
            assert cand.sources and cand.entry_point.isidentifier()
            assert all("/" not in n and "\x00" not in n for n in cand.sources)
            assert len(cand.id) == 16  # content-addressed as loaded


@pytest.mark.timeout(60)
def test_the_fuzz_budget_stays_small():
    """The settings above are the CI budget: derandomized (the same examples on every run) and bounded."""
    assert FUZZ.derandomize and FUZZ.max_examples <= 100 and FUZZ.deadline is None
