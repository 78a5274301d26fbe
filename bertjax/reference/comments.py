"""Descriptions read from source comments: what a config key or a dataclass field means is the
comment its author wrote beside it (trailing) or right above it (a block with no blank line
between), so the reference cannot drift from the code."""

from __future__ import annotations

import ast
import functools
import inspect
import io
import textwrap
import tokenize

# Tool directives, not descriptions.
_DIRECTIVES = ("noqa", "fmt:", "type:", "pragma", "pylint")


@functools.cache
def _parsed(source: str) -> tuple[ast.Module, dict, dict]:
    """(tree, trailing comments by line, whole-line comments by line) of ``source``."""
    trailing, whole_line = {}, {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        text = token.string.lstrip("#").strip()
        if text.startswith(_DIRECTIVES):
            continue
        line = token.start[0]
        code_before = token.line[: token.start[1]].strip()
        (trailing if code_before else whole_line)[line] = text
    return ast.parse(source), trailing, whole_line


def describe(statement: ast.stmt, trailing: dict, whole_line: dict) -> str:
    """The comment block right above ``statement`` and its trailing comments, joined."""
    above, line = [], statement.lineno - 1
    while line in whole_line:
        above.insert(0, whole_line[line])
        line -= 1
    own = [trailing[n] for n in range(statement.lineno, statement.end_lineno + 1) if n in trailing]
    parts = [" ".join(above).strip(), " ".join(own).strip()]
    return " — ".join(p for p in parts if p)


def _key_path(target: ast.expr) -> str | None:
    """``c.data.corpus`` -> "data.corpus" (the root name dropped); None for anything else."""
    names = []
    while isinstance(target, ast.Attribute):
        names.insert(0, target.attr)
        target = target.value
    return ".".join(names) if names and isinstance(target, ast.Name) else None


def _targets(statement: ast.stmt) -> list[ast.expr]:
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    else:
        return []
    flat = []
    for target in targets:
        flat.extend(target.elts if isinstance(target, ast.Tuple) else [target])
    return flat


def _source(obj) -> str:
    return textwrap.dedent(inspect.getsource(obj))


def assigned_keys(function) -> dict[str, str]:
    """{key path: description} of every ``NAME.a.b = value`` in ``function`` (the config it
    builds, e.g. ``c.optim.name = "adamw"  # ...`` -> {"optim.name": "..."}); a key assigned
    twice keeps the first description that is not empty."""
    tree, trailing, whole_line = _parsed(_source(function))
    found: dict[str, str] = {}
    for statement in ast.walk(tree):
        for target in _targets(statement):
            path = _key_path(target)
            if path is not None and not found.get(path):
                found[path] = describe(statement, trailing, whole_line)
    return found


def field_comments(cls) -> dict[str, str]:
    """{field name: description} of a class's annotated fields (``name: type = default  # ...``),
    its bases' first (a subclass's own comment wins where both have one)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if "__annotations__" not in vars(klass) or klass.__module__ in ("builtins", "abc"):
            continue
        tree, trailing, whole_line = _parsed(_source(klass))
        body = tree.body[0].body
        for statement in body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                text = describe(statement, trailing, whole_line)
                if text or statement.target.id not in found:
                    found[statement.target.id] = text
    return found
