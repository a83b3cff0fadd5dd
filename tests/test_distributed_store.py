"""Stores and single-process process groups of flambeau.distributed, beside torch.distributed's.

The same sequence of store operations runs on PyTorch's store and on ours and the answers are compared
(num_keys aside: PyTorch's TCPStore counts a key of its own). Timeouts must raise DistStoreError /
DistNetworkError (RuntimeError subclasses, as PyTorch's) close to the requested time, never hang.
"""
from __future__ import annotations

import datetime
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as tdist

import flambeau
import flambeau.distributed as dist

SHORT = datetime.timedelta(seconds=0.5)


def _script(store, ns):
    """Answers of one sequence of store calls (str/bytes keys and values, add, compare_set, delete)."""
    out = []
    store.set("a", "x")
    out.append(store.get("a"))
    out.append(store.add("c", 3))
    out.append(store.add("c", -1))
    out.append(store.get("c"))
    out.append(store.compare_set("a", "x", "y"))
    out.append(store.compare_set("a", "zz", "w"))
    out.append(store.compare_set("new", "", "v"))
    out.append(store.compare_set("new2", "q", "v"))
    out.append(store.check(["a", "c"]))
    out.append(store.check(["a", "nope"]))
    out.append(store.delete_key("a"))
    out.append(store.delete_key("a"))
    store.set("bin", b"\x00\xff")
    out.append(store.get("bin"))
    store.append("ap", "a")
    store.append("ap", b"b")
    out.append(store.multi_get(["ap", "c"]))
    store.multi_set(["m1", "m2"], ["1", "2"])
    out.append(store.get("m2"))
    return out


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tcp_store_answers_as_pytorch():
    ours = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT)
    theirs = tdist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT)
    assert _script(ours, dist) == _script(theirs, tdist)
    assert ours.port > 0 and ours.timeout == SHORT
    assert ours.num_keys() == 6          # c new bin ap m1 m2 ("a" was deleted, "new2" never set)
    assert theirs.num_keys() - ours.num_keys() == 1


def test_tcp_store_server_uses_uvloop_when_installed():
    pytest.importorskip("uvloop")
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT)
    assert store.libuvBackend is True
    assert dist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT, use_libuv=False).libuvBackend is False


@pytest.mark.parametrize("kind", ["hash", "file", "prefix"])
def test_other_stores_answer_as_pytorch(kind, tmp_path):
    if kind == "hash":
        ours, theirs = dist.HashStore(), tdist.HashStore()
    elif kind == "file":
        ours, theirs = dist.FileStore(str(tmp_path / "ours"), 1), tdist.FileStore(str(tmp_path / "theirs"), 1)
    else:
        ours = dist.PrefixStore("p", dist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT))
        theirs = tdist.PrefixStore("p", tdist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT))
    assert _script(ours, dist) == _script(theirs, tdist)


def test_prefix_store_keys_live_under_the_prefix():
    base = dist.HashStore()
    dist.PrefixStore("pre", base).set("k", b"v")
    assert base.get("pre/k") == b"v"
    assert not base.check(["k"])


@pytest.mark.parametrize("kind", ["tcp", "hash", "file"])
def test_get_of_a_missing_key_times_out(kind, tmp_path):
    store = {"tcp": lambda: dist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT),
             "hash": dist.HashStore, "file": lambda: dist.FileStore(str(tmp_path / "f"), 1)}[kind]()
    store.set_timeout(SHORT)
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError) as err:
        store.get("missing")
    assert 0.4 < time.monotonic() - start < 5
    assert isinstance(err.value, RuntimeError)
    with pytest.raises(dist.DistStoreError):
        store.wait(["missing"], datetime.timedelta(seconds=0.2))


def test_tcp_store_connect_to_nobody_raises_network_error():
    start = time.monotonic()
    with pytest.raises(dist.DistNetworkError):
        dist.TCPStore("127.0.0.1", _free_port(), 2, False, timeout=datetime.timedelta(seconds=0.5))
    assert time.monotonic() - start < 5


def test_tcp_store_master_waits_for_workers_then_times_out():
    with pytest.raises(dist.DistStoreError, match="waiting for clients"):
        dist.TCPStore("127.0.0.1", 0, 3, True, timeout=datetime.timedelta(seconds=0.5))


def test_tcp_store_many_clients_and_a_blocking_get():
    master = dist.TCPStore("127.0.0.1", 0, 9, True, timeout=datetime.timedelta(seconds=20), wait_for_workers=False)
    got = []

    def client(i):
        c = dist.TCPStore("127.0.0.1", master.port, 9, False, timeout=datetime.timedelta(seconds=20))
        c.add("count", 1)
        got.append(c.get("go"))                  # blocks on the server until the master sets it
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    master.wait(["count"])
    deadline = time.monotonic() + 20
    while int(master.get("count")) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    master.set("go", "now")
    for t in threads:
        t.join(20)
    assert got == [b"now"] * 8


