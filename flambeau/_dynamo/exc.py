"""Errors of graph capture: `Unsupported` (a graph break), `SkipFrame`, and the user-facing ones:
`BackendCompilerFailed` (the backend raised on a captured graph) and `InternalTorchDynamoError`
(capture itself failed), raised unless `config.suppress_errors` (PyTorch's names and default); `UserError`
(a mistake in the program or the export request, e.g. a violated dynamic-shape constraint)."""
from __future__ import annotations

from enum import Enum, auto


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


class TorchDynamoException(RuntimeError):
    """Base of the errors compiled code raises instead of running eagerly."""


class BackendCompilerFailed(TorchDynamoException):
    """The backend raised while compiling a captured graph: names the backend, the frame, the error
    (an inductor error names the node it was lowering) and shows the graph."""

    def __init__(self, backend_name: str, inner: BaseException, where: str, graph_code: str):
        self.backend_name = backend_name
        self.inner_exception = inner
        self.minifier_path = getattr(inner, "minifier_path", None)    # where flambeau._dynamo.repro wrote its repro
        super().__init__(f"backend={backend_name!r} raised:\n{type(inner).__name__}: {inner}\n\n"
                         f"while compiling the graph of {where}:\n{graph_code}\n"
                         "Set flambeau._dynamo.config.suppress_errors = True to run such frames eagerly instead.")


class InternalTorchDynamoError(TorchDynamoException):
    """Capture failed with an unexpected error (a bug of flambeau's capture, not of the user's code)."""


class UserErrorType(Enum):
    """What a `UserError` is about (PyTorch's names)."""
    DYNAMIC_CONTROL_FLOW = auto()
    ANTI_PATTERN = auto()
    STANDARD_LIBRARY = auto()
    CONSTRAINT_VIOLATION = auto()
    DYNAMIC_DIM = auto()
    INVALID_INPUT = auto()
    INVALID_OUTPUT = auto()
    UNSUPPORTED_ALIASED_MUTATED_DYNAMIC_INPUTS = auto()


class UserError(TorchDynamoException):
    """A mistake in the user's program or export request (a violated dynamic-shape constraint, data-
    dependent control flow, an invalid input): the message says what and where."""

    def __init__(self, error_type: UserErrorType, msg: str, case_name: str | None = None):
        super().__init__(msg)
        self.error_type = error_type
        self.message = msg
