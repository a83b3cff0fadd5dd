"""`FLAMBEAU_LOGS`: which compiler stages print what they do (PyTorch's `TORCH_LOGS`).

    FLAMBEAU_LOGS=graph,aot,output_code,recompiles,graph_breaks,guards python train.py

Kinds: graph (captured graphs), aot (joint/forward/backward graphs), output_code (generated C++
and wrapper), recompiles, graph_breaks, guards, bytecode, fallbacks (what runs eagerly inside
compiled code, and why), perf_hints (the same, for now); `dynamo` and `all` select groups. A
leading `+` (more verbose in PyTorch) is accepted and ignored. `set_logs(aot=True, ...)` changes
the selection from code. The environment is re-read when it changes, so tests can set it.

Output goes through `logging`, under the logger `flambeau` (children `flambeau._dynamo`,
`flambeau._functorch`, `flambeau._inductor` at DEBUG, `flambeau.fallbacks` at WARNING). Importing or compiling changes no
logging state: only while some kind is selected does the `flambeau` logger get a handler printing
`[logger LEVEL] message` to the current stderr, level DEBUG, and propagate off (as PyTorch's
`TORCH_LOGS` does, so a root handler does not print each line twice); deselecting everything
restores the logger as it was.
"""
from __future__ import annotations

import logging
import os
import sys

_GROUPS = {"dynamo": ("recompiles", "graph_breaks", "guards", "graph", "bytecode"),
           "all": ("recompiles", "graph_breaks", "guards", "graph", "bytecode", "aot", "output_code", "fallbacks",
                   "perf_hints")}
_ALIASES = {"aot_graphs": "aot", "graph_code": "graph"}
_env_seen = None
_from_env: set = set()
_overrides: dict = {}


def _parse(text: str) -> set:
    kinds = set()
    for part in text.replace(" ", "").split(","):
        part = _ALIASES.get(part.lstrip("+"), part.lstrip("+"))
        if part:
            kinds.update(_GROUPS.get(part, (part,)))
    return kinds


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time (pytest's capsys, a redirected stream)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


_handler = _StderrHandler()
_ROOT = "flambeau"
_saved: list = [logging.NOTSET, True]     # the `flambeau` logger's level and propagate before _handler


def _configure(wanted: bool | None = None) -> None:
    """Give the `flambeau` logger its handler while any kind is selected, and take it away after."""
    if wanted is None:
        wanted = bool(_from_env) or any(_overrides.values())
    root = logging.getLogger(_ROOT)
    if wanted and _handler not in root.handlers:
        _saved[:] = [root.level, root.propagate]
        root.addHandler(_handler)
        root.setLevel(logging.DEBUG)
        root.propagate = False
    elif not wanted and _handler in root.handlers:
        root.removeHandler(_handler)
        root.setLevel(_saved[0])
        root.propagate = _saved[1]


def enabled(kind: str) -> bool:
    global _env_seen, _from_env
    env = os.environ.get("FLAMBEAU_LOGS", "")
    if env != _env_seen:
        _env_seen, _from_env = env, _parse(env)
        _configure()
    if kind in _overrides:
        return _overrides[kind]
    return kind in _from_env


def set_logs(**kinds) -> None:
    """`set_logs(recompiles=True, graph_breaks=True)`, like `torch._logging.set_logs`."""
    for k, v in kinds.items():
        for kind in _GROUPS.get(k, (k,)):
            _overrides[kind] = bool(v)
    _configure()


def get_logger(name: str) -> logging.Logger:
    """The logger `name` (under `flambeau`), untouched: output is configured by `_configure`."""
    return logging.getLogger(name)


def log_artifact(log: logging.Logger, kind: str, msg: str, *args, force: bool = False) -> None:
    """Log a stage's dump (a graph, generated code) when `kind` is selected; `force` (a config
    switch such as `flambeau._inductor.config.output_code`) prints it for this one message too."""
    if enabled(kind):
        log.debug(msg, *args)
    elif force:
        _configure(True)
        try:
            log.debug(msg, *args)
        finally:
            _configure()
