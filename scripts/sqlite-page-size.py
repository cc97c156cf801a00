#!/usr/bin/env python3
"""CPU per claim + completion on SQLite by page size and outcome size (docs/benchmarks.md, issue 16).

    python3 scripts/sqlite-page-size.py [PAIRS]

Each pair is what the SQLite store commits per executed call: one transaction that inserts the
record, one that writes its outcome and moves its expiry (the store's schema shape: a
WITHOUT ROWID table keyed by namespace, principal and key, and an index on the expiry; WAL with
synchronous=NORMAL and no automatic checkpoint). Python's own time per statement is in the
figures, the same for every row: compare rows, not absolute values.
"""
import os
import sqlite3
import sys
import tempfile
import time
import uuid

PAIRS = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
NAMESPACE = "http://127.0.0.1:8000/mcp"


def run(directory, page_size, outcome_len):
    path = os.path.join(directory, f"records-{page_size}-{outcome_len}.sqlite3")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size = {page_size}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(
        "CREATE TABLE records (namespace TEXT, principal TEXT, key TEXT, outcome TEXT, "
        "expires_at INTEGER, PRIMARY KEY (namespace, principal, key)) WITHOUT ROWID"
    )
    conn.execute("CREATE INDEX records_expires_at ON records (expires_at)")
    outcome = "x" * outcome_len
    started = time.process_time()
    for i in range(PAIRS):
        principal, key = f"t{i % 64}", str(uuid.uuid4())
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO records VALUES (?, ?, ?, NULL, ?)", (NAMESPACE, principal, key, i)
        )
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "UPDATE records SET outcome = ?, expires_at = ? "
            "WHERE namespace = ? AND principal = ? AND key = ?",
            (outcome, i + 1_000_000, NAMESPACE, principal, key),
        )
        conn.execute("COMMIT")
    cpu = (time.process_time() - started) / PAIRS * 1e6
    wal = os.path.getsize(path + "-wal") / PAIRS
    conn.close()
    return cpu, wal


with tempfile.TemporaryDirectory() as directory:
    print("| outcome bytes | page size | CPU µs per pair | WAL bytes per pair |")
    print("| --- | --- | --- | --- |")
    for outcome_len in (100, 2000, 16000, 64000):
        for page_size in (1024, 2048, 4096):
            cpu, wal = run(directory, page_size, outcome_len)
            print(f"| {outcome_len} | {page_size} | {cpu:.1f} | {wal:.0f} |")
