"""Every `from specrl... import name` in the code and the tests names something that
exists, function-level imports included (they run only on the path that needs them:
a zoo build, a benchmark, a GPU script). Neither ruff nor import-linter checks that, and
a module moved between packages leaves exactly such imports behind."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("services/specrl", "tests", "scripts", "tools")
OURS = ("specrl", "deploygen", "helpers")


def _imports() -> list[tuple[str, int, str, str | None]]:
    """(file, line, module, name or None) for every absolute import of our modules."""
    out = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "v1" in path.relative_to(ROOT).parts:
                continue  # generated
            where = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    if node.module.split(".")[0] in OURS:
                        out += [(where, node.lineno, node.module, a.name) for a in node.names]
                elif isinstance(node, ast.Import):
                    out += [
                        (where, node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] in OURS
                    ]
    return out


def test_every_import_of_our_modules_resolves():
    imports = _imports()
    assert len(imports) > 500  # the walk saw the code, not an empty tree
    missing = []
    for where, line, module, name in imports:
        try:
            m = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{where}:{line}: {module}: {e}")
            continue
        if name is None or name == "*" or hasattr(m, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            missing.append(f"{where}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)
