"""Triggers over the core's API: ``ForteBatchDeliveredTrigger`` waits (for a deferred task) until
the core has delivered a batch; ``ForteBatchArrivalTrigger`` watches the core for delivered batches
and fires an event for each (event-driven scheduling: an ``AssetWatcher`` of an Asset)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from collections import OrderedDict

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from airflow_provider_forte import assets as a
from airflow_provider_forte import batches as b
from airflow_provider_forte.hooks.forte import ForteApiError, ForteAsyncClient


class ForteBatchDeliveredTrigger(BaseTrigger):
    """Polls the core's API (``forte pull --http``) every ``poke_interval`` seconds until the
    batch named ``batch_name`` (or whose core key is ``SITE/edge_key``) is ``delivered``; with
    ``site``, only that site's batch (another site's batch of the same name is not it); with
    ``pattern`` (``run-*``; ``batch_name`` None), the newest batch whose name matches it.

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
        batch_name: str | None,
        forte_conn_id: str,
        edge_key: str | None = None,
        poke_interval: float = 10.0,
        deadline: float | None = None,
        site: str | None = None,
        pattern: str | None = None,
    ) -> None:
        super().__init__()
        if batch_name is None and pattern is None:
            raise ValueError("ForteBatchDeliveredTrigger needs a batch_name or a pattern")
        self.batch_name = batch_name
        self.forte_conn_id = forte_conn_id
        self.edge_key = edge_key
        self.site = site
        self.pattern = pattern
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
                "site": self.site,
                "pattern": self.pattern,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        what = f"{describe(self.batch_name, self.site, self.pattern)} at the core ({self.forte_conn_id})"
        try:
            client = await ForteAsyncClient.for_connection(self.forte_conn_id)
        except Exception as e:  # a missing or unusable connection
            yield TriggerEvent({"status": "error", "error": f"connection {self.forte_conn_id!r}: {e}"})
            return
        last = "not recorded yet"
        while True:
            try:
                batch = await client.find_batch(
                    self.batch_name, role="core", edge_key=self.edge_key, site=self.site, pattern=self.pattern
                )
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


def describe(batch_name: str | None, site: str | None, pattern: str | None) -> str:
    """``batch 'run-1' of site 'site-a'``, ``the newest batch matching 'run-*'``, …"""
    what = f"batch {batch_name!r}" if batch_name is not None else "the newest batch"
    if pattern is not None:
        what += f" matching {pattern!r}"
    if site is not None:
        what += f" of site {site!r}"
    return what


#: How far before the newest change seen each poll of ForteBatchArrivalTrigger looks again.
LOOKBACK_US = 60_000_000


