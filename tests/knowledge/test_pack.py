"""ksearch.knowledge.pack: loading, validation, path resolution, hardware filtering, rendering (no compiler)."""

import shutil
from pathlib import Path

import pytest
import yaml

from ksearch.errors import KnowledgeError
from ksearch.knowledge import load_pack, load_pack_file
from ksearch.knowledge.pack import PACKS_DIR, simd_bits_of
from ksearch.tasks import load_task

PACK_DIR = PACKS_DIR / "selective-scan" / "cpu"


@pytest.fixture(scope="module")
def pack():
    return load_pack("selective-scan", "cpu")


@pytest.fixture(scope="module")
def definition():
    return load_task("selective-scan").definition


def _copy_pack(tmp_path: Path, edit) -> Path:
    """A copy of the built-in pack under tmp_path/<family>/cpu with pack.yaml passed through edit(data)."""
    dst = tmp_path / "selective-scan" / "cpu"
    shutil.copytree(PACK_DIR, dst)
    data = yaml.safe_load((dst / "pack.yaml").read_text())
    edit(data)
    (dst / "pack.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return dst / "pack.yaml"


def _decision(data, dec_id):
    return next(d for d in data["decisions"] if d["id"] == dec_id)


def test_builtin_pack_loads_for_both_tasks(pack):
    assert load_pack("selective-scan-fp16", "cpu").name == pack.name
    assert [f.id for f in pack.families] == ["row-sequential", "channel-vectorized", "chunked-parallel-scan"]
    ids = {d.id for d in pack.decisions}
    assert {"parallelism", "loop_order", "state_storage", "simd", "chunking", "exp", "gating", "loads",
            "compile_flags"} <= ids
    for fam in pack.families:
        for dec in pack.decisions_for(fam.id):
            assert dec.choice(dec.default_for(fam.id)) is not None


def test_no_pack_for_unknown_task_or_target():
    with pytest.raises(KnowledgeError, match="no-such-task"):
        load_pack("no-such-task", "cpu")
    with pytest.raises(KnowledgeError, match="metal"):
        load_pack("selective-scan", "metal")


@pytest.mark.parametrize("edit, field", [
    (lambda d: _decision(d, "exp")["choices"][2].__setitem__("rating", 11), "(exp2-poly).rating"),
    (lambda d: _decision(d, "exp")["choices"][0].__setitem__("colour", "red"), "(libm-expf).colour"),
    (lambda d: d["families"][0].pop("template"), "(row-sequential).template"),
    (lambda d: _decision(d, "gating").__setitem__("default", "third-pass"), "third-pass"),
    (lambda d: _decision(d, "loads")["choices"][1]["knobs"]["token_tile"].__setitem__("default", 7), "token_tile"),
    (lambda d: _decision(d, "simd")["choices"][0].__setitem__("families", ["no-such-family"]), "no-such-family"),
    (lambda d: d["families"][1].__setitem__("template", "missing.c.j2"), "missing.c.j2"),
    (lambda d: _decision(d, "simd")["default"].__setitem__("row-sequential", "state-lanes-avx512"), "must not require"),
])
def test_malformed_pack_raises_knowledge_error_naming_file_and_field(tmp_path, edit, field):
    path = _copy_pack(tmp_path, edit)
    with pytest.raises(KnowledgeError) as err:
        load_pack_file(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_template_syntax_error_names_the_template(tmp_path):
    path = _copy_pack(tmp_path, lambda d: None)
    tpl = path.parent / "templates" / "row_sequential.c.j2"
    tpl.write_text(tpl.read_text() + "\n{% if %}\n")
    with pytest.raises(KnowledgeError, match="row_sequential.c.j2"):
        load_pack_file(path)


def test_partial_path_resolves_to_defaults(pack):
    path = pack.resolve({}, {})
    assert path.family == pack.default_family
    assert path.choices["exp"] == "libm-expf" and path.choices["simd"] == "scalar"
    path = pack.resolve({"family": "channel-vectorized", "exp": "exp2-poly"}, {"poly_degree": 4})
    assert path.choices["simd"] == "channel-lanes-generic" and path.choices["loads"] == "gather"
    assert path.knobs["poly_degree"] == 4 and path.knobs["token_tile"] == 64
    assert "loop_order" not in path.choices  # row-sequential only
    assert pack.resolve({"family": "channel-vectorized", "loads": "gather"}, {"token_tile": "128"}).knobs["token_tile"] == 128


@pytest.mark.parametrize("choices, knobs, named", [
    ({"family": "no-such-family"}, {}, "no-such-family"),
    ({"no_such_decision": "x"}, {}, "no_such_decision"),
    ({"exp": "exp3-magic"}, {}, "exp3-magic"),
    ({"exp": "exp2-poly"}, {"poly_degree": 9}, "poly_degree"),
    ({}, {"no_such_knob": 1}, "no_such_knob"),
    ({}, {"poly_degree": 5}, "not on this path"),  # exp defaults to libm-expf, which has no poly_degree
    ({"loop_order": "state-outer", "family": "channel-vectorized"}, {}, "loop_order"),
    ({"simd": "channel-lanes-avx512"}, {}, "channel-lanes-avx512"),  # not a row-sequential choice
])
def test_unknown_or_misplaced_values_raise(pack, definition, choices, knobs, named):
    with pytest.raises(KnowledgeError, match=named):
        pack.render(definition, choices, knobs)


def test_applicable_filters_by_hardware(pack, definition):
    avx2 = pack.applicable(["sse2", "avx", "avx2", "fma", "f16c"])
    simd = {c.id for c in avx2.decision("simd").choices}
    assert "channel-lanes-avx2" in simd and "channel-lanes-avx512" not in simd
    assert "state-lanes-avx512" not in simd
    with pytest.raises(KnowledgeError, match="avx512f"):
        avx2.render(definition, {"family": "channel-vectorized", "simd": "channel-lanes-avx512"})
    bare = pack.applicable([])
    assert {c.id for c in bare.decision("simd").choices} == {"scalar", "state-lanes-generic", "channel-lanes-generic"}
    assert simd_bits_of(["avx2"]) == 256 and simd_bits_of(["avx512f"]) == 512 and simd_bits_of([]) == 0


def test_render_is_deterministic_and_resolved(pack, definition):
    choices = {"family": "channel-vectorized", "simd": "channel-lanes-avx512", "exp": "exp2-poly",
               "compile_flags": "fast-math"}
    a = pack.render(definition, choices, {"token_tile": 32})
    b = load_pack("selective-scan", "cpu").render(definition, dict(choices), {"token_tile": 32})
    assert a == b and a.content_hash == b.content_hash
    assert a.entry_point == "run" and list(a.sources) == ["kernel.c"]
    assert a.compile_flags == ["-ffast-math"]
    assert a.family == "channel-vectorized" and a.choices["simd"] == "channel-lanes-avx512"
    assert a.knobs["token_tile"] == 32 and a.knobs["poly_degree"] == 5
    assert "#define T 32" in a.sources["kernel.c"]
    c = pack.render(definition, choices, {"token_tile": 64})
    assert c.content_hash != a.content_hash


def test_render_derives_types_from_the_definition(pack, definition):
    fp16 = load_task("selective-scan-fp16").definition
    src32 = pack.render(definition, {}).sources["kernel.c"]
    src16 = pack.render(fp16, {}).sources["kernel.c"]
    assert "const float *restrict u" in src32 and "_Float16" not in src32
    assert "const _Float16 *restrict u" in src16 and "const float *restrict A" in src16
    assert "int64_t batch, int64_t dim, int64_t dstate, int64_t seqlen" in src16


def test_render_rejects_a_task_the_pack_does_not_name(pack, definition):
    other = definition.model_copy(update={"name": "other-task"})
    with pytest.raises(KnowledgeError, match="other-task"):
        pack.render(other, {})
    renamed = definition.model_copy(update={"inputs": {("v" if k == "u" else k): s for k, s in definition.inputs.items()}})
    with pytest.raises(KnowledgeError, match="signature"):
        pack.render(renamed, {})
