"""The import structure of the four packages, read from their source
(every import: at the top, inside a function, under ``TYPE_CHECKING``):
no circle, no import running back up the layers, the learning code free
of the export and the Runner, and the trainer's modules within their
sizes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("track_gen", "rl_triton", "racing_env", "racing_stack")
#: What each package may import of the others (racing_env takes tracks as arrays or files).
ALLOWED = {"track_gen": set(), "rl_triton": set(), "racing_env": set(),
           "racing_stack": {"track_gen", "rl_triton", "racing_env"}}
#: The learning code: it trains a policy and knows nothing of plugins or of running them.
LEARN = ("racing_stack.ppo.algorithm", "racing_stack.ppo.captured", "racing_stack.ppo.checkpoint",
         "racing_stack.ppo.config", "racing_stack.ppo.distributed", "racing_stack.ppo.envs",
         "racing_stack.ppo.graphs", "racing_stack.ppo.logs", "racing_stack.ppo.losses",
         "racing_stack.ppo.networks", "racing_stack.ppo.rollout", "racing_stack.ppo.train",
         "racing_stack.ppo.validation")
NOT_FROM_LEARN = ("racing_stack.ppo.export", "racing_stack.ppo.cli", "racing_stack.learned", "racing_env.runner",
                  "racing_env.plugins", "racing_env.render", "racing_env.isolation")


def modules() -> dict[str, Path]:
    """Every module of the four packages' ``src`` trees, by dotted name."""
    found = {}
    for package in PACKAGES:
        src = ROOT / "packages" / package / "src"
        for path in src.rglob("*.py"):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (``from
    package import submodule`` names the submodule; a name that is not one
    names the package)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in found if m in known and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    assert {"track_gen.course", "rl_triton", "racing_env.core", "racing_stack.ppo.train"} <= set(known)
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_imports_are_read_from_every_place(tmp_path):
    known = {"racing_stack.ppo": tmp_path / "__init__.py", "racing_stack.ppo.train": tmp_path / "train.py",
             "racing_stack.ppo.export": tmp_path / "export.py", "racing_env": tmp_path / "env.py"}
    (tmp_path / "train.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from racing_env import Track\n"
                                       "def f():\n    from . import export\n")
    assert imports("racing_stack.ppo.train", tmp_path / "train.py", known) == {"racing_env", "racing_stack.ppo.export"}


def test_no_module_imports_itself_back(graph):
    assert circles(graph) == []


def test_no_package_imports_one_above_it(graph):
    upward = [(a, b) for a, targets in graph.items() for b in targets
              if a.split(".")[0] != b.split(".")[0] and b.split(".")[0] not in ALLOWED[a.split(".")[0]]]
    assert upward == []


def test_the_learning_code_imports_neither_the_export_nor_the_runner(graph):
    wrong = [(a, b) for a in LEARN for b in graph[a] if b.startswith(NOT_FROM_LEARN)]
    assert wrong == []


def test_the_trainer_modules_stay_within_their_sizes():
    """No module of ``racing_stack.ppo`` over 450 lines, no class over 300."""
    for path in (ROOT / "packages/racing_stack/src/racing_stack/ppo").glob("*.py"):
        text = path.read_text()
        assert text.count("\n") <= 450, path.name
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno + 1 <= 300, f"{path.name}: {node.name}"


def test_the_ppo_page_stays_a_page_a_user_reads():
    """``docs/ppo.md`` under 400 lines: the ledger lives in ``benchmarks/results/ppo_experiments/LEDGER.md``."""
    assert (ROOT / "docs/ppo.md").read_text().count("\n") < 400
    assert (ROOT / "benchmarks/results/ppo_experiments/LEDGER.md").is_file()
