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
from collections.abc import Iterator, Sequence
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


@functools.lru_cache(maxsize=16384)
def formula_for(values: tuple[int, ...], target: int, operators: str) -> tuple[str, ...] | None:
    """Tokens of a formula that uses each of `values` once, with `operators` and
    parentheses, and equals `target`; None if there is none. Every composite operand is in
    parentheses, so a formula of four numbers has at most 11 tokens.

    Deterministic, and it prefers the numbers in the order given (the cards left to right):
    only if no formula keeps that order does it try other orders, in permutation order. For
    an agent that imitates it from pixels, each number is then mostly "the next card", a
    reading task, rather than a choice among the cards. Within one order it prefers the
    running total, ((a op b) op c) op d, and the operators in the order given."""
    tried: set[tuple[int, ...]] = set()
    for order in itertools.permutations(values):
        if order in tried:  # equal cards: the same order again
            continue
        tried.add(order)
        for value, tokens in _formulas_in_order(tuple(Fraction(v) for v in order), operators):
            if value == target:
                return tokens
    return None


def _formulas_in_order(numbers: tuple[Fraction, ...], operators: str) -> Iterator[tuple[Fraction, tuple[str, ...]]]:
    """(value, tokens) of every formula of `numbers` in this order: each binary tree over
    them, the last split first (so the left-deep tree comes first), with every operator."""
    if len(numbers) == 1:
        yield numbers[0], (str(numbers[0]),)
        return
    for split in range(len(numbers) - 1, 0, -1):
        lefts = list(_formulas_in_order(numbers[:split], operators))
        rights = list(_formulas_in_order(numbers[split:], operators))
        for a, left in lefts:
            for b, right in rights:
                for op in operators:
                    if op == "/" and b == 0:
                        continue
                    value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
                    yield value, _operand(left) + (op,) + _operand(right)


def _operand(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """A sub-formula as an operand: in parentheses unless it is a single number."""
    return tokens if len(tokens) == 1 else ("(", *tokens, ")")


@functools.lru_cache(maxsize=4096)
def solvable(numbers: tuple[int, ...], target: int = 24) -> bool:
    """Whether +, -, *, / and parentheses combine all of `numbers` (each once) into `target`."""
    return formula_for(numbers, target, "+-*/") is not None
