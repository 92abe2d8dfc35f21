"""ForteBatchDeliveredSensor: waits until the core has delivered a batch."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Sequence

from airflow.exceptions import AirflowException
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_forte import batches as b
from airflow_provider_forte.hooks.forte import ForteApiError, ForteHook
from airflow_provider_forte.triggers.forte import ForteBatchDeliveredTrigger, describe


class ForteBatchDeliveredSensor(BaseSensorOperator):
    """Waits until the core (``forte pull --watch --http``, through ``core_conn_id``) has
    delivered the batch named ``batch_name`` (of ``site`` if given; with ``pattern`` instead of
    a name, the newest batch whose name matches it); fails with forte's error text if the core
    records it ``failed`` (or it was cancelled). Its XCom is the core's batch (``key``,
    ``site``, ``name``, ``files``, ``bytes``, …).

    :param batch_name: the batch directory's name, exactly (templated); None with ``pattern``.
    :param site: only a batch of this site (exactly, templated): a batch of the same name from
        another site is not it. None: any site.
    :param pattern: only batches whose whole name matches this glob (``run-*``, ``?``, whatever
        the case; templated); without ``batch_name``, the newest such batch decides.
    :param core_conn_id: a ``forte`` connection to the core's API.
    :param edge_key: optional, the batch's key at the edge (``ForteSendOperator``'s
        ``edge_key``): finds the core's batch by key too, before the core has read its name.
    :param deferrable: wait in the triggerer (:class:`ForteBatchDeliveredTrigger`).
    """

    template_fields: Sequence[str] = ("batch_name", "edge_key", "site", "pattern")
    ui_color = "#d7ecf7"

    def __init__(
        self,
        *,
        batch_name: str | None = None,
        core_conn_id: str = "forte_core",
        edge_key: str | None = None,
        deferrable: bool = False,
        site: str | None = None,
        pattern: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if batch_name is None and pattern is None:
            raise ValueError("ForteBatchDeliveredSensor needs a batch_name or a pattern")
        self.batch_name = batch_name
        self.site = site
        self.pattern = pattern
        self.core_conn_id = core_conn_id
        self.edge_key = edge_key
        self.deferrable = deferrable

    def poke(self, context: Any) -> PokeReturnValue | bool:
        hook = ForteHook(self.core_conn_id)
        try:
            batch = hook.find_batch(
                self._name(), role="core", edge_key=self.edge_key, site=self._site(), pattern=self._pattern()
            )
        except ForteApiError as e:
            if not e.transient:
                raise
            self.log.warning("%s (asking again)", e)
            return False
        outcome = b.outcome(batch, "core")
        what = describe(self._name(), self._site(), self._pattern())
        if outcome == b.FAILED_:
            assert batch is not None
            raise AirflowException(
                f"forte: {what} failed at the core ({batch['key']}): {hook.failure_text(batch)}"
            )
        if outcome == b.DONE:
            return PokeReturnValue(is_done=True, xcom_value=b.summary(batch))
        self.log.info("%s at the core: %s", what, f"{batch['key']} {batch['state']}" if batch else "not recorded yet")
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
                batch_name=self._name(),
                forte_conn_id=self.core_conn_id,
                edge_key=self.edge_key,
                site=self._site(),
                pattern=self._pattern(),
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
            raise AirflowException(f"forte: {self._what()} failed at the core ({key}): {event.get('error')}")
        raise AirflowException(f"forte: {self._what()}: {event.get('error') or event}")

    # Templated fields render "" for an empty parameter: that is no filter.
    def _name(self) -> str | None:
        return self.batch_name or None

    def _site(self) -> str | None:
        return self.site or None

    def _pattern(self) -> str | None:
        return self.pattern or None

    def _what(self) -> str:
        return describe(self._name(), self._site(), self._pattern())
