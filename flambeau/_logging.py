"""`FLAMBEAU_LOGS`: which compiler stages print what they do (PyTorch's `TORCH_LOGS`).

    FLAMBEAU_LOGS=graph,aot,output_code,recompiles,graph_breaks,guards python train.py

Kinds: graph (captured graphs), aot (joint/forward/backward graphs), output_code (generated C++
and wrapper), recompiles, graph_breaks, guards, bytecode, fallbacks (what runs eagerly inside
compiled code, and why), perf_hints (the same, for now); `dynamo` and `all` select groups. A
leading `+` (more verbose in PyTorch) is accepted and ignored. `set_logs(aot=True, ...)` changes
the selection from code. The environment is re-read when it changes, so tests can set it.
"""
from __future__ import annotations

import logging
import os

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


def enabled(kind: str) -> bool:
    global _env_seen, _from_env
    env = os.environ.get("FLAMBEAU_LOGS", "")
    if env != _env_seen:
        _env_seen, _from_env = env, _parse(env)
    if kind in _overrides:
        return _overrides[kind]
    return kind in _from_env


def set_logs(**kinds) -> None:
    """`set_logs(recompiles=True, graph_breaks=True)`, like `torch._logging.set_logs`."""
    for k, v in kinds.items():
        for kind in _GROUPS.get(k, (k,)):
            _overrides[kind] = bool(v)


def get_logger(name: str) -> logging.Logger:
    """A logger printing `[name LEVEL] message` to stderr (installed once)."""
    log = logging.getLogger(name)
    if not log.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter(f"[{name} %(levelname)s] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.DEBUG)
        log.propagate = False
    return log
