"""The target registry (targets/base.py): target modules found by name, each target answering the whole contract."""

from __future__ import annotations

import types

import pytest

from ksearch.errors import TargetError
from ksearch.tasks import load_task
from ksearch.targets import base
from ksearch.targets.base import Target, aliases, get_target, resolve_target, target_names

METHODS = ("available", "abi", "naive_candidate", "hardware_spec", "launch_problem", "evict_library", "compile",
           "compile_report", "profiler", "load")


def test_the_targets_are_listed_in_order_with_the_alias_before_what_it_stands_for():
    assert target_names() == ["cpu", "cuda", "triton", "mlx", "mlx-metal", "mlx-cuda", "null"]
    assert aliases() == {"mlx": ["mlx-metal", "mlx-cuda"]}
    assert "cpu_runtime" not in base._module_names() and "base" not in base._module_names()  # helpers: no target


@pytest.mark.parametrize("name", [n for n in target_names() if n not in aliases()],
                         ids=lambda n: f"target-{n}")  # an id "cuda" would be skipped as a cuda-marked test
def test_every_target_answers_every_fact_of_the_contract(name):
    t = get_target(name)
    facts = [k for k in Target.__annotations__ if not k.startswith("_")]
    assert len(facts) > 20 and all(hasattr(t, k) for k in facts), [k for k in facts if not hasattr(t, k)]
    assert all(callable(getattr(t, m)) for m in METHODS)
    assert t.name == name and t.naive_file.endswith(t.source_suffixes) and t.hardware_kind in ("cpu", "gpu")
    assert set(t.fence_files.values()) and all(f.endswith(t.source_suffixes) for f in t.fence_files.values())
    assert t.fence_lang in t.fence_files and t.fence_langs[t.naive_file[t.naive_file.rfind("."):]] == t.fence_lang
    assert bool(t.launch_keys) == t.takes_launch and (not t.gpu_devices or t.needs_gpu)
    assert t.prompt_template is None or t.prompt_template.is_file()
    task = load_task("selective-scan")
    naive = t.naive_candidate(task)
    assert naive is not None and set(naive.sources) == {t.naive_file} and bool(naive.launch) == t.takes_launch
    abi = t.abi(task.definition)
    assert all(f"{n}," in abi or f"{n})" in abi for n in [*task.definition.inputs, *task.definition.outputs]), abi


def test_an_unknown_name_is_refused_naming_the_known_ones():
    with pytest.raises(TargetError, match=r"unknown target 'hip'; known: cpu, cuda, triton, mlx, mlx-metal, "
                                          r"mlx-cuda, null"):
        get_target("hip")
    assert resolve_target("cpu") == "cpu" and resolve_target("hip") == "hip"  # unknown names stay as they are


def test_a_new_target_is_one_module(monkeypatch):
    """A module declaring TARGETS (and ALIASES) is found by name: nothing else in the registry changes."""
    class Hip:
        name = "hip"

    hip = types.ModuleType("ksearch.targets.hip")
    hip.TARGETS, hip.ALIASES, hip.ORDER = {"hip": Hip}, {"rocm": lambda name: "hip"}, 40
    real_names, real_module = base._module_names, base._module
    monkeypatch.setattr(base, "_module_names", lambda: sorted([*real_names(), "hip"]))
    monkeypatch.setattr(base, "_module", lambda n: hip if n == "hip" else real_module(n))
    assert isinstance(get_target("hip"), Hip) and isinstance(get_target("rocm"), Hip)
    assert target_names().index("rocm") == target_names().index("mlx-cuda") + 1  # ORDER 40: after mlx (30)


def test_a_target_module_that_does_not_import_hides_only_its_own_targets(monkeypatch):
    real_names, real_module = base._module_names, base._module
    monkeypatch.setattr(base, "_module_names", lambda: sorted([*real_names(), "broken"]))
    monkeypatch.setattr(base, "_module", lambda n: "ImportError: no module named rocm" if n == "broken"
                        else real_module(n))
    assert get_target("cpu").name == "cpu" and "broken" not in target_names()
    with pytest.raises(TargetError, match=r"target modules that do not import: broken.py \(ImportError"):
        get_target("hip")
