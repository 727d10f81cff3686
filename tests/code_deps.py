"""The project files a module imports, found by reading the source (imports inside functions
included): what a DVC stage running that code must depend on."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Installed as subpackages of calo, kept in top-level folders (pyproject.toml's package-dir).
FOLDERS = {"calo.tasks": "tasks", "calo.models": "models", "calo.flows": "flows", "calo": "calo"}


def module_file(name: str) -> Path | None:
    for package, folder in FOLDERS.items():
        if name == package:
            return REPO / folder / "__init__.py"
        if name.startswith(package + "."):
            rest = name[len(package) + 1:].split(".")
            path = REPO / folder / Path(*rest)
            for candidate in (path.with_suffix(".py"), path / "__init__.py"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def imported(path: Path, top_level_only: bool = False) -> set[str]:
    """Project module names that one file imports."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if n == "calo" or n.startswith("calo.")}


def closure(entry: Path, top_level_only: bool = False) -> set[Path]:
    """Files the entry file needs: its imports, theirs, and every package __init__ on the way."""
    seen: set[Path] = set()
    todo = [(entry, top_level_only)]
    while todo:
        path, top = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported(path, top):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # calo.tasks.x needs calo/__init__, tasks/__init__
                found = module_file(".".join(parts[:i]))
                if found is not None and found not in seen:
                    todo.append((found, False))
    return seen


def script_code(script: Path) -> set[str]:
    """What a benchmark script runs: the project files it imports and the scripts beside it
    that it imports (benchmarks put their own folder on sys.path), transitively."""
    scripts, todo = set(), [script]
    while todo:
        path = todo.pop()
        if path in scripts:
            continue
        scripts.add(path)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            todo += [path.parent / f"{n}.py" for n in names
                     if (path.parent / f"{n}.py").is_file()]
    files = set(scripts).union(*(closure(s) for s in scripts))
    return {p.relative_to(REPO).as_posix() for p in files}


def stage_code(task_module: str) -> set[str]:
    """What `calo <stage>` runs: the CLI's module-level imports and the stage's task module."""
    files = closure(REPO / "calo" / "cli.py", top_level_only=True)
    files |= closure(REPO / "tasks" / f"{task_module}.py")
    files |= {REPO / "tasks" / "__init__.py"}  # the CLI imports calo.tasks.<stage>
    return {p.relative_to(REPO).as_posix() for p in files}


if __name__ == "__main__":
    for stage in ("harvest", "extract", "pretrain", "finetune", "calibrate", "tune"):
        print(stage, sorted(stage_code(stage)))
