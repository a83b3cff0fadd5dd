"""Errors of graph capture: `Unsupported` (a graph break), `SkipFrame`, and the user-facing ones."""
from __future__ import annotations


class Unsupported(RuntimeError):
    """Something the symbolic evaluator cannot capture; the graph breaks here (or the frame runs eagerly)."""

    def __init__(self, msg: str, *, user_stack: list | None = None):
        super().__init__(msg)
        self.msg = msg
        self.user_stack = user_stack or []

    def add_user_frame(self, code, lineno: int | None) -> None:
        self.user_stack.append((code.co_filename, lineno, code.co_name))

    def location(self) -> str:
        if not self.user_stack:
            return "<unknown>"
        f, line, name = self.user_stack[0]
        return f"{f}:{line} in {name}"

    def __str__(self) -> str:
        return self.msg


class SkipFrame(Exception):
    """This frame is run eagerly (a generator, a graph break in a loop, an unsupported construct);
    `permanent=False`: only this call (e.g. a lazy module not initialized yet)."""

    def __init__(self, msg: str = "", permanent: bool = True):
        super().__init__(msg)
        self.permanent = permanent


class RestartAnalysis(Exception):
    """Start the translation of the frame again (e.g. with a graph break at a chosen instruction)."""
