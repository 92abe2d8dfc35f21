"""ForteBatchDeliveredSensor: waits until the core has delivered a batch."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Sequence

from airflow.exceptions import AirflowException
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_forte import batches as b
from airflow_provider_forte.hooks.forte import ForteApiError, ForteHook
from airflow_provider_forte.triggers.forte import ForteBatchDeliveredTrigger


class ForteBatchDeliveredSensor(BaseSensorOperator):
    """Waits until the core (``forte pull --watch --http``, through ``core_conn_id``) has
    delivered the batch named ``batch_name``; fails with forte's error text if the core records
    it ``failed`` (or it was cancelled). Its XCom is the core's batch (``key``, ``site``,
    ``name``, ``files``, ``bytes``, …).

    :param batch_name: the batch directory's name (templated).
    :param core_conn_id: a ``forte`` connection to the core's API.
    :param edge_key: optional, the batch's key at the edge (``ForteSendOperator``'s
        ``edge_key``): finds the core's batch by key too, before the core has read its name.
    :param deferrable: wait in the triggerer (:class:`ForteBatchDeliveredTrigger`).
    """

    template_fields: Sequence[str] = ("batch_name", "edge_key")
    ui_color = "#d7ecf7"

    def __init__(
        self,
        *,
        batch_name: str,
        core_conn_id: str = "forte_core",
        edge_key: str | None = None,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batch_name = batch_name
        self.core_conn_id = core_conn_id
        self.edge_key = edge_key
        self.deferrable = deferrable

    def poke(self, context: Any) -> PokeReturnValue | bool:
        hook = ForteHook(self.core_conn_id)
        try:
            batch = hook.find_batch(self.batch_name, role="core", edge_key=self.edge_key)
        except ForteApiError as e:
            if not e.transient:
                raise
            self.log.warning("%s (asking again)", e)
            return False
        outcome = b.outcome(batch, "core")
        if outcome == b.FAILED_:
            assert batch is not None
            raise AirflowException(
                f"forte: batch {self.batch_name!r} failed at the core ({batch['key']}): {hook.failure_text(batch)}"
            )
        if outcome == b.DONE:
            return PokeReturnValue(is_done=True, xcom_value=b.summary(batch))
        self.log.info("batch %r at the core: %s", self.batch_name, batch["state"] if batch else "not recorded yet")
        return False

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        # Done already? Then there is nothing to defer.
        done = self.poke(context)
        if isinstance(done, PokeReturnValue) and done.is_done:
            return done.xcom_value
        timeout = float(self.timeout) if not isinstance(self.timeout, timedelta) else self.timeout.total_seconds()
        self.defer(
            trigger=ForteBatchDeliveredTrigger(
                batch_name=self.batch_name,
                forte_conn_id=self.core_conn_id,
                edge_key=self.edge_key,
                poke_interval=float(self.poke_interval if not isinstance(self.poke_interval, timedelta) else self.poke_interval.total_seconds()),
                deadline=time.time() + timeout,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=timeout + 60),
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        self.log.info("forte: resumed by ForteBatchDeliveredTrigger: %s", event)
        status = event.get("status")
        if status == "delivered":
            return event["batch"]
        if status == "failed":
            key = (event.get("batch") or {}).get("key")
            raise AirflowException(f"forte: batch {self.batch_name!r} failed at the core ({key}): {event.get('error')}")
        raise AirflowException(f"forte: batch {self.batch_name!r}: {event.get('error') or event}")
