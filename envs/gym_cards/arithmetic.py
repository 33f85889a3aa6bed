"""Exact arithmetic on formula tokens, without eval(): a small recursive-descent parser.

    expression := term (("+" | "-") term)*
    term       := factor (("*" | "/") factor)*
    factor     := number | "(" expression ")"

Values are Fractions, so 8 / 3 * 3 is exactly 8. Also the search that finds a formula of
given numbers for a target (the solvers' answers, and Points24's `solvable_only` option).
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


@functools.lru_cache(maxsize=8192)
def formula_for(values: tuple[int, ...], target: int, operators: str) -> tuple[str, ...] | None:
    """Tokens of a formula that uses each of `values` once, with `operators` and
    parentheses, and equals `target`; None if there is none. Deterministic: the first found
    in a fixed search order. Every composite operand is in parentheses, so a formula of four
    numbers has at most 11 tokens."""
    numbers = [Fraction(v) for v in values]
    # Whether the target can be reached depends only on the values left, not on how they
    # were written: each multiset that failed once is not searched again.
    dead_ends: set[tuple[Fraction, ...]] = set()

    def search(items: list[tuple[Fraction, tuple[str, ...]]]) -> tuple[str, ...] | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target else None
        left = tuple(sorted(value for value, _ in items))
        if left in dead_ends:
            return None
        for i, j in itertools.permutations(range(len(items)), 2):
            (a, ta), (b, tb) = items[i], items[j]
            rest = [item for k, item in enumerate(items) if k not in (i, j)]
            for op in operators:
                if op == "/" and b == 0:
                    continue
                value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
                tokens = _operand(ta) + (op,) + _operand(tb)
                found = search(rest + [(value, tokens)])
                if found is not None:
                    return found
        dead_ends.add(left)
        return None

    return search([(n, (str(v),)) for n, v in zip(numbers, values)])


def _operand(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """A sub-formula as an operand: in parentheses unless it is a single number."""
    return tokens if len(tokens) == 1 else ("(", *tokens, ")")


@functools.lru_cache(maxsize=4096)
def solvable(numbers: tuple[int, ...], target: int = 24) -> bool:
    """Whether +, -, *, / and parentheses combine all of `numbers` (each once) into `target`."""
    return formula_for(numbers, target, "+-*/") is not None
