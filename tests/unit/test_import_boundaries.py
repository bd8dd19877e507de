"""The house rules of docs/architecture.md, read from the source: which of our packages each package may
import (hami_api none; hami_kube none; hami_node and hami_control hami_api and hami_kube, never each
other; hami_sim all of them; nothing imports hami_sim)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("hami_api", "hami_kube", "hami_node", "hami_control", "hami_sim")
ALLOWED = {
    "hami_api": set(),
    "hami_kube": set(),
    "hami_node": {"hami_api", "hami_kube"},
    "hami_control": {"hami_api", "hami_kube"},
    "hami_sim": {"hami_api", "hami_kube", "hami_node", "hami_control"},
}


def imported_packages(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name.split(".")[0] for name in names} & set(OURS)


@pytest.mark.parametrize("package", OURS)
def test_a_package_imports_only_the_packages_below_it(package: str) -> None:
    crossing = [
        f"{path.relative_to(ROOT)} imports {other}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for other in sorted(imported_packages(path) - ALLOWED[package] - {package})
    ]
    assert not crossing, crossing
