"""Errors of graph capture: `Unsupported` (a graph break), `SkipFrame`, and the user-facing ones:
`BackendCompilerFailed` (the backend raised on a captured graph) and `InternalTorchDynamoError`
(capture itself failed), raised unless `config.suppress_errors` (PyTorch's names and default)."""
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
