"""The layers of docs/architecture.md, checked: import-linter's contracts ([tool.importlinter] in
pyproject.toml) hold for the code, and fail when an upward import is added; no two modules import
each other; no module grows past 450 lines; fault injection lives in one module, installed at build
time."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    if not LINT_IMPORTS.is_file():
        pytest.skip("import-linter is not installed (requirements.txt installs it)")
    return subprocess.run([str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_hold():
    result = lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract is not vacuous: base importing the loop, and the library importing a script, fail."""
    for name in ("training", "models", "scripts"):
        shutil.copytree(REPO_ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "training" / "base" / "files.py", "a") as file:
        file.write("\nfrom training.loop import train  # noqa: E402,F401 (the upward import under test)\n")
    with open(tmp_path / "training" / "step" / "ema.py", "a") as file:
        file.write("\nimport scripts.soak  # noqa: E402,F401\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "training.base is not allowed to import training.loop" in result.stdout
    assert "training.base.files -> training.loop.train" in result.stdout
    assert "training.step.ema -> scripts.soak" in result.stdout
    assert "Contracts: 0 kept, 2 broken" in result.stdout


def test_no_module_in_training_is_longer_than_450_lines():
    lengths = {str(p.relative_to(REPO_ROOT)): len(p.read_text().splitlines()) for p in (REPO_ROOT / "training").rglob("*.py")}
    assert {path: n for path, n in lengths.items() if n > 450} == {}


def test_only_the_fault_injection_module_reads_fault_settings():
    readers = [str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "training").rglob("*.py")
               if re.search(r"TAEHV_FAULT_", p.read_text())]
    assert readers == ["training/loop/fault_injection.py"]


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports anywhere: top level, inside functions, and under
    `if TYPE_CHECKING:` (a type-only import still makes two files depend on each other)."""
    modules = {".".join(p.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in paths}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: `from .x import y` in package a.b is a.b.x
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle of imports once, as the shortest chain a -> b -> ... -> a through one of its imports."""
    cycles, seen = [], set()
    for start in sorted(graph):
        for first in sorted(graph[start]):
            came_from, frontier = {first: None}, [first]
            while frontier and start not in came_from:  # breadth first: the shortest way back
                reached = []
                for module in frontier:
                    for target in sorted(graph[module] - came_from.keys()):
                        came_from[target] = module
                        reached.append(target)
                frontier = reached
            if start in came_from:
                chain, module = [], start
                while module is not None:
                    chain.append(module)
                    module = came_from[module]
                if frozenset(chain) not in seen:
                    seen.add(frozenset(chain))
                    cycles.append(" -> ".join([start, *reversed(chain)]))
    return cycles


def python_files(*roots: str) -> list[Path]:
    return [p for root in roots for p in ([REPO_ROOT / root] if root.endswith(".py") else (REPO_ROOT / root).rglob("*.py"))]


def test_no_two_modules_import_each_other():
    """No circle of imports, not even through an import inside a function or under TYPE_CHECKING:
    within a room (training/config/legacy.py and load.py), across layers, or between inference.py
    and the scripts it uses (compare_models, evaluation_inputs)."""
    assert import_cycles(import_graph(python_files("training", "models", "scripts", "inference.py"))) == []