class ForteBatchArrivalTrigger(BaseEventTrigger):
    """Watches the core's API (``forte pull --watch --http``) and fires an event for each batch
    the core has ``delivered``, whoever sent it (a ``forte send --watch`` daemon at an edge, an
    instrument writing into its inbox, ``ForteSendOperator``): of ``site`` only (exactly; None:
    every site) and, with ``pattern``, only batches whose whole name matches it (``run-*``,
    ``?``, whatever the case). It is the trigger of an ``AssetWatcher``
    (:func:`airflow_provider_forte.assets.forte_arrivals`): each event becomes an Asset event,
    so that a DAG scheduled on that Asset runs when a site's batch arrives.

    Every ``poke_interval`` seconds it asks for the delivered batches changed since the last
    one it saw (``GET /api/v1/batches?role=core&state=delivered&site=…&pattern=…&since_us=…``),
    oldest first, and fires one event per batch it has not fired for yet: ``{"status":
    "delivered", "batch": {key, site, name, files, bytes, …, updated_us}, "uri":
    "forte://SITE/NAME"}``. It remembers the newest change it saw (``since_us``) and the keys
    it fired for (the newest ``remember`` of them), so a batch is fired for once, even when the
    core records it again later; each poll looks a minute before that newest change again, for
    a change committed late.

    :param since_us: fire for batches delivered from then on (microseconds since the epoch, the
        core's clock); None (the default): from the newest delivered batch the core holds when
        the trigger starts, excluded. The triggerer starts a trigger again from its arguments
        (after a restart, or when it moves to another triggerer): with ``since_us`` None it
        then fires for what is delivered from then on, without firing twice for what it fired
        before, but not for what was delivered while no triggerer ran it; with ``since_us``
        given it fires again for every batch delivered since then.

    A daemon that does not answer, a catalogue that could not be read, a refused token or a
    missing connection are logged and asked again at the next poll: the trigger never ends.
    """

    def __init__(
        self,
        forte_conn_id: str = "forte_core",
        site: str | None = None,
        pattern: str | None = None,
        poke_interval: float = 30.0,
        since_us: int | None = None,
        remember: int = 100_000,
    ) -> None:
        super().__init__()
        self.forte_conn_id = forte_conn_id
        self.site = site or None
        self.pattern = pattern or None
        self.poke_interval = poke_interval
        self.since_us = since_us
        self.remember = remember
        # What this instance has seen: the newest change and the keys fired for.
        self._since: int | None = since_us
        self._fired: OrderedDict[str, int] = OrderedDict()
        self._client: ForteAsyncClient | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "forte_conn_id": self.forte_conn_id,
                "site": self.site,
                "pattern": self.pattern,
                "poke_interval": self.poke_interval,
                "since_us": self.since_us,
                "remember": self.remember,
            },
        )

    @property
    def watermark_us(self) -> int | None:
        """The newest change seen so far (the ``since_us`` of the next poll)."""
        return self._since

    async def poll(self) -> list[TriggerEvent]:
        """One look at the core: the events of the delivered batches not fired for yet, oldest
        first (remembered as fired). Raises :class:`ForteApiError` when the API does not answer."""
        if self._client is None:
            self._client = await ForteAsyncClient.for_connection(self.forte_conn_id)
        client = self._client
        if self._since is None:
            # From now on, the core's clock: the newest delivered batch now, and those of
            # the same instant, are not new.
            newest = await client.batches(role="core", state="delivered", site=self.site, pattern=self.pattern, limit=1)
            self._since = int(newest[0].get("updated_us") or 0) if newest else 0
            for batch in await client.delivered_since(self._from(), self.site, self.pattern) if newest else []:
                self._remember(batch)
            self.log.info("forte arrivals (%s): watching from since_us=%d", self._what(), self._since)
            return []
        events = []
        for batch in await client.delivered_since(self._from(), self.site, self.pattern):
            updated = int(batch.get("updated_us") or 0)
            self._since = max(self._since, updated)
            key = str(batch.get("key"))
            if key in self._fired:
                continue
            # The API filtered already; a server without `site`/`pattern` would not have.
            if b.select([batch], None, site=self.site, pattern=self.pattern or "*") is None:
                continue
            self._remember(batch)
            summary = b.summary(batch) or {}
            summary["updated_us"] = updated
            uri = a.batch_uri(str(batch.get("name")), str(batch.get("site") or "*"))
            events.append(TriggerEvent({"status": "delivered", "batch": summary, "uri": uri}))
        return events

    def _from(self) -> int:
        """Where the next poll starts: a little before the newest change seen, in case a
        batch's change was committed after a later one's (its key tells it was fired for)."""
        assert self._since is not None
        return max(self.since_us or 0, self._since - LOOKBACK_US, 0)

    def _remember(self, batch: dict[str, Any]) -> None:
        self._fired[str(batch.get("key"))] = int(batch.get("updated_us") or 0)
        self._fired.move_to_end(str(batch.get("key")))
        while len(self._fired) > self.remember:
            self._fired.popitem(last=False)

    def _what(self) -> str:
        return f"site {self.site or '*'}, pattern {self.pattern or '*'}, {self.forte_conn_id}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                for event in await self.poll():
                    self.log.info("forte arrivals (%s): %s", self._what(), event.payload)
                    yield event
            except ForteApiError as e:
                self.log.warning("forte arrivals (%s): %s (asking again)", self._what(), e)
            except Exception as e:  # a missing connection: it may be added later
                self._client = None
                self.log.warning("forte arrivals (%s): %r (asking again)", self._what(), e)
            await asyncio.sleep(self.poke_interval)
