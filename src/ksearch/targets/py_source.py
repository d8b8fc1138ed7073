"""Python kernel modules (the triton and null targets): checked in the controller without importing them.

`check_module` compiles the one source file with Python's ``compile()`` (a syntax error is a message naming the
file, line and column) and checks that the entry point is defined at module level with the arity the judge calls
it with (`entry_arity_problem`); nothing in the module runs.
"""

from __future__ import annotations

import ast


def check_module(source: str, name: str, entry: str, abi: list[str]) -> str | None:
    """Why the module ``source`` (file ``name``) cannot be a kernel called as ``entry(*abi)``, or None: a syntax
    error (file, line, column, the line and a caret), NUL bytes or nesting too deep, or an entry point that is
    missing or has the wrong arity."""
    try:
        compile(source, name, "exec", dont_inherit=True)
        tree = ast.parse(source, name)
    except SyntaxError as e:
        return syntax_message(e, name)
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes; expressions nested too deep
        return f"{name}: not compilable Python: {type(e).__name__}: {e}"
    problem = entry_arity_problem(tree, entry, len(abi), abi)
    return f"{name}: {problem}" if problem else None


def entry_arity_problem(tree: ast.Module, entry: str, n_args: int, names: list[str]) -> str | None:
    """Why the module's ``entry`` function cannot be called with ``n_args`` positional arguments, or None."""
    fn = next((node for node in reversed(tree.body) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and node.name == entry), None)
    if fn is None:
        bound = any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == entry for t in node.targets)
                    for node in tree.body)
        if bound:
            return None  # e.g. run = make_run(): checked when the worker imports it
        return (f"the module defines no function {entry!r} at module level (the entry point, called as "
                f"{entry}({', '.join(names)}))")
    if isinstance(fn, ast.AsyncFunctionDef):
        return f"{entry!r} is a coroutine (async def); it must be a plain function that launches the kernels"
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args)
    required = positional - len(a.defaults)
    required_kw = [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    if required_kw:
        return f"{entry!r} has required keyword-only parameters {required_kw}; the judge passes positional ones only"
    if required > n_args or (positional < n_args and a.vararg is None):
        takes = f"{required}" if required == positional else f"{required} to {positional}"
        return (f"{entry!r} takes {takes} positional parameters; the judge calls it with {n_args}: "
                f"{entry}({', '.join(names)})")
    return None


def syntax_message(e: SyntaxError, name: str) -> str:
    where = name + (f":{e.lineno}" if e.lineno else "") + (f":{e.offset}" if e.lineno and e.offset else "")
    text = (e.text or "").rstrip("\n")
    caret = f"\n    {text}\n    {' ' * max(0, (e.offset or 1) - 1)}^" if text else ""
    return f"{where}: {type(e).__name__}: {e.msg}{caret}"
