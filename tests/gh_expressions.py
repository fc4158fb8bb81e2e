"""GitHub Actions' expression language, the part perfsuite's workflows use in ``if:``: literals,
``==``, ``!=``, ``!``, ``&&``, ``||``, parentheses, property paths with ``.*.`` filters, and
``contains``, ``startsWith`` and ``fromJSON``, with GitHub's semantics (``&&`` and ``||`` yield an
operand; strings compare without case). So a job's ``if:`` can be evaluated against real event
payloads in the tests (docs.github.com: "Evaluate expressions in workflows and actions")."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||[!(),])|(?P<path>[A-Za-z_][\w-]*(?:\.(?:\*|[\w-]+))*))"
)


def tokens(text: str) -> list[tuple[str, str]]:
    found, at = [], 0
    text = text.strip()
    while at < len(text):
        match = TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise ValueError(f"cannot read the expression at {text[at : at + 20]!r}")
        kind = match.lastgroup or ""
        found.append((kind, match.group(kind)))
        at = match.end()
    return found


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and value == value  # NaN is falsy


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    return bool(a == b)


def _lookup(path: str, context: Mapping[str, Any]) -> Any:
    values: list[Any] = [context]
    filtered = False
    for part in path.split("."):
        if part == "*":
            values = [item for value in values for item in (value if isinstance(value, list) else [])]
            filtered = True
            continue
        values = [value.get(part) if isinstance(value, Mapping) else None for value in values]
    return values if filtered else values[0]


FUNCTIONS = {
    "contains": lambda hay, needle: (
        any(_equal(item, needle) for item in hay)
        if isinstance(hay, list)
        else str(needle).casefold() in str(hay if hay is not None else "").casefold()
    ),
    "startsWith": lambda text, prefix: str(text or "").casefold().startswith(str(prefix or "").casefold()),
    "fromJSON": lambda text: json.loads(text),
}


class _Parser:
    def __init__(self, text: str, context: Mapping[str, Any]) -> None:
        self.items, self.at, self.context = tokens(text), 0, context

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        item = self.peek()
        if item is None or (value is not None and item[1] != value):
            raise ValueError(f"expected {value!r}, found {item!r}")
        self.at += 1
        return item

    def expression(self) -> Any:
        value = self.conjunction()
        while self.peek() == ("op", "||"):
            self.take()
            right = self.conjunction()
            value = value if truthy(value) else right
        return value

    def conjunction(self) -> Any:
        value = self.comparison()
        while self.peek() == ("op", "&&"):
            self.take()
            right = self.comparison()
            value = right if truthy(value) else value
        return value

    def comparison(self) -> Any:
        value = self.unary()
        while self.peek() in (("op", "=="), ("op", "!=")):
            _, op = self.take()
            right = self.unary()
            value = _equal(value, right) if op == "==" else not _equal(value, right)
        return value

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return not truthy(self.unary())
        return self.primary()

    def primary(self) -> Any:
        kind, text = self.take()
        if text == "(":
            value = self.expression()
            self.take(")")
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text)
        if text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        if self.peek() == ("op", "("):
            self.take()
            args = [] if self.peek() == ("op", ")") else [self.expression()]
            while self.peek() == ("op", ","):
                self.take()
                args.append(self.expression())
            self.take(")")
            return FUNCTIONS[text](*args)
        return _lookup(text, self.context)


def evaluate(text: str, context: Mapping[str, Any]) -> Any:
    """The value of ``text`` (without ``${{ }}``) in ``context`` (``github``, ``env``, ...)."""
    parser = _Parser(text, context)
    value = parser.expression()
    if parser.peek() is not None:
        raise ValueError(f"unread text after the expression: {parser.items[parser.at :]}")
    return value
