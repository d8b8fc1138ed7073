"""The architecture's rules, checked on the source (docs/ARCHITECTURE.md): the layers contract (no package
imports from a layer above it, function-local imports included), the lint, and the type check of the core."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ksearch"
#: the type-checked core: the world model and strategy, the judge, the records and the target contract
CORE = ["src/ksearch/search", "src/ksearch/eval", "src/ksearch/records.py", "src/ksearch/protocol.py",
        "src/ksearch/targets/base.py"]


def test_layers_contract_holds():
    """import-linter's layers contract in pyproject.toml: a module imports only from its own layer or below."""
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert code == 0, "an import goes up a layer: see the contract's report above (pyproject.toml, tool.importlinter)"


def _layers() -> list[list[str]]:
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    return [[p.strip() for p in layer.split("|")] for layer in cfg["layers"]]


def test_layers_contract_fails_on_an_upward_import(tmp_path):
    """The same check on a contract that puts tasks above targets (targets import tasks) reports it broken."""
    from importlinter.cli import lint_imports

    cfg = tmp_path / "inverted.toml"
    cfg.write_text('[tool.importlinter]\nroot_package = "ksearch"\n[[tool.importlinter.contracts]]\n'
                   'name = "inverted"\ntype = "layers"\nlayers = ["ksearch.tasks", "ksearch.targets"]\n')
    assert lint_imports(config_filename=str(cfg), no_cache=True, no_logo=True) != 0


def upward_imports(files: list[Path], highest: str) -> list[str]:
    """Imports of ksearch packages above the layer of ``highest`` in these files (`file:line imports name`)."""
    rank = {pkg: i for i, layer in enumerate(_layers()) for pkg in layer}
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                parts = name.split(".")
                if parts[0] == "ksearch" and len(parts) > 1 and rank.get(".".join(parts[:2]), 0) < rank[highest]:
                    bad.append(f"{f}:{node.lineno} imports {name}")
    return bad


def test_task_data_imports_nothing_above_tasks():
    """Task directories (baselines and other Python files under tasks/builtin/) are data loaded by the judge, not
    packages import-linter sees: they may import ksearch only from the tasks layer or below."""
    files = sorted((SRC / "tasks" / "builtin").rglob("*.py"))
    assert files, "no Python files under tasks/builtin: the check would check nothing"
    assert upward_imports(files, "ksearch.tasks") == []


def test_task_data_check_sees_an_upward_import(tmp_path):
    f = tmp_path / "baseline.py"
    f.write_text("import numpy\nfrom ksearch.tasks import inputs\n\ndef run():\n    from ksearch.targets import x\n")
    assert upward_imports([f], "ksearch.tasks") == [f"{f}:5 imports ksearch.targets"]


def test_ruff_lint_passes():
    """ruff with the rules of pyproject.toml ([tool.ruff]) over the source, the tests and the bench scripts."""
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                          "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_core_type_checks():
    """mypy ([tool.mypy] in pyproject.toml) over the core packages."""
    from mypy import api

    stdout, stderr, code = api.run(["--no-error-summary", "--cache-dir", str(ROOT / ".mypy_cache"), *CORE])
    assert code == 0, stdout + stderr
