"""What capture logs, through the shared `FLAMBEAU_LOGS` parser (`flambeau._logging`): kinds
recompiles, graph_breaks, guards, graph, bytecode, printed by the logger `flambeau._dynamo`."""
from __future__ import annotations

from .. import _logging as _shared

log = _shared.get_logger("flambeau._dynamo")
set_logs = _shared.set_logs
enabled = _shared.enabled


def trace(kind: str, msg: str, *args) -> None:
    if _shared.enabled(kind):
        log.debug(f"[{kind}] " + msg, *args)
