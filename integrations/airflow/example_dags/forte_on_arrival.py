"""Runs whenever a ``ForteSendOperator`` has had a batch delivered: scheduled on the Asset of any
forte batch (``forte_batch_asset()``, ``forte://*/*``), which the operator updates with the
batch in the event's ``extra``. ``forte_batch_asset("run-*", site="mine-7")`` (declared in the
operator's ``outlets`` too) narrows it to some batches of one site, and
``forte_batch_asset("run-42", site="mine-7")`` is one batch (emitted through the alias
``FORTE_BATCHES``)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

from airflow_provider_forte.assets import forte_batch_asset

with DAG(
    dag_id="forte_on_arrival",
    schedule=forte_batch_asset(),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["forte", "example"],
) as dag:

    @task
    def arrived(triggering_asset_events=None) -> list[dict]:
        batches = []
        for events in (triggering_asset_events or {}).values():
            for event in events:
                print(f"batch {event.extra.get('batch_name')} from {event.extra.get('site')}: {event.extra}")
                batches.append(dict(event.extra))
        return batches

    arrived()
