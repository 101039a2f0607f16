"""Every test asserts something: a test that cannot fail is worse than none.

A test asserts when its body holds an ``assert``, expects an error or a warning (``pytest.raises``,
``pytest.warns``), fails on purpose (``pytest.fail``), calls a library's ``assert_*`` (``torch.testing``,
``numpy.testing``), or calls a helper of its own file or of ``tests/support.py`` that does one of these.
A test that only runs code ("it did not crash") must say what it expects. A planted test of each kind
shows the rule catches what it should and passes what it should.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
EXPECTING = {"raises", "warns", "fail", "deprecated_call"}

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _asserts(function: Function, helpers: dict[str, Function], seen: frozenset[str] = frozenset()) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name in EXPECTING or name.startswith("assert"):
                return True
            if name in helpers and name not in seen and _asserts(helpers[name], helpers, seen | {name}):
                return True
    return False


def _functions(tree: ast.AST) -> dict[str, Function]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, Function)}


def _tests(tree: ast.Module) -> list[Function]:
    found: list[Function] = []
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) and node.name.startswith("Test") else [node]
        found.extend(m for m in members if isinstance(m, Function) and m.name.startswith("test"))
    return found


def silent_tests(source: str, shared: dict[str, Function]) -> list[str]:
    """The tests of one file's ``source`` that assert nothing."""
    tree = ast.parse(source)
    helpers = {**shared, **_functions(tree)}
    return [test.name for test in _tests(tree) if not _asserts(test, helpers)]


def _shared_helpers() -> dict[str, Function]:
    return _functions(ast.parse((TESTS / "support.py").read_text(encoding="utf-8")))


def test_every_test_of_the_suite_asserts_something() -> None:
    shared = _shared_helpers()
    silent = {path.name: names for path in sorted(TESTS.glob("test_*.py"))
              if (names := silent_tests(path.read_text(encoding="utf-8"), shared))}
    assert not silent, f"tests that assert nothing (say what each expects): {silent}"
    assert len(list(TESTS.glob("test_*.py"))) > 50  # the suite was read, not an empty folder


PLANTED = '''
import pytest
import torch

def _runs(x):
    return x + 1

def _checks(x):
    assert x > 0

def _checks_through_another(x):
    _checks(x)

def test_runs_only():
    _runs(1)

def test_asserts():
    assert _runs(1) == 2

def test_expects_an_error():
    with pytest.raises(ValueError):
        int("x")

def test_library_assert():
    torch.testing.assert_close(torch.ones(1), torch.ones(1))

def test_through_a_helper():
    _checks_through_another(2)

def test_fails_on_purpose():
    try:
        _runs(1)
    except TypeError:
        pytest.fail("no")

class TestGroup:
    def test_silent_member(self):
        _runs(2)

def helper_not_a_test():
    _runs(3)
'''


def test_the_rule_catches_planted_silent_tests_and_passes_the_others() -> None:
    assert silent_tests(PLANTED, {}) == ["test_runs_only", "test_silent_member"]


def test_a_helper_of_tests_support_counts_and_a_recursive_helper_ends() -> None:
    planted = "from support import check_ci_page\n\ndef test_page():\n    check_ci_page('x', None, None)\n"
    assert "check_ci_page" in _shared_helpers()
    assert silent_tests(planted, _shared_helpers()) == []
    recursive = "def _again(n):\n    return _again(n - 1)\n\ndef test_loops():\n    _again(3)\n"
    assert silent_tests(recursive, {}) == ["test_loops"]
