"""Nothing outside ``src/ksearch/targets/`` branches on a target's name (STYLE.md habit 12): a fact about a target is
answered by the target (`ksearch.targets.base.Target`), found by name through the registry.

The scan walks the AST of every Python file under src/ksearch but targets/ (task data such as baselines
included) and flags, where a string is a target name (the registry's names, plus ``mlx`` and ``metal``):

- a comparison (``==``, ``!=``, ``in``, ``not in``) with such a string, or with a tuple / list / set holding one;
- ``.startswith(...)`` / ``.endswith(...)`` with such a string (``target.startswith("mlx")``);
- a dict literal with two or more such keys (a per-target table), and a tuple / list / set literal holding two
  or more (a list of targets).

Vocabularies spelt like target names are told apart by the compared expression's name: a hardware spec's
``kind`` (``cpu`` | ``gpu``: `ksearch.hardware.spec.HardwareSpec.kind`, also as ``getattr(spec, "kind")``) and a
torch device (``torch_device``, the baselines' ``TORCH_DEVICE``).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from ksearch.targets import target_names

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ksearch"
NAMES = frozenset(target_names()) | {"mlx", "metal"}
#: names of expressions whose string values are another vocabulary (see the module docstring)
OTHER_VOCABULARIES = frozenset({"kind", "torch_device", "TORCH_DEVICE"})
_COMPARE = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _strings(node: ast.AST) -> list[str]:
    """The target names a constant or a literal tuple / list / set of constants spells."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [x.value for x in items if isinstance(x, ast.Constant) and isinstance(x.value, str) and x.value in NAMES]


def _label(node: ast.AST) -> str | None:
    """The name an expression goes by: ``x`` for ``x`` and ``a.x``, ``"x"`` for ``getattr(a, "x", ...)``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and \
            len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
        return str(node.args[1].value)
    return None


def scan(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, what) for every branch on a target name in ``source`` (see the module docstring), in line order."""
    found: dict[int, str] = {}
    in_compare: set[int] = set()

    def flag(node: ast.AST, what: str) -> None:
        found.setdefault(node.lineno, what)

    tree = ast.parse(source, filename)  # one tree: `in_compare` holds ids of its nodes
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, operands, operands[1:]):
                if not isinstance(op, _COMPARE):
                    continue
                for side, other in ((a, b), (b, a)):
                    names = _strings(side)
                    if names and _label(other) not in OTHER_VOCABULARIES:
                        flag(node, f"compares with {', '.join(names)}")
                        in_compare.add(id(side))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith") and node.args:
            names = _strings(node.args[0])
            if names and _label(node.func.value) not in OTHER_VOCABULARIES:
                flag(node, f".{node.func.attr}({', '.join(names)})")
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None and _strings(k)]
            if len(keys) >= 2:
                flag(node, f"a table keyed by targets ({', '.join(k.value for k in keys)})")  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in in_compare:
            names = _strings(node)
            if len(names) >= 2:
                flag(node, f"a list of targets ({', '.join(names)})")
    return sorted(found.items())


def _tree_files() -> list[Path]:
    """The Python files under src/ksearch but targets/ (a symlinked copy counts once: as its target)."""
    return sorted(p for p in SRC.rglob("*.py") if "targets" not in p.relative_to(SRC).parts[:1] and not p.is_symlink())


def test_nothing_outside_the_targets_branches_on_a_target_name():
    files = _tree_files()
    assert len(files) > 50 and all("targets" != f.relative_to(SRC).parts[0] for f in files)
    found = [f"{f.relative_to(ROOT)}:{line}: {what}" for f in files for line, what in scan(f.read_text(), str(f))]
    assert found == [], "ask the target instead (ksearch/targets/base.py, Target):\n" + "\n".join(found)


def test_the_scan_flags_every_kind_of_branch_and_spares_other_vocabularies():
    source = '''
if target == "cpu": pass                                  # 2
if name in ("cuda", "triton"): pass                       # 3
if t.name not in GPU: pass
ok = "mlx-metal" != target                                # 5
if target.startswith("mlx"): pass                         # 6
EXT = {"cpu": "c", "cuda": "cu"}                          # 7
GPU = ("cuda", "triton", "mlx-cuda")                      # 8
if spec.kind == "cpu": pass
if getattr(spec, "kind", "") == "cpu": pass
if TORCH_DEVICE == "cuda": pass
if dtype == "float32" or name in ("cpu",): pass           # 12
ONE = {"cpu": 1}
help_text = "cpu, cuda or triton"
'''
    assert [line for line, _ in scan(source)] == [2, 3, 5, 6, 7, 8, 12]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout


#: the tree before the targets answered for themselves, and lines of it where code branched on target names
BEFORE = "1be4820"
FLAGGED_BEFORE = {
    "src/ksearch/tasks/loader.py": [27],  # _NAIVE_EXT
    "src/ksearch/tasks/builtin/attention-prefill/baselines/torch_sdpa.py": [32],  # GPU_TARGETS
    "src/ksearch/tasks/builtin/attention-prefill/baselines/mlx_sdpa.py": [18],  # MLX_TARGETS
    "src/ksearch/proposers/llm/parse.py": [32, 40, 42, 45, 297],  # SOURCE_LANGS, MAIN_LANG, ..., target == "cpu"
    "src/ksearch/proposers/llm/context.py": [143, 145, 147, 148, 158, 165, 174, 178, 180, 230],
    "src/ksearch/proposers/llm/proposer.py": [377],  # the naive file's name
    "src/ksearch/eval/evaluator.py": [57, 193],  # GPU_TARGETS, the naive file's name
    "src/ksearch/eval/static_limits.py": [66, 250, 292, 293, 313],  # LIMIT_RULES, the metal/cuda dialects
    "src/ksearch/knowledge/translation.py": [204],  # MAP_TARGETS
    "src/ksearch/hardware/cache.py": [119, 123, 131, 155],  # spec_for_target, _GPU_TARGETS
    "src/ksearch/search/static_pass.py": [51],  # the naive file's name
    "src/ksearch/cli/eval_cmd.py": [67, 76, 131],
    "src/ksearch/cli/run_cmd.py": [215],
}


def test_the_scan_flags_the_tree_before_the_targets_answered():
    """Run on commit 1be4820 (where nothing asked the targets), the scan finds each known branch."""
    try:
        entries = [line.split(None, 3) for line in _git("ls-tree", "-r", BEFORE, "src/ksearch").splitlines()]
        files = [f for mode, _, _, f in entries if mode != "120000" and f.endswith(".py")  # not a symlink
                 and not f.startswith("src/ksearch/targets/")]
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"commit {BEFORE} is not in this checkout")
    found = {f: [line for line, _ in scan(_git("show", f"{BEFORE}:{f}"), f)] for f in files}
    missing = {f: sorted(set(lines) - set(found.get(f, []))) for f, lines in FLAGGED_BEFORE.items()}
    assert {f: m for f, m in missing.items() if m} == {}
