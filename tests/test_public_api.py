"""The public API: what the documentation imports exists where it imports it from.

Applications import from ``pgcounters`` (and, for Django, from
``pgcounters.contrib.django``); every other module is internal. The code blocks
of README.md, docs/*.md and the example's README are read here, so a guide cannot
name a module path or a name the package does not export without this test failing.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pgcounters
import pgcounters.contrib.alembic as pgcounters_alembic
import pgcounters.contrib.asgi as pgcounters_asgi
import pgcounters.contrib.django as pgcounters_django
import pgcounters.contrib.sqlalchemy as pgcounters_sqlalchemy
import pgcounters.contrib.starlette as pgcounters_starlette
from pgcounters.errors import PgCountersError

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "pgcounters"
GUIDES = sorted([ROOT / "README.md", ROOT / "examples" / "blog" / "README.md",
                 *(ROOT / "docs").glob("*.md")])  # fmt: skip
PUBLIC = {
    "pgcounters": pgcounters,
    "pgcounters.contrib.django": pgcounters_django,
    "pgcounters.contrib.asgi": pgcounters_asgi,
    "pgcounters.contrib.sqlalchemy": pgcounters_sqlalchemy,
    "pgcounters.contrib.alembic": pgcounters_alembic,
    "pgcounters.contrib.starlette": pgcounters_starlette,
}


def _is_demo(module: str) -> bool:
    """The demos are programs on top of the library, imported by their own path."""
    return module.startswith(("pgcounters.demos", "pgcounters.demo"))


def _code_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def _imports(block: str) -> list[tuple[str, str]]:
    """(module, name) of every `from pgcounters... import name` and `import pgcounters...`."""
    try:
        tree = ast.parse(block)
    except SyntaxError:
        # a block with `...` placeholders or shell lines: its import statements one by one
        lines = [line.strip() for line in block.splitlines()]
        tree = ast.Module(
            [ast.parse(line).body[0] for line in lines if line.startswith(("from ", "import "))],
            [],
        )
    found: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pgcounters"):
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("pgcounters")]
    return found


def _documented_imports() -> list[tuple[str, str, str]]:
    return [
        (path.relative_to(ROOT).as_posix(), module, name)
        for path in GUIDES
        for block in _code_blocks(path)
        for module, name in _imports(block)
    ]


def test_the_guides_have_code_to_check() -> None:
    found = _documented_imports()
    assert len({guide for guide, _, _ in found}) >= 8
    assert ("README.md", "pgcounters", "Counters") in found


@pytest.mark.parametrize(("guide", "module", "name"), _documented_imports())
def test_every_documented_import_is_public_and_exists(guide: str, module: str, name: str) -> None:
    if _is_demo(module) or _is_demo(f"{module}.{name}"):
        parent = importlib.import_module(module)
        assert hasattr(parent, name) or importlib.import_module(f"{module}.{name}")
        return
    assert module in PUBLIC, f"{guide} imports from the internal module {module}"
    if name:
        public = PUBLIC[module]
        assert name in public.__all__, f"{guide}: {module} does not export {name}"
        assert getattr(public, name) is not None


@pytest.mark.parametrize("public", PUBLIC.values(), ids=PUBLIC.keys())
def test_every_exported_name_resolves_once(public: object) -> None:
    names: list[str] = getattr(public, "__all__")  # noqa: B009
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(public, name) is not None, name


def _error_classes() -> list[tuple[str, str]]:
    """(module, class) of every exception class the package defines, found in its source: a
    class whose base is named like an exception, or is one of the classes found so far."""
    classes: list[tuple[str, str, list[str]]] = []
    for path in sorted(SOURCE.rglob("*.py")):
        module = ".".join(path.relative_to(SOURCE.parent).with_suffix("").parts)
        if "migrations" in module.split(".") or _is_demo(module):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                classes.append((module, node.name, bases))
    errors: set[str] = set()
    while True:
        more = {
            name
            for _, name, bases in classes
            if any(b.endswith(("Error", "Exception")) or b in errors for b in bases)
        }
        if more <= errors:
            break
        errors |= more
    return [(module, name) for module, name, _ in classes if name in errors]


def test_the_source_scan_finds_the_errors() -> None:
    found = _error_classes()
    assert ("pgcounters.errors", "InvalidArgument") in found
    assert ("pgcounters.contrib.django.errors", "SettingsError") in found
    assert ("pgcounters.errors", "OverlappingQuotaLimits") in found  # a subclass's subclass
    assert len(found) >= 40


@pytest.mark.parametrize(("module", "name"), _error_classes())
def test_every_error_joins_the_hierarchy_and_is_exported(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, PgCountersError), f"{module}.{name} is not a PgCountersError"
    public = pgcounters_django if module.startswith("pgcounters.contrib.django") else pgcounters
    assert name in public.__all__, f"{public.__name__} does not export {name}"
    assert getattr(public, name) is cls


def test_invalid_argument_is_a_value_error_and_the_argument_errors_are_ones() -> None:
    assert issubclass(pgcounters.InvalidArgument, ValueError)
    for cls in (
        pgcounters.InvalidKey,
        pgcounters.InvalidDelta,
        pgcounters.InvalidCounterName,
        pgcounters.InvalidText,
        pgcounters.InvalidSubject,
        pgcounters.InvalidCost,
        pgcounters.InvalidQuotaArgument,
    ):
        assert issubclass(cls, pgcounters.InvalidArgument), cls
    assert not issubclass(pgcounters.InvalidCounterDefinition, pgcounters.InvalidArgument)


def test_the_django_settings_error_is_both_kinds() -> None:
    from django.core.exceptions import ImproperlyConfigured

    assert issubclass(pgcounters_django.SettingsError, ImproperlyConfigured)
    assert issubclass(pgcounters_django.SettingsError, pgcounters.ConfigurationError)


def test_the_version_comes_from_the_package_metadata() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert pgcounters.__version__ == importlib.metadata.version("pgcounters")
    assert pgcounters.__version__ == project["version"]
    source = Path(pgcounters.__file__).read_text(encoding="utf-8")
    assert not re.search(r"^__version__\s*=", source, re.M), "the version is written out"


def test_importing_pgcounters_loads_no_optional_part() -> None:
    code = (
        "import sys, pgcounters\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('redis', 'django', 'tqdm', 'matplotlib', 'sqlalchemy', 'alembic', 'pgcounters'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "pgcounters.repair" in loaded  # the check can see what is loaded
    for absent in ("redis", "django", "tqdm", "matplotlib", "sqlalchemy", "alembic",
                   "pgcounters.worker",
                   "pgcounters.redis_buffer", "pgcounters.batching", "pgcounters.embedded",
                   "pgcounters.cli", "pgcounters.demo", "pgcounters.demo_blog",
                   "pgcounters.workloads", "pgcounters.bench", "pgcounters.async_worker",
                   "pgcounters.contrib.asgi"):  # fmt: skip
        assert absent not in loaded, absent
