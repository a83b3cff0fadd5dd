"""The remote shell through which Open MPI's mpiexec starts its daemon on another node of a multi-node launch.

Open MPI 5's runtime (PRRTE) starts one `prted` daemon per remote host through an ssh-like agent, run as
`AGENT host command`. On node 0, `flambeau.distributed.run --nnodes M` names this module as that agent
(`--prtemca plm_ssh_agent`) and the hosts node1..node{M-1} (node 0 is `localhost`, started by mpiexec
itself). Instead of logging in anywhere, the agent hands the command to node R's launcher through the
rendezvous store (`a<K>/proxy/R`, the same key Hydra's proxy commands use: `_multinode.py`), which runs it
in its own environment, and then waits as ssh would: until node R says the daemon ended (`a<K>/ended/R`,
its exit code, which the agent exits with) or node 0 ends the attempt (`a<K>/stop`). It dies with
mpiexec (`_parent_death`), so it never outlives the job.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time

from ._parent_death import die_with_parent
from ._processes import MONITOR_INTERVAL_S
from .store import DistError, PrefixStore, TCPStore

STORE_VAR = "FLAMBEAU_RDZV_STORE"          # host:port of the rendezvous store (set by node 0's launcher)
PREFIX_VAR = "FLAMBEAU_RDZV_PREFIX"        # the launch's key prefix in that store
ATTEMPT_VAR = "FLAMBEAU_RDZV_ATTEMPT"      # the attempt whose keys the agent writes
HOST_PREFIX = "node"                       # the host names node 0 gives mpiexec: node1, node2, ...
CONNECT_TIMEOUT_S = 30.0
AGENT_FAILURE = 255                        # what ssh exits with when it cannot reach the host


def main(argv: list) -> int:
    die_with_parent()
    host, command = argv[0], " ".join(argv[1:])
    if not host.startswith(HOST_PREFIX) or not host[len(HOST_PREFIX):].isdigit():
        print(f"flambeau.distributed._ompi_agent: unknown host {host!r} (expected {HOST_PREFIX}<R>)", file=sys.stderr)
        return AGENT_FAILURE
    node, attempt = int(host[len(HOST_PREFIX):]), os.environ[ATTEMPT_VAR]
    address, _, port = os.environ[STORE_VAR].rpartition(":")
    try:
        store = PrefixStore(os.environ[PREFIX_VAR],
                            TCPStore(address, int(port), timeout=datetime.timedelta(seconds=CONNECT_TIMEOUT_S)))
        store.set(f"a{attempt}/proxy/{node}", json.dumps({"proxy": ["/bin/sh", "-c", command],
                                                          "master_port": int(os.environ["MASTER_PORT"])}))
        ended, stop = f"a{attempt}/ended/{node}", f"a{attempt}/stop"
        while True:
            if store.check([ended]):
                return int(store.get(ended))
            if store.check([stop]):
                return 0
            time.sleep(MONITOR_INTERVAL_S)
    except (DistError, OSError) as e:
        print(f"flambeau.distributed._ompi_agent: lost the rendezvous store for {host}: {e}", file=sys.stderr)
        return AGENT_FAILURE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
