"""ForteBatchDeliveredTrigger: waits in the triggerer until the core has delivered a batch."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_forte import batches as b
from airflow_provider_forte.hooks.forte import ForteApiError, ForteAsyncClient


class ForteBatchDeliveredTrigger(BaseTrigger):
    """Polls the core's API (``forte pull --http``) every ``poke_interval`` seconds until the
    batch named ``batch_name`` (or whose core key is ``SITE/edge_key``) is ``delivered``.

    It fires one event, a dict with ``status``:

    - ``delivered``: ``batch`` is the core's batch (key, site, name, files, bytes, …);
    - ``failed``: the core recorded the batch ``failed`` (or it was cancelled): ``error`` is
      forte's error text, ``batch`` the batch;
    - ``error``: the API refused the request (a wrong token, a bad parameter): ``error``;
    - ``timeout``: ``deadline`` (seconds since the epoch) passed first: ``error`` says what
      was last seen.

    A daemon that does not answer, a batch not recorded yet, or a catalogue that could not be
    read this time are waited through.
    """

    def __init__(
        self,
        batch_name: str,
        forte_conn_id: str,
        edge_key: str | None = None,
        poke_interval: float = 10.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.batch_name = batch_name
        self.forte_conn_id = forte_conn_id
        self.edge_key = edge_key
        self.poke_interval = poke_interval
        self.deadline = deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "batch_name": self.batch_name,
                "forte_conn_id": self.forte_conn_id,
                "edge_key": self.edge_key,
                "poke_interval": self.poke_interval,
                "deadline": self.deadline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        what = f"batch {self.batch_name!r} at the core ({self.forte_conn_id})"
        try:
            client = await ForteAsyncClient.for_connection(self.forte_conn_id)
        except Exception as e:  # a missing or unusable connection
            yield TriggerEvent({"status": "error", "error": f"connection {self.forte_conn_id!r}: {e}"})
            return
        last = "not recorded yet"
        while True:
            try:
                batch = await client.find_batch(self.batch_name, role="core", edge_key=self.edge_key)
                state = b.outcome(batch, "core")
                if state == b.DONE:
                    yield TriggerEvent({"status": "delivered", "batch": b.summary(batch)})
                    return
                if state == b.FAILED_:
                    assert batch is not None
                    error = await client.failure_text(batch)
                    yield TriggerEvent({"status": "failed", "error": error, "batch": b.summary(batch)})
                    return
                if batch is not None:
                    last = f"{batch.get('state')}, {batch.get('progress', 0):.0%} done"
                self.log.info("%s: %s", what, last)
            except ForteApiError as e:
                if not e.transient:
                    yield TriggerEvent({"status": "error", "error": str(e)})
                    return
                last = str(e)
                self.log.warning("%s: %s (asking again)", what, e)
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent({"status": "timeout", "error": f"{what} not delivered in time; last seen: {last}"})
                return
            await asyncio.sleep(self.poke_interval)
