"""No module builds a shell command: every subprocess gets an argument list, never a string.

The source of ``src/stoker`` is parsed (not grepped, so comments and strings do not count)
and each call is checked: no ``shell=True``, none of the functions that always go through a
shell (``os.system``, ``os.popen``, ``subprocess.getoutput``, ...), no ``eval``/``exec``,
and every ``subprocess`` call's command is a list or tuple (or a name only ever bound to one).
The checker is itself tested on code that breaks each rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stoker

SHELL_FUNCTIONS = {
    ("os", "system"),
    ("os", "popen"),
    ("os", "execl"),
    ("os", "execlp"),
    ("os", "spawnl"),
    ("os", "spawnlp"),
    ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"),
    ("pty", "spawn"),
    ("asyncio", "create_subprocess_shell"),
}
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output"}


def _dotted(node: ast.expr) -> tuple[str, ...]:
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        return (*_dotted(node.value), node.attr)
    return ()


def _list_bindings(function: ast.AST, name: str) -> list[ast.expr]:
    """Every value assigned to ``name`` inside ``function``."""
    values: list[ast.expr] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                values.append(node.value)
        elif (
            isinstance(node, ast.AnnAssign | ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and node.value is not None
        ):
            values.append(node.value)
    return values


def _is_argument_list(node: ast.expr, scope: ast.AST) -> bool:
    if isinstance(node, ast.List | ast.Tuple):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # [a] + [b]
        return _is_argument_list(node.left, scope) and _is_argument_list(node.right, scope)
    if isinstance(node, ast.Call) and _dotted(node.func) in (("list",), ("tuple",)):
        return True
    if isinstance(node, ast.Name):
        bound = _list_bindings(scope, node.id)
        return bool(bound) and all(_is_argument_list(value, scope) for value in bound)
    return False


def problems(source: str, filename: str) -> list[str]:
    """What in ``source`` builds or runs a shell command."""
    tree = ast.parse(source, filename)
    found: list[str] = []
    scopes: list[ast.AST] = [tree]
    scopes += [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    innermost: dict[int, ast.AST] = {}
    for scope in scopes:  # later (inner) scopes overwrite earlier (outer) ones
        for node in ast.walk(scope):
            innermost[id(node)] = scope
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        where = f"{filename}:{node.lineno}"
        name = _dotted(node.func)
        for keyword in node.keywords:
            if keyword.arg == "shell" and not (
                isinstance(keyword.value, ast.Constant) and keyword.value.value is False
            ):
                found.append(f"{where}: shell={ast.unparse(keyword.value)}")
        if name[-2:] in SHELL_FUNCTIONS or name[-1:] in (("system",), ("popen",)):
            found.append(f"{where}: {'.'.join(name)} runs a shell")
        if name in (("eval",), ("exec",)):
            found.append(f"{where}: {name[0]}() of a string")
        if len(name) >= 2 and name[-2] == "subprocess" and name[-1] in SUBPROCESS_CALLS:
            command = node.args[0] if node.args else None
            command = next((k.value for k in node.keywords if k.arg == "args"), command)
            if command is None or not _is_argument_list(command, innermost[id(node)]):
                shown = ast.unparse(command) if command is not None else "nothing"
                found.append(f"{where}: subprocess.{name[-1]}({shown}) is not an argument list")
    return found


def test_no_module_builds_or_runs_a_shell_command() -> None:
    root = Path(stoker.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 40
    found = [p for path in files for p in problems(path.read_text(), str(path.relative_to(root)))]
    assert found == []


BAD = {
    "shell": "import subprocess\nsubprocess.run(['ls'], shell=True)\n",
    "shell variable": "import subprocess\nflag = True\nsubprocess.run(['ls'], shell=flag)\n",
    "string command": "import subprocess\nsubprocess.run('ls ' + user)\n",
    "f-string command": "import subprocess\nsubprocess.check_output(f'tar xf {name}')\n",
    "name bound to a string": (
        "import subprocess\ndef f(x):\n    cmd = 'rm ' + x\n    subprocess.Popen(cmd)\n"
    ),
    "os.system": "import os\nos.system('ls')\n",
    "os.popen": "import os\nos.popen('ls').read()\n",
    "getoutput": "import subprocess\nsubprocess.getoutput('ls')\n",
    "shell exec": "import asyncio\nasyncio.create_subprocess_shell('ls')\n",
    "eval": "eval(text)\n",
}
GOOD = {
    "list": "import subprocess\nsubprocess.run(['ls', path], check=True)\n",
    "name bound to a list": (
        "import subprocess\ndef f(x):\n    cmd = ['ls', x]\n    subprocess.run(cmd)\n"
    ),
    "list plus list": "import subprocess\nsubprocess.run(['a'] + [b])\n",
    "shell=False": "import subprocess\nsubprocess.run(['ls'], shell=False)\n",
}


@pytest.mark.parametrize("case", BAD)
def test_the_checker_catches(case: str) -> None:
    assert problems(BAD[case], "bad.py")


@pytest.mark.parametrize("case", GOOD)
def test_the_checker_passes(case: str) -> None:
    assert problems(GOOD[case], "good.py") == []
