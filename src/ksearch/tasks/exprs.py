"""Safe arithmetic over axis values: the expressions of a task's constraints and cost model, and of a launch plan.

An expression is Python restricted to numbers, axis names, arithmetic, comparisons, ``and``/``or``/``not``,
``x if c else y`` and the calls ``min``, ``max``, ``abs``, ``ceil``, ``floor``, ``log2``: no attribute access, no
imports, no other names; integer powers are bounded (`_MAX_POW_BITS`).
"""

from __future__ import annotations

import ast
import functools
import math
from typing import Any

from ksearch.errors import TaskError

_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Name, ast.Load, ast.Constant,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.And, ast.Or, ast.Not, ast.IfExp,
    ast.Call,
)
_ALLOWED_CALLS = {"min": min, "max": max, "abs": abs, "ceil": math.ceil, "floor": math.floor, "log2": math.log2}


#: largest integer power an expression may compute, in bits (``9**9**9`` would take minutes and gigabytes)
_MAX_POW_BITS = 4096


def _pow(base, exponent):
    """``base ** exponent``, refusing integer powers of more than `_MAX_POW_BITS` bits."""
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0 \
            and exponent * math.log2(abs(base)) > _MAX_POW_BITS:
        raise OverflowError(f"{base} ** {exponent} has more than {_MAX_POW_BITS} bits")
    return base ** exponent


class _BoundedPow(ast.NodeTransformer):
    """Rewrites ``a ** b`` as ``_pow(a, b)``."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Pow):
            call = ast.Call(func=ast.Name("_pow", ast.Load()), args=[node.left, node.right], keywords=[])
            return ast.copy_location(call, node)
        return node


@functools.lru_cache(maxsize=4096)
def compile_expr(expr: str):
    """The expression compiled for `eval_expr` (cached: a constraint or cost expression is evaluated for every
    workload and launch). Raises ValueError naming what is not allowed in it."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"expression {expr!r} is not valid Python: {e.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"expression {expr!r} uses {type(node).__name__}, which is not allowed")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _ALLOWED_CALLS):
            raise ValueError(f"expression {expr!r} calls something other than {sorted(_ALLOWED_CALLS)}")
    tree = ast.fix_missing_locations(_BoundedPow().visit(tree))
    return compile(tree, "<expr>", "eval")


def eval_expr(expr: str, values: dict[str, Any]) -> Any:
    """Evaluate an arithmetic/comparison expression over axis values (no attribute access, no imports).

    Raises:
        TaskError: the expression is malformed, names an unknown axis, or fails on these values (division by
            zero, an integer power beyond `_MAX_POW_BITS` bits, a bad argument to a function).
    """
    try:
        code = compile_expr(expr)
    except ValueError as e:
        raise TaskError(str(e)) from None
    try:
        return eval(code, {"__builtins__": {}}, {**_ALLOWED_CALLS, **values, "_pow": _pow})  # noqa: S307 - AST-checked
    except NameError as e:
        raise TaskError(f"expression {expr!r}: {e} (axes: {sorted(values)})") from None
    except (ArithmeticError, TypeError, ValueError) as e:
        raise TaskError(f"expression {expr!r} fails for {values}: {type(e).__name__}: {e}") from None
