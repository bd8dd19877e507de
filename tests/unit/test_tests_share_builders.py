"""The tests' own layout (CONTRIBUTING.md, "Test builders"): pods, nodes, GPUs, AdmissionReviews and
waits come from tests/builders.py and tests/waiting.py, never from a copy in a test file; no test
imports another test module; a helper module used from more than one folder lives at tests/ level."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SHARED = {TESTS / "builders.py", TESTS / "waiting.py"}

BUILDER_NAMES = frozenset(
    {
        "admission_review",
        "binding",
        "container",
        "ctr",
        "gpu",
        "gpu_info",
        "gpu_node",
        "gpu_pod",
        "make_node",
        "make_pod",
        "node",
        "node_json",
        "pod",
        "pod_json",
        "review_body",
        "wait_for",
        "wait_until",
    }
)
"""Names that, defined at the top of a test file, are a local copy of a shared builder or wait."""


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p not in SHARED)


def imports_of(path: Path) -> list[str]:
    """The `tests.` modules a file imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(a.name for a in node.names if a.name.startswith("tests."))
    return found


def test_no_test_file_defines_its_own_builder_or_wait() -> None:
    copies = []
    for path in python_files():
        relative = path.relative_to(TESTS).as_posix()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            # Decorated functions are fixtures and hypothesis strategies, not builders.
            if isinstance(node, ast.FunctionDef) and node.name in BUILDER_NAMES and not node.decorator_list:
                copies.append(f"{relative}:{node.lineno} def {node.name}")
    assert not copies, "use tests/builders.py or tests/waiting.py instead of: " + ", ".join(copies)


def test_no_test_imports_another_test_module() -> None:
    found = [
        f"{path.relative_to(TESTS).as_posix()} imports {module}"
        for path in python_files()
        for module in imports_of(path)
        if module.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert not found, found


def test_a_helper_shared_across_folders_lives_at_tests_level() -> None:
    found = []
    for path in python_files():
        folder = path.parent.relative_to(TESTS).as_posix()
        for module in imports_of(path):
            parts = module.split(".")
            if len(parts) > 2 and parts[1] != folder:
                found.append(f"{path.relative_to(TESTS).as_posix()} imports {module}")
    assert not found, "move these helpers to tests/: " + ", ".join(found)