def test_tcp_store_client_in_another_process_and_pytorch_layout():
    master = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    code = ("import datetime, flambeau.distributed as d; s = d.TCPStore('127.0.0.1', %d, 2, False, "
            "timeout=datetime.timedelta(seconds=30)); s.set('from_child', 'hi'); print(s.add('n', 5))") % master.port
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "5" and master.get("from_child") == b"hi"


_SERVER_AT_EXIT = r"""
import atexit, sys, threading

def report():          # registered first, so it runs after flambeau's own atexit handlers
    alive = [t.name for t in threading.enumerate() if t.name.startswith("flambeau-tcpstore")]
    print("server threads at exit:", alive, flush=True)

atexit.register(report)
from flambeau.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
store.set("k", b"v")
kept = store           # alive until the interpreter is finalized, like a rank's default store
"""


def test_tcp_store_server_thread_is_stopped_before_the_interpreter_is_finalized():
    """A server thread still running while Python finalizes can be woken by a peer (libuv's read callback
    takes the GIL) and crash the process: it must be stopped by the time atexit handlers are done."""
    r = subprocess.run([sys.executable, "-c", _SERVER_AT_EXIT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "server threads at exit: []" in r.stdout, r.stdout + r.stderr


def test_file_store_shared_by_two_handles_and_deleted_by_the_last(tmp_path):
    path = str(tmp_path / "shared")
    a, b = dist.FileStore(path, 2), dist.FileStore(path, 2)
    a.set("k", "1")
    assert b.get("k") == b"1" and b.add("n", 4) == 4 and a.add("n", 1) == 5
    a.close()
    assert os.path.exists(path)
    b.close()
    assert not os.path.exists(path)


# ---- process groups in one process ------------------------------------------------------------------
@pytest.fixture
def one_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_process_group_world_of_one(method, monkeypatch, tmp_path, one_process_group):
    pytest.importorskip("mpi4py")
    port = _free_port()
    if method == "env":
        for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1").items():
            monkeypatch.setenv(k, v)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    elif method == "tcp":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    else:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_backend() == "gloo"
    t = flambeau.arange(4.0)
    dist.all_reduce(t)
    dist.barrier()
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="twice"):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    dist.destroy_process_group()
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        dist.get_rank()


def test_init_again_on_the_same_port_after_destroy(monkeypatch, one_process_group):
    pytest.importorskip("mpi4py")
    port = _free_port()
    for _ in range(2):                   # the first group's TCPStore server must let go of the port
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=10))
        dist.barrier()
        dist.destroy_process_group()


def test_env_rendezvous_without_master_addr_raises_as_pytorch(monkeypatch):
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR") as ours:
        dist.init_process_group("gloo", rank=0, world_size=1)
    with pytest.raises(ValueError, match="MASTER_ADDR") as theirs:
        tdist.init_process_group("gloo", rank=0, world_size=1)
    assert type(ours.value) is type(theirs.value)


def test_world_of_two_without_mpiexec_says_how_to_launch(one_process_group):
    pytest.importorskip("mpi4py")
    with pytest.raises(RuntimeError, match="flambeau.distributed.run"):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=2,
                                timeout=datetime.timedelta(seconds=5))


def test_unknown_backend_says_which_are_registered():
    with pytest.raises(RuntimeError, match="'ucc' is not available.*'nccl'"):
        dist.init_process_group("ucc", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
    if importlib.util.find_spec("cupy") is None:
        assert dist.is_nccl_available() is False


def test_async_collective_on_world_of_one_has_future(one_process_group):
    pytest.importorskip("mpi4py")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    t = flambeau.tensor(np.arange(6, dtype=np.float32))
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] + 1)
    assert fut.wait().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert work.is_completed()


def test_a_closed_tcp_store_server_leaves_no_garbage():
    """A stopped server closes its event loop: an open stopped loop stays in reference cycles the collector
    cannot free (uvloop's objects), one per server, for the rest of the process."""
    import gc
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set("k", b"v")
    server = store._server
    del store
    server._thread.join(30)
    assert not server._thread.is_alive()
    del server
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        loops = [o for o in gc.garbage if type(o).__name__ == "Loop"]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert loops == []


def test_closing_the_server_with_a_client_connected_prints_nothing():
    """A master store that goes away while another store is still connected (a rank's client at exit) ends
    the client's connection quietly: Python 3.11's stream callback used to report the cancelled connection
    task as "Exception in callback ... CancelledError" on stderr."""
    import subprocess
    import sys
    code = ("import flambeau.distributed as dist\n"
            "m = dist.TCPStore('127.0.0.1', 0, 2, True, wait_for_workers=False)\n"
            "c = dist.TCPStore('127.0.0.1', m.port, 2, False)\n"
            "c.set('k', b'v'); assert m.get('k') == b'v'\n"
            "m._server.close(); print('closed')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "closed", p.stderr
    assert "Traceback" not in p.stderr and "Exception in callback" not in p.stderr, p.stderr
