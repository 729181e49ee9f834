"""skassoc's own warnings fail every test that does not ask for them.

pyproject.toml turns each of them into an error by its message (skassoc
points a warning at its caller, so a filter by module cannot see it). These
tests find every ``warnings.warn`` in skassoc's source and check that the
filters the suite runs under catch it.
"""

import ast
import builtins
import importlib
import warnings
from pathlib import Path

import pytest

import skassoc

PACKAGE = Path(skassoc.__file__).parent


def _render(node, functions):
    """A message as ``node`` builds it, with every ``{field}`` shown as ``1``.

    ``functions`` maps the module's function names to their definitions, for
    a message built by a helper that returns it.
    """
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_render(part, functions) for part in node.values)
    if isinstance(node, ast.FormattedValue):
        return "1"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        returned = [
            statement.value
            for statement in ast.walk(functions[node.func.id])
            if isinstance(statement, ast.Return)
        ]
        return _render(returned[-1], functions)
    raise AssertionError(f"cannot render the message {ast.unparse(node)}")


def _passes_on(node):
    """Whether a ``warnings.warn`` call warns a recorded ``message`` again."""
    return isinstance(node.args[0], ast.Name) and node.args[0].id == "message"


def _is_warn(node):
    func = getattr(node, "func", None)
    return (
        isinstance(node, ast.Call)
        and isinstance(func, ast.Attribute)
        and func.attr == "warn"
        and getattr(func.value, "id", None) == "warnings"
    )


def _category(call, module_name):
    """The warning class a ``warnings.warn`` call names (UserWarning if none)."""
    names = call.args[1:2] + [k.value for k in call.keywords if k.arg == "category"]
    if not names:
        return UserWarning
    name = names[0].id
    if hasattr(builtins, name):
        return getattr(builtins, name)
    # Imported only when needed: some modules need optional packages.
    return getattr(importlib.import_module(module_name), name)


def _skassoc_warnings():
    """``(message, category)`` of every ``warnings.warn`` in skassoc, by place."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = {
            node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)
        }
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in filter(_is_warn, ast.walk(tree)):
            if path.name == "_spawn.py" and _passes_on(node):
                # A worker's warning, warned again in the caller: checked
                # where it is written.
                continue
            category = _category(node, name)
            message = _render(node.args[0], functions)
            place = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            found.append(pytest.param(message, category, id=place))
    return found


SKASSOC_WARNINGS = _skassoc_warnings()


def test_the_source_scan_finds_skassoc_warnings():
    messages = [param.values[0] for param in SKASSOC_WARNINGS]
    assert len(messages) >= 10
    assert any(m.startswith("y holds no unlabeled samples") for m in messages)


#: Warnings the suite ignores, with pyproject.toml's reason; each has tests
#: that ask for it.
IGNORED = ("fit_report_ finds this fit suspect",)


@pytest.mark.parametrize("message, category", SKASSOC_WARNINGS)
def test_every_skassoc_warning_is_an_error_in_the_test_suite(message, category):
    """A new warning needs an ``error:`` filter in pyproject.toml."""
    if message.startswith(IGNORED):
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn(message, category, stacklevel=1)
        assert caught == []
        return
    with pytest.raises(category):
        warnings.warn(message, category, stacklevel=1)
