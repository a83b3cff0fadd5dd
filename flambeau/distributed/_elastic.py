"""Elastic membership: `flambeau.distributed.run --nnodes MIN:MAX --rdzv-backend c10d` (torchrun's dynamic
rendezvous), nodes joining and leaving a running job.

The launchers meet at a TCPStore at the rendezvous endpoint, served by the first of them that can listen
there (the host; the others connect, as torchrun's c10d backend). The job runs in rounds. A node joins
round k by `add("r<k>/joined", 1)` (its arrival index i) and `set("r<k>/id/<i>", its id)`. The host closes
the round once MIN nodes have joined and either MAX have or `last_call_timeout` has passed since MIN did:
it writes `r<k>/members` (its own id first, then the others in arrival order, at most MAX; their
positions are the GROUP_RANKs) with the restart count. A node that arrives after the round closed joins
round k+1 and waits there. Each round runs one attempt of the job as the fixed launcher does
(`_multinode.attempt_on_node`, keys `a<k>/...`; the host is node 0 and runs mpiexec).

After an attempt the host decides, and the others follow (every node re-joins the next round and reads
either its members or `final`):
- it succeeded, or failed with no restart left: `final` = the exit code, every node exits with it;
- it failed (a worker raised, a node's launcher or proxy died: mpiexec ends the job): the next round, the
  restart count (TORCHELASTIC_RESTART_COUNT) one higher, counted against `--max-restarts`; a dead node
  does not re-join, so the round closes without it after `last_call_timeout` if MIN nodes are left;
- the host saw nodes waiting in round k+1 while the group had fewer than MAX nodes: it stops the workers
  (`attempt_on_node`'s interrupt) and all re-join round k+1; this does not count as a restart (torchrun's
  membership change).

The host cannot be replaced: if its launcher dies, the others lose the store and stop (torchrun's c10d
backend has the same single point). A node that dies after joining a round but before starting its
workers is not noticed (no keep-alive): that round's workers wait for it until killed.
"""
from __future__ import annotations

import datetime
import json
import time
import uuid

from ._multinode import FINAL_ACK_S, STORE_OP_TIMEOUT_S, MpiLauncher, NodeFailure, _say, attempt_on_node
from ._processes import MONITOR_INTERVAL_S
from .store import DistError, PrefixStore, TCPStore

LAST_CALL_TIMEOUT_S = 30.0      # torchrun's default: after MIN nodes joined, how long a round waits for more


def _store(host: str, port: int, run_id: str, join_timeout: float) -> tuple:
    """(store, is_host): serve the rendezvous at host:port if nobody does yet, else connect to it."""
    try:
        store = TCPStore(host, port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=STORE_OP_TIMEOUT_S))
        is_host = True
    except OSError:
        try:
            store = TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=join_timeout))
        except (DistError, OSError) as e:
            raise NodeFailure(f"could not reach the rendezvous at {host}:{port}: {e}") from None
        is_host = False
    store.set_timeout(datetime.timedelta(seconds=STORE_OP_TIMEOUT_S))
    store = PrefixStore(f"flambeau_run/{run_id}/elastic", store)
    if is_host:
        store.set("round", "0")
    return store, is_host


def _joined(store, round_: int) -> int:
    return store.add(f"r{round_}/joined", 0)


def _join(store, node_id: str, round_: int) -> int:
    """Join the first round at or after `round_` that is still open; its number."""
    round_ = max(round_, int(store.get("round")))
    while store.check([f"r{round_}/members"]):
        round_ += 1
    index = store.add(f"r{round_}/joined", 1)
    store.set(f"r{round_}/id/{index}", node_id)
    return round_


