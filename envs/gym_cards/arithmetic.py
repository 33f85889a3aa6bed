"""Exact arithmetic on formula tokens, without eval(): a small recursive-descent parser.

    expression := term (("+" | "-") term)*
    term       := factor (("*" | "/") factor)*
    factor     := number | "(" expression ")"

Values are Fractions, so 8 / 3 * 3 is exactly 8. Also a brute-force solver that says
whether four numbers make a target (Points24's `solvable_only` option).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from fractions import Fraction


class FormulaError(ValueError):
    pass


def evaluate(tokens: Sequence[str]) -> Fraction:
    """The value of `tokens`; FormulaError if they are not a whole, valid expression."""
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        token = peek()
        if token is None:
            raise FormulaError("the formula ends too early")
        position += 1
        return token

    def factor() -> Fraction:
        token = take()
        if token == "(":
            value = expression()
            if take() != ")":
                raise FormulaError("unbalanced parentheses")
            return value
        if token.isdigit():
            return Fraction(int(token))
        raise FormulaError(f"unexpected {token!r}")

    def term() -> Fraction:
        value = factor()
        while peek() in ("*", "/"):
            op, right = take(), factor()
            if op == "/" and right == 0:
                raise FormulaError("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def expression() -> Fraction:
        value = term()
        while peek() in ("+", "-"):
            op, right = take(), term()
            value = value + right if op == "+" else value - right
        return value

    result = expression()
    if position != len(tokens):
        raise FormulaError(f"unexpected {tokens[position]!r}")
    return result


@functools.lru_cache(maxsize=4096)
def solvable(numbers: tuple[int, ...], target: int = 24) -> bool:
    """Whether +, -, *, / and parentheses combine all of `numbers` (each once) into `target`."""
    dead_ends: set[tuple[Fraction, ...]] = set()  # multisets already known not to reach the target

    def reach(values: tuple[Fraction, ...]) -> bool:
        if len(values) == 1:
            return values[0] == target
        if tuple(sorted(values)) in dead_ends:
            return False
        for i, j in itertools.permutations(range(len(values)), 2):
            rest = tuple(v for k, v in enumerate(values) if k not in (i, j))
            a, b = values[i], values[j]
            results = [a + b, a - b, a * b] + ([a / b] if b != 0 else [])
            if any(reach(rest + (r,)) for r in results):
                return True
        dead_ends.add(tuple(sorted(values)))
        return False

    return reach(tuple(Fraction(n) for n in numbers))
