"""ForteSendOperator: sends a directory as a batch through a running ``forte send --watch``."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

from airflow.exceptions import AirflowException
from airflow.sdk import BaseOperator

from airflow_provider_forte import assets as a
from airflow_provider_forte import batches as b
from airflow_provider_forte.hooks.forte import ForteApiError, ForteHook
from airflow_provider_forte.triggers.forte import ForteBatchDeliveredTrigger

# What forte's inbox watcher reads as "this batch is complete" (crates/forte/src/edge/inbox.rs).
READY_MARKER = ".ready"


def check_batch_name(name: str) -> str:
    """A batch name forte's inbox takes: one directory name, not hidden (the watcher skips
    hidden directories: they are where tools write before renaming a batch into place)."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise AirflowException(f"{name!r} is not a batch name: it must be one directory name")
    if name.startswith("."):
        raise AirflowException(f"{name!r} is not a batch name: forte's inbox skips hidden directories")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise AirflowException(f"{name!r} is not a batch name: forte's batch names are UTF-8") from e
    return name


def _seconds(value: timedelta | float | int) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class ForteSendOperator(BaseOperator):
    """Sends the directory ``source`` as the batch ``batch_name`` through the inbox of a running
    ``forte send --watch`` daemon, and waits until the core has it.

    1. Refuses a batch name that is already in the inbox or already known to the edge (forte
       identifies a batch by its name: files under a name it has sent are a follow-up to that
       batch, not a new one).
    2. Copies ``source`` into a hidden directory of the inbox (which the watcher skips), writes
       the ready marker ``.ready`` in it last (with ``priority`` in it if given, for
       ``--policy priority``), and renames it to ``inbox/<batch_name>``: on one file system the
       batch appears whole and marked in one step, so the watcher never sees part of it.
    3. Waits through the edge's API (``edge_conn_id``) until the edge's batch is ``sent`` (at
       the relay, offered to the core) or later (``source_deleted``, ``source_kept``). A batch the
       edge records ``failed`` (or ``cancelled``) fails the task with forte's error text.
    4. With ``wait_for_delivery``, waits through the core's API (``core_conn_id``) until the
       core's batch is ``delivered``, in the triggerer when ``deferrable``; ``failed`` fails the
       task with forte's error text.

    Returns (XCom) ``batch_name``, ``site``, ``edge_key``, ``core_key``, ``files``, ``bytes``
    (raw, at the edge), ``sealed_bytes`` (at the core), ``uri`` and ``delivered``; emits an
    event for each forte Asset in ``outlets`` (by default ``forte_batch_asset()``: any batch)
    and, through the alias ``FORTE_BATCHES``, for the batch's own Asset ``forte://SITE/NAME``.

    :param source: the directory to send (a single file is sent as a batch holding it).
    :param batch_name: the batch's name (templated); default: the source's name.
    :param inbox: the inbox directory the ``forte send --watch`` daemon watches.
    :param edge_conn_id: a ``forte`` connection to that daemon's ``--http``.
    :param core_conn_id: a ``forte`` connection to the core's ``forte pull --watch --http``
        (needed with ``wait_for_delivery``).
    :param wait_for_delivery: wait until the core has delivered the batch.
    :param deferrable: wait for the delivery in the triggerer, freeing the worker slot.
    :param poke_interval: seconds between two looks at the API.
    :param timeout: seconds (or a timedelta) to wait for the edge and the core together.
    :param site: the site in the batch's Asset URI when it is not waited for at the core
        (which names it); default: the edge connection's host.
    :param priority: written into the ready marker, for ``forte send --policy priority``.
    """

    template_fields: Sequence[str] = ("source", "batch_name", "inbox")
    ui_color = "#d7ecf7"

    def __init__(
        self,
        *,
        source: str | os.PathLike[str],
        inbox: str | os.PathLike[str],
        batch_name: str | None = None,
        edge_conn_id: str = "forte_edge",
        core_conn_id: str | None = "forte_core",
        wait_for_delivery: bool = True,
        deferrable: bool = False,
        poke_interval: float = 5.0,
        timeout: timedelta | float = timedelta(hours=6),
        site: str | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.source = os.fspath(source)
        self.inbox = os.fspath(inbox)
        self.batch_name = batch_name
        self.edge_conn_id = edge_conn_id
        self.core_conn_id = core_conn_id
        self.wait_for_delivery = wait_for_delivery
        self.deferrable = deferrable
        self.poke_interval = poke_interval
        self.timeout = _seconds(timeout)
        self.site = site
        self.priority = priority
        if wait_for_delivery and not core_conn_id:
            raise ValueError("wait_for_delivery needs core_conn_id")
        outlets = list(self.outlets or [])
        if not any(a.is_forte_asset(o) for o in outlets):
            outlets.append(a.forte_batch_asset())
        if a.FORTE_BATCHES not in outlets:
            outlets.append(a.FORTE_BATCHES)
        self.outlets = outlets

    # Sending.

    def execute(self, context: Any) -> dict[str, Any]:
        name = check_batch_name(self.batch_name or Path(self.source.rstrip("/")).name)
        for asset in self._forte_outlets():
            if not a.name_matches(asset, name):
                raise AirflowException(
                    f"batch {name!r} does not match the outlet {asset.uri}: a DAG scheduled on it would "
                    "be told of a batch it did not ask for; name the batch to match or change the outlet"
                )
        started = time.monotonic()
        edge = ForteHook(self.edge_conn_id)
        inbox = Path(self.inbox)
        target = inbox / name
        if not inbox.is_dir():
            raise AirflowException(f"inbox {inbox} is not a directory: give the directory `forte send --watch` watches")
        if os.path.lexists(target):
            raise AirflowException(f"batch {name!r} already exists in the inbox ({target}): choose another batch_name")
        known = edge.find_batch(name, role="edge")
        if known is not None:
            raise AirflowException(
                f"batch {name!r} is already known to the edge ({edge.base_url}: key {known['key']}, "
                f"state {known['state']}): forte would take these files as a follow-up to it; choose another batch_name"
            )
        self._place(Path(self.source), inbox, name)
        self.log.info("batch %r placed in %s; waiting for the edge (%s) to send it", name, inbox, edge.base_url)

        deadline = started + self.timeout
        sent = self._wait(edge, name, "edge", None, deadline)
        result = self._sent(name, sent)
        self.log.info("edge: batch %r is %s (key %s, %s files, %s bytes)", name, sent["state"], sent["key"], sent.get("files"), sent.get("bytes"))
        if not self.wait_for_delivery:
            return self._finish(context, result, None, edge)
        if self.deferrable:
            remaining = max(deadline - time.monotonic(), 1.0)
            self.defer(
                trigger=ForteBatchDeliveredTrigger(
                    batch_name=name,
                    forte_conn_id=str(self.core_conn_id),
                    edge_key=sent["key"],
                    poke_interval=self.poke_interval,
                    deadline=time.time() + remaining,
                ),
                method_name="execute_complete",
                kwargs={"result": result},
                timeout=timedelta(seconds=remaining + 60),
            )
        core = ForteHook(str(self.core_conn_id))
        delivered = self._wait(core, name, "core", sent["key"], deadline)
        return self._finish(context, result, delivered, edge)

    def execute_complete(self, context: Any, event: dict[str, Any], result: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resumes after :class:`ForteBatchDeliveredTrigger` fired."""
        status = event.get("status")
        batch = event.get("batch") or {}
        name = result["batch_name"] if result else batch.get("name")
        self.log.info("forte: resumed by ForteBatchDeliveredTrigger: %s", event)
        if status == "delivered":
            edge = ForteHook(self.edge_conn_id)
            if result is None:
                # The triggerer hands back what execute() deferred with, beside the event;
                # dag.test() (Airflow 3.1) hands back the event only: the edge still knows.
                sent = edge.find_batch(batch["name"], role="edge")
                if sent is None:
                    raise AirflowException(f"forte: batch {batch['name']!r} was delivered, but the edge ({edge.base_url}) no longer lists it")
                result = self._sent(batch["name"], sent)
            return self._finish(context, result, batch, edge)
        if status == "failed":
            key = (event.get("batch") or {}).get("key")
            raise AirflowException(f"forte: batch {name!r} failed at the core ({key}): {event.get('error')}")
        raise AirflowException(f"forte: batch {name!r}: {event.get('error') or event}")

    def _sent(self, name: str, sent: dict[str, Any]) -> dict[str, Any]:
        """The result, as far as the edge's batch ``sent`` tells it."""
        return {
            "batch_name": name,
            "site": self.site,
            "edge_key": sent["key"],
            "core_key": None,
            "files": sent.get("files"),
            "bytes": sent.get("bytes"),
            "sealed_bytes": None,
            "uri": None,
            "delivered": False,
        }

    def _place(self, source: Path, inbox: Path, name: str) -> None:
        """Copies ``source`` into a hidden directory of the inbox, writes the ready marker last,
        and renames the whole into place."""
        if not source.exists():
            raise AirflowException(f"source {source} does not exist")
        tmp = Path(tempfile.mkdtemp(prefix=f".airflow-{name}.", dir=inbox))
        try:
            batch = tmp / "batch"
            if source.is_dir():
                # Links stay links: forte refuses them, as it would had they been in its inbox.
                shutil.copytree(source, batch, symlinks=True)
            else:
                batch.mkdir()
                shutil.copy2(source, batch / source.name)
            marker = batch / READY_MARKER
            if os.path.lexists(marker):
                raise AirflowException(f"source {source} holds a {READY_MARKER} file, which is forte's ready marker")
            marker.write_text("" if self.priority is None else f"{self.priority}\n")
            if os.path.lexists(inbox / name):
                raise AirflowException(f"batch {name!r} appeared in the inbox while it was being copied: not replaced")
            # rename(2) is atomic on one file system, and the temporary directory is in the inbox.
            os.rename(batch, inbox / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _wait(self, hook: ForteHook, name: str, role: str, edge_key: str | None, deadline: float) -> dict[str, Any]:
        """Polls until the batch of ``role`` is done; raises with forte's error text when it
        failed, or when ``deadline`` (monotonic) passes."""
        goal = "sent" if role == "edge" else "delivered"
        last = "not recorded yet"
        while True:
            try:
                batch = hook.find_batch(name, role=role, edge_key=edge_key)
                outcome = b.outcome(batch, role)
                if outcome == b.DONE:
                    assert batch is not None
                    return batch
                if outcome == b.FAILED_:
                    assert batch is not None
                    where = "at the edge" if role == "edge" else "at the core"
                    raise AirflowException(
                        f"forte: batch {name!r} failed {where} ({batch['key']}): {hook.failure_text(batch)}"
                    )
                if batch is not None:
                    last = f"{batch.get('state')}, {batch.get('progress') or 0:.0%} done"
                    if batch.get("eta_s") is not None:
                        last += f", about {batch['eta_s']:.0f} s left"
                self.log.info("%s: batch %r %s", role, name, last)
            except ForteApiError as e:
                if not e.transient:
                    raise
                last = str(e)
                self.log.warning("%s: %s (asking again)", role, e)
            if time.monotonic() >= deadline:
                raise AirflowException(f"forte: batch {name!r} not {goal} at the {role} within {self.timeout:.0f} s; last seen: {last}")
            time.sleep(self.poke_interval)

    def _finish(self, context: Any, result: dict[str, Any], core: dict[str, Any] | None, edge: ForteHook) -> dict[str, Any]:
        """Completes the result with the core's batch and emits the Asset events."""
        if core is not None:
            result = {
                **result,
                "site": result["site"] or core.get("site") or None,
                "core_key": core["key"],
                "sealed_bytes": core.get("bytes"),
                "delivered": True,
            }
        site = result["site"] or _host_of(edge)
        result["site"] = site
        result["uri"] = a.batch_uri(result["batch_name"], site)
        extra = {k: result[k] for k in ("batch_name", "site", "edge_key", "core_key", "files", "bytes", "uri", "delivered")}
        events = context["outlet_events"]
        for asset in self._forte_outlets():
            if not a.site_matches(asset, site):
                raise AirflowException(f"batch {result['batch_name']!r} came from site {site!r}, which does not match the outlet {asset.uri}")
            events[asset].extra.update(extra)
        events[a.FORTE_BATCHES].add(a.forte_batch_asset(result["batch_name"], site), extra=extra)
        self.log.info("forte: batch %r done: %s", result["batch_name"], result)
        return result

    def _forte_outlets(self) -> list[Any]:
        return [o for o in self.outlets if a.is_forte_asset(o)]


def _host_of(hook: ForteHook) -> str:
    try:
        return hook.get_connection(hook.forte_conn_id).host or "edge"
    except Exception:
        return "edge"
