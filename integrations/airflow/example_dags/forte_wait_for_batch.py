"""Wait until the core has delivered a batch that something else sent (an instrument writing
into the edge's inbox, a ``forte ingest``), then list its files.

The batch's name is the parameter ``batch_name`` (default: ``FORTE_EXAMPLE_BATCH``); ``site``
(``FORTE_EXAMPLE_SITE``) takes only that site's batch of that name, not another site's of the same
name; ``pattern`` (``FORTE_EXAMPLE_PATTERN``, ``run-*``) with an empty ``batch_name`` waits for the
newest batch whose name matches it. The core's API is the connection ``forte_core``. A batch the core fails to deliver fails the sensor with
forte's error text. ``FORTE_EXAMPLE_DEFERRABLE=1`` waits in the triggerer.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from airflow_provider_forte.hooks.forte import ForteHook
from airflow_provider_forte.sensors.forte import ForteBatchDeliveredSensor

CORE_CONN = os.environ.get("FORTE_EXAMPLE_CORE_CONN", "forte_core")

with DAG(
    dag_id="forte_wait_for_batch",
    description="Wait for a batch to be delivered at the core, then list its files",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["forte", "example"],
    params={
        "batch_name": Param(os.environ.get("FORTE_EXAMPLE_BATCH", "run-1"), type="string"),
        "site": Param(os.environ.get("FORTE_EXAMPLE_SITE", ""), type="string"),
        "pattern": Param(os.environ.get("FORTE_EXAMPLE_PATTERN", ""), type="string"),
    },
) as dag:
    delivered = ForteBatchDeliveredSensor(
        task_id="delivered",
        batch_name="{{ params.batch_name }}",
        site="{{ params.site }}",
        pattern="{{ params.pattern }}",
        core_conn_id=CORE_CONN,
        deferrable=os.environ.get("FORTE_EXAMPLE_DEFERRABLE", "") not in ("", "0", "false"),
        poke_interval=float(os.environ.get("FORTE_EXAMPLE_POKE_INTERVAL", "5")),
        timeout=timedelta(seconds=float(os.environ.get("FORTE_EXAMPLE_TIMEOUT", "3600"))),
        mode="poke",
    )

    @task
    def list_files(batch: dict) -> list[str]:
        detail = ForteHook(CORE_CONN).batch(batch["key"])
        for f in detail["files"]:
            print(f"{f['path']}\t{f['size']}\t{f['sha256']}\t{f['delivered_to']}")
        return [f["path"] for f in detail["files"]]

    list_files(delivered.output)


if __name__ == "__main__":
    dag.test()
