"""Runs when the core has delivered a batch, whoever sent it: the edges' own ``forte send
--watch`` daemons (an instrument writing into an inbox), ``forte ingest``, or ``ForteSendOperator``.

It is scheduled on ``forte_arrivals(site, pattern)``, an Asset watched by a
``ForteBatchArrivalTrigger`` (Airflow 3's event-driven scheduling: an ``AssetWatcher``): the
triggerer polls the core's API (the connection ``forte_core``) for batches ``delivered`` from
that site whose name matches that pattern, and records an Asset event for each, once. Only the
core's API needs to be reachable from Airflow; nothing of Airflow runs at the sites.

``FORTE_EXAMPLE_SITE`` (default ``*``: every site) and ``FORTE_EXAMPLE_PATTERN`` (default ``*``;
``run-*``) choose the batches, ``FORTE_EXAMPLE_POKE_INTERVAL`` how often the core is asked (30 s),
``FORTE_EXAMPLE_SINCE_US`` (optional, a constant) from when.
The task reads which batches arrived from ``triggering_asset_events``.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_provider_forte.assets import batches_of, forte_arrivals

CORE_CONN = os.environ.get("FORTE_EXAMPLE_CORE_CONN", "forte_core")

arrivals = forte_arrivals(
    site=os.environ.get("FORTE_EXAMPLE_SITE") or "*",
    pattern=os.environ.get("FORTE_EXAMPLE_PATTERN") or "*",
    forte_conn_id=CORE_CONN,
    poke_interval=float(os.environ.get("FORTE_EXAMPLE_POKE_INTERVAL", "30")),
    # Unset: from the newest batch delivered when the trigger starts. A constant (microseconds
    # since the epoch): every batch delivered since then, after each triggerer restart too.
    since_us=int(os.environ["FORTE_EXAMPLE_SINCE_US"]) if os.environ.get("FORTE_EXAMPLE_SINCE_US") else None,
)

with DAG(
    dag_id="forte_on_arrival",
    schedule=arrivals,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["forte", "example"],
) as dag:

    @task
    def arrived(triggering_asset_events=None) -> list[dict]:
        batches = batches_of(triggering_asset_events)
        for batch in batches:
            print(f"batch {batch['batch_name']} from {batch['site']} arrived ({batch['core_key']}, {batch['files']} files)")
        return batches

    arrived()
