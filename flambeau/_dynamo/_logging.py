"""`FLAMBEAU_LOGS=recompiles,graph_breaks,guards,graph,bytecode`: what capture prints (to stderr,
through the `logging` module under the logger `flambeau._dynamo`)."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("flambeau._dynamo")
_enabled: set = set()


def _configure() -> None:
    for part in os.environ.get("FLAMBEAU_LOGS", "").replace(" ", "").split(","):
        if part.startswith("+"):
            part = part[1:]
        if part in ("dynamo", "all"):
            _enabled.update(("recompiles", "graph_breaks", "guards", "graph", "bytecode"))
        elif part:
            _enabled.add(part)
    if _enabled and not log.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[flambeau._dynamo %(levelname)s] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.DEBUG)
        log.propagate = False


def enabled(kind: str) -> bool:
    return kind in _enabled


def set_logs(**kinds) -> None:
    """`set_logs(recompiles=True, graph_breaks=True)`, like `torch._logging.set_logs`."""
    for k, v in kinds.items():
        (_enabled.add if v else _enabled.discard)(k)
    if _enabled and not log.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[flambeau._dynamo %(levelname)s] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.DEBUG)
        log.propagate = False


def trace(kind: str, msg: str, *args) -> None:
    if kind in _enabled:
        log.debug(f"[{kind}] " + msg, *args)


_configure()
