"""Send a directory through forte as one batch, wait until the core has delivered it, then check
what arrived against the source.

It needs a running edge (``forte send INBOX --watch --http 127.0.0.1:8081 …``) and core
(``forte pull --watch --http 127.0.0.1:8082 …``), and two connections of type ``forte``:
``forte_edge`` and ``forte_core`` (for example ``AIRFLOW_CONN_FORTE_EDGE='{"conn_type": "forte",
"host": "127.0.0.1", "port": 8081}'``). The parameters (``source``, ``inbox``, ``batch_name``)
default to the environment variables ``FORTE_EXAMPLE_SOURCE``, ``FORTE_EXAMPLE_INBOX`` and
``FORTE_EXAMPLE_BATCH`` (the run's id when empty), and may be given per run (``airflow dags
trigger -c '{"source": …}'``). ``FORTE_EXAMPLE_DEFERRABLE=1`` waits for the delivery in the
triggerer.
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param, task

from airflow_provider_forte.hooks.forte import ForteHook
from airflow_provider_forte.operators.forte import ForteSendOperator

EDGE_CONN = os.environ.get("FORTE_EXAMPLE_EDGE_CONN", "forte_edge")
CORE_CONN = os.environ.get("FORTE_EXAMPLE_CORE_CONN", "forte_core")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


with DAG(
    dag_id="forte_send_and_process",
    description="Send a directory through forte as a batch, wait for its delivery, check it",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["forte", "example"],
    params={
        "source": Param(os.environ.get("FORTE_EXAMPLE_SOURCE", "/data/outgoing/run-1"), type="string"),
        "inbox": Param(os.environ.get("FORTE_EXAMPLE_INBOX", "/data/inbox"), type="string"),
        "batch_name": Param(os.environ.get("FORTE_EXAMPLE_BATCH", ""), type="string"),
        # The core's destination (pull --to), where the delivered copies are read back if given.
        "dest": Param(os.environ.get("FORTE_EXAMPLE_DEST", ""), type="string"),
    },
) as dag:
    send = ForteSendOperator(
        task_id="send",
        source="{{ params.source }}",
        inbox="{{ params.inbox }}",
        # A batch name must be new to the edge: by default, one per run.
        batch_name="{{ params.batch_name or ('airflow-' ~ run_id | replace(':', '-') | replace('+', '-')) }}",
        edge_conn_id=EDGE_CONN,
        core_conn_id=CORE_CONN,
        wait_for_delivery=True,
        deferrable=os.environ.get("FORTE_EXAMPLE_DEFERRABLE", "") not in ("", "0", "false"),
        poke_interval=float(os.environ.get("FORTE_EXAMPLE_POKE_INTERVAL", "5")),
        timeout=float(os.environ.get("FORTE_EXAMPLE_TIMEOUT", "3600")),
    )

    @task
    def check_delivery(sent: dict, params: dict | None = None) -> dict:
        """What the core delivered, file by file (forte's API), against the source: the same
        paths, sizes and SHA-256; and, given the core's destination, the delivered copies hash
        the same."""
        assert params is not None
        source = Path(params["source"])
        expected = {
            str(p.relative_to(source)): (p.stat().st_size, sha256_of(p))
            for p in sorted(source.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }
        detail = ForteHook(CORE_CONN).batch(sent["core_key"])
        delivered = {f["path"]: f for f in detail["files"] if f.get("sha256")}
        dest = Path(params["dest"]) if params.get("dest") else None
        problems, copies = [], 0
        for path, (size, sha) in expected.items():
            f = delivered.get(path)
            if f is None:
                problems.append(f"{path}: not delivered")
            elif (f["size"], f["sha256"]) != (size, sha):
                problems.append(f"{path}: delivered {f['size']} bytes sha256 {f['sha256']}, sent {size} bytes {sha}")
            elif dest is not None:
                # delivered_to is where the core placed it, under its destination.
                copy = dest / f["delivered_to"]
                if not copy.is_file():
                    problems.append(f"{path}: not at {copy}")
                elif sha256_of(copy) != sha:
                    problems.append(f"{path}: {copy} differs from the source")
                else:
                    copies += 1
        problems += [f"{path}: delivered but not in the source" for path in delivered.keys() - expected.keys()]
        if problems:
            raise ValueError("batch %s: %s" % (sent["batch_name"], "; ".join(problems)))
        print(f"batch {sent['batch_name']}: {len(expected)} files delivered, every SHA-256 matches the source ({copies} copies read back)")
        return {"batch_name": sent["batch_name"], "files": len(expected), "copies_read_back": copies, "verified": True}

    check_delivery(send.output)


if __name__ == "__main__":
    dag.test()