def _close(store, node_id: str, round_: int, min_nodes: int, max_nodes: int, join_timeout: float,
           last_call: float, restarts: int) -> list:
    """The host's side of round `round_`: wait for MIN nodes (then for MAX or the last call), name the
    members; their ids, the host's first."""
    deadline = time.monotonic() + join_timeout
    while _joined(store, round_) < min_nodes:
        if time.monotonic() > deadline:
            raise NodeFailure(f"only {_joined(store, round_)} of the {min_nodes} nodes needed joined rendezvous "
                              f"round {round_} within {join_timeout:.0f} s")
        time.sleep(MONITOR_INTERVAL_S)
    last = time.monotonic() + last_call
    while _joined(store, round_) < max_nodes and time.monotonic() < last:
        time.sleep(MONITOR_INTERVAL_S)
    ids = [store.get(f"r{round_}/id/{i}").decode() for i in range(1, _joined(store, round_) + 1)]
    members = [node_id] + [i for i in ids if i != node_id][:max_nodes - 1]
    store.set(f"r{round_}/members", json.dumps({"nodes": members, "restarts": restarts}))
    store.set("round", str(round_))
    return members


def _membership(store, node_id: str, round_: int, wait_s: float) -> tuple:
    """A joined node's wait for the host: (round, members, restarts) once a round takes it in, or None
    when the job has ended (`final`); a round closed without it is followed by the next one."""
    deadline = time.monotonic() + wait_s
    while True:
        if store.check(["final"]):
            return None
        if store.check([f"r{round_}/members"]):
            plan = json.loads(store.get(f"r{round_}/members"))
            if node_id in plan["nodes"]:
                return round_, plan["nodes"], plan["restarts"]
            round_ = _join(store, node_id, round_ + 1)
            deadline = time.monotonic() + wait_s
        if time.monotonic() > deadline:
            raise NodeFailure(f"rendezvous round {round_} did not admit this node within {wait_s:.0f} s")
        time.sleep(MONITOR_INTERVAL_S)


def run_elastic(args, nproc: int, min_nodes: int, max_nodes: int, host: str, port: int, run_id: str,
                mpi: MpiLauncher, target: list, launch_id: str, join_timeout: float, last_call: float) -> None:
    """This launcher's part of an elastic job (see the module docstring); SystemExit with the job's code."""
    node_id, store, rank, round_, restarts, rc = uuid.uuid4().hex, None, 0, 0, 0, 1
    try:
        store, is_host = _store(host, port, run_id, join_timeout)
        while True:
            round_ = _join(store, node_id, round_)
            if is_host:
                members = _close(store, node_id, round_, min_nodes, max_nodes, join_timeout, last_call, restarts)
            else:
                found = _membership(store, node_id, round_, join_timeout + last_call)
                if found is None:
                    rc = int(store.get("final"))
                    break
                round_, members, restarts = found
            rank = members.index(node_id)
            _say(rank, f"rendezvous round {round_}: {len(members)} nodes, this one is node {rank}")
            waiting = _waiting(store, round_ + 1) if is_host and len(members) < max_nodes else None
            rc = attempt_on_node(store, args, rank, nproc, len(members), host, run_id, mpi, target,
                                 launch_id, round_, join_timeout, restarts, waiting)
            round_ += 1
            if not is_host:
                continue
            if rc is None:
                _say(rank, f"nodes are waiting to join: the workers were stopped for rendezvous round {round_}")
            elif rc == 0 or restarts >= args.max_restarts:
                break
            else:
                restarts += 1
                _say(rank, f"restarting the workers ({restarts}/{args.max_restarts}) in rendezvous round {round_}")
        if is_host:
            store.set("final", str(rc))
            _wait_for_members(store, members)
        else:
            store.set(f"done/{node_id}", "1")
    except (DistError, OSError) as e:
        _say(rank, f"lost the rendezvous at {host}:{port} (its host's launcher is gone?): {e}; this node's "
                   "workers were stopped")
        raise SystemExit(1) from None
    except NodeFailure as e:
        _say(rank, str(e))
        raise SystemExit(1) from None
    if rc != 0:
        raise SystemExit(rc if rc > 0 else 1)


def _waiting(store, next_round: int):
    """The host's interrupt while a round's workers run: nodes have joined the next round."""
    def nodes_are_waiting() -> bool:
        return _joined(store, next_round) > 0
    return nodes_are_waiting


def _wait_for_members(store, members: list) -> None:
    """The host keeps its store up until the last round's other members have read `final` (or FINAL_ACK_S)."""
    deadline = time.monotonic() + FINAL_ACK_S
    while time.monotonic() < deadline and not all(store.check([f"done/{m}"]) for m in members[1:]):
        time.sleep(MONITOR_INTERVAL_S)
