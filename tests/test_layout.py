"""The source stays in small modules and short functions (STYLE: one concept per module,
under 400 lines; no function over 80)."""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

SRC = Path(stoker.__file__).resolve().parent
MAX_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, str]:
    return {
        str(path.relative_to(SRC)): path.read_text(encoding="utf-8") for path in SRC.rglob("*.py")
    }


def test_no_module_is_over_400_lines() -> None:
    sizes = {name: len(text.splitlines()) for name, text in _modules().items()}
    assert len(sizes) > 50  # the whole package was read
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_no_function_is_over_80_lines() -> None:
    # From its def to its last line, docstring included: a function longer than a screen
    # is steps that want names.
    long = {}
    for name, text in _modules().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{name}:{node.name}"] = lines
    assert long == {}


def _classes_by_module(suffixes: tuple[str, ...]) -> dict[str, str]:
    """Each class of the package whose name ends with one of ``suffixes``, by the module
    that defines it."""
    found = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith(suffixes):
                found[node.name] = str(path.relative_to(SRC))
    return found


def test_no_module_tests_another_modules_source_batcher_or_loader_class() -> None:
    # A source says what its units are (issue 33 item 1): callers ask it, never its class.
    classes = _classes_by_module(("Source", "Batcher", "Assembler", "Loader"))
    assert {"DatasetSource", "TokenSource", "FolderSource", "TokenBatcher"} <= set(classes)
    tested = []
    for path in SRC.rglob("*.py"):
        module = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"):
                continue
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            tested += [
                f"{module}:{node.lineno} {name}"
                for name in sorted(names)
                if name in classes and classes[name] != module
            ]
    assert tested == []


def test_token_loader_is_a_constructor_over_the_loader() -> None:
    from stoker.pipeline.token_loader import TokenLoader

    private = [name for name in vars(TokenLoader) if name.startswith("_") and name[1] != "_"]
    assert private == []
