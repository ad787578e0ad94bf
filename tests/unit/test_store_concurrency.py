"""The results DB under concurrent writers: processes opening one new file at once neither fail
with 'database is locked' nor run the same key twice."""

import multiprocessing as mp

from paratrain.bench.store import Store

KEYS = [f"run-{i}" for i in range(12)]


def _worker(path, queue):
    try:
        store = Store(path)  # all at once, on a file none of them created yet
        queue.put(("ok", [k for k in KEYS if store.claim(k)]))
    except Exception as e:  # noqa: BLE001 - reported to the test
        queue.put(("error", repr(e)))


def test_concurrent_sweeps_share_one_new_file_and_claim_each_key_once(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(tmp_path / "r.db", queue)) for _ in range(6)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert all(kind == "ok" for kind, _ in got), got
    claimed = [k for _, keys in got for k in keys]
    assert sorted(claimed) == sorted(KEYS)  # every key once, by one process


def test_a_claim_of_a_finished_process_is_taken_over_and_a_done_run_is_not(tmp_path):
    store = Store(tmp_path / "r.db")
    assert store.claim("a", owner="nohost-that-exists:1")  # another host's: assumed alive
    assert not store.claim("a")
    import socket

    assert store.claim("b", owner=f"{socket.gethostname()}:999999999")  # no such pid
    assert store.claim("b")  # its process is gone: taken over
    store.release("b")
    assert store.claim("b")
