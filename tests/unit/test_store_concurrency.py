"""The results DB under concurrent writers: processes opening one new file at once neither fail
with 'database is locked' nor run the same key twice."""

import multiprocessing as mp

from paratrain.bench.store import Row, Store

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


def failed_row(key: str, status: str = "failed") -> Row:
    return Row(key, "s", "boom", "paratrain", 0, {}, {}, None, None, None, None, status, None,
               *(None,) * 6)  # fmt: skip


def test_processes_of_one_pass_run_each_run_once_retries_and_reruns_included(tmp_path):
    """Two bench processes (other hosts': assumed alive, on their leases) running one sweep
    at once form one pass: a failed run is retried once, --rerun runs an ok run once; a later
    pass (the members gone) runs them again."""
    store = Store(tmp_path / "r.db")
    a, b = "host-a:1", "host-b:2"
    first = store.join_pass("s", owner=a)
    assert store.join_pass("s", owner=b) == first  # b joins a's pass
    store.put(failed_row("x"))  # failed in an earlier invocation
    store.put(failed_row("y", "ok"))
    assert store.claim("x", owner=a, pass_id=first)  # a retries the failed run
    assert not store.claim("x", owner=b, pass_id=first)  # running: b does not
    store.put(failed_row("x"))  # it failed again
    assert not store.claim("x", owner=b, pass_id=first)  # ran in this pass: b does not either
    assert not store.claim("y", owner=b, pass_id=first)  # ok, no --rerun
    assert store.claim("y", owner=b, pass_id=first, rerun=True)  # --rerun: b runs it...
    store.put(failed_row("y", "ok"))
    assert not store.claim("y", owner=a, pass_id=first, rerun=True)  # ...once in the pass
    store.leave_pass(owner=a)
    store.leave_pass(owner=b)
    later = store.join_pass("s", owner=b)
    assert later != first
    assert store.claim("x", owner=b, pass_id=later)  # a new invocation retries it
    assert store.claim("y", owner=b, pass_id=later, rerun=True)


def test_a_claim_or_a_pass_past_its_lease_is_taken_over(tmp_path):
    store = Store(tmp_path / "r.db")
    gone = store.join_pass("s", owner="host-a:1", lease_s=-1)  # its lease ran out
    assert store.join_pass("s", owner="host-b:2") != gone
    assert store.claim("x", owner="host-a:1", lease_s=-1)  # another host's, lease over
    assert store.claim("x", owner="host-b:2")


def test_a_results_file_of_before_passes_gets_their_columns(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE claims (run_key TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                   "claimed_at TEXT NOT NULL)")  # fmt: skip
        db.execute("INSERT INTO claims VALUES ('x', 'host-a:1', '2026-01-01T00:00:00')")
    store = Store(path)
    assert not store.claim("x", pass_id=store.join_pass("s"))  # the old claim holds (its host's)
    assert store.claim("y", pass_id=store.join_pass("s"))
