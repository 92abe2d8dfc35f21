"""Airflow Assets for forte's batches, so that DAGs run when a batch has arrived.

A batch is the Asset ``forte://SITE/NAME``: SITE is the edge site the core files it under (the
``site`` of its core batch, ``{site}`` in ``pull --to``'s layout), NAME the batch directory's name.

- ``forte_batch_asset("run-42", site="mine-7")`` is one batch; ``ForteSendOperator`` emits an
  event for it (through the alias :data:`FORTE_BATCHES`) when that batch is delivered, so a DAG
  scheduled on it runs then.
- ``forte_batch_asset("run-*", site="mine-7")`` or ``forte_batch_asset()`` (any batch of any
  site) is a *pattern* Asset: Airflow matches Assets by their exact URI, so a pattern Asset is
  updated only by the operators that declare it in their ``outlets``; each such operator checks
  that the batch it sends matches the pattern and emits the event with the batch in its
  ``extra`` (``batch_name``, ``site``, ``core_key``, ``edge_key``, ``files``, ``bytes``, ``uri``).
  A DAG scheduled on it reads which batch arrived from ``triggering_asset_events``. A
  ``ForteSendOperator`` without ``outlets`` declares ``forte_batch_asset()``.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from airflow.sdk import Asset, AssetAlias, AssetWatcher

SCHEME = "forte"
GROUP = "forte"

#: The alias through which :class:`~airflow_provider_forte.operators.forte.ForteSendOperator`
#: emits the event of each delivered batch's own Asset (``forte://SITE/NAME``).
FORTE_BATCHES = AssetAlias(name="forte-batches", group=GROUP)


def batch_uri(name: str, site: str = "*") -> str:
    """``forte://SITE/NAME`` (each part quoted; ``*`` and ``?`` kept for patterns)."""
    if not name or not site:
        raise ValueError("a forte batch Asset needs a batch name and a site (or patterns)")
    return f"{SCHEME}://{quote(site, safe='*?[]')}/{quote(name, safe='*?[]')}"


def forte_batch_asset(name_or_pattern: str = "*", site: str = "*") -> Asset:
    """The Asset of the batch ``name_or_pattern`` from ``site`` (shell-style patterns
    allowed in both: ``run-*``, ``mine-?``), ``forte://SITE/NAME``."""
    uri = batch_uri(name_or_pattern, site)
    return Asset(uri=uri, name=uri, group=GROUP)


def is_forte_asset(asset: object) -> bool:
    return isinstance(asset, Asset) and asset.uri.startswith(f"{SCHEME}://")


def pattern_of(asset: Asset) -> tuple[str, str]:
    """(site pattern, name pattern) of a forte Asset."""
    parts = urlsplit(asset.uri)
    return unquote(parts.netloc), unquote(parts.path.lstrip("/"))


def name_matches(asset: Asset, name: str) -> bool:
    return fnmatchcase(name, pattern_of(asset)[1])


def site_matches(asset: Asset, site: str) -> bool:
    return fnmatchcase(site, pattern_of(asset)[0])


def forte_arrivals(
    site: str = "*",
    pattern: str = "*",
    forte_conn_id: str = "forte_core",
    poke_interval: float = 30.0,
    since_us: int | None = None,
) -> Asset:
    """The Asset of the batches the core (``forte_conn_id``, its API) delivers from ``site``
    (exactly; ``*``: every site) whose whole name matches ``pattern`` (``*``, ``?``, whatever the
    case), watched by a ``ForteBatchArrivalTrigger``: a DAG with ``schedule=forte_arrivals(…)``
    runs when such a batch arrives, whoever sent it. Its URI,
    ``forte://SITE/PATTERN?delivered=CONN``, differs from :func:`forte_batch_asset`'s, so that
    ``ForteSendOperator``'s own events do not update it a second time."""
    from airflow_provider_forte.triggers.forte import ForteBatchArrivalTrigger

    if "*" in site or "?" in site:
        if site != "*":
            raise ValueError(f"site {site!r}: the core's API matches a site exactly; give one site or '*'")
    uri = f"{batch_uri(pattern, site)}?delivered={quote(forte_conn_id, safe='')}"
    trigger = ForteBatchArrivalTrigger(
        forte_conn_id=forte_conn_id,
        site=None if site == "*" else site,
        pattern=None if pattern == "*" else pattern,
        poke_interval=poke_interval,
        since_us=since_us,
    )
    return Asset(uri=uri, name=uri, group=GROUP, watchers=[AssetWatcher(name=f"forte-arrivals-{site}-{pattern}", trigger=trigger)])


def batches_of(triggering_asset_events: Any) -> list[dict[str, Any]]:
    """The batches in a run's ``triggering_asset_events``, oldest event first, whichever way
    they came: from ``ForteSendOperator`` (the event's ``extra`` is the batch: ``batch_name``,
    ``site``, ``core_key``, …) or from a ``ForteBatchArrivalTrigger`` (``extra["payload"]
    ["batch"]``: ``key``, ``site``, ``name``, …); each as ``{"batch_name", "site", "core_key",
    "files", "bytes", "uri", "source"}`` (``source``: ``operator`` or ``trigger``)."""
    out = []
    for events in (triggering_asset_events or {}).values():
        for event in events:
            extra = dict(getattr(event, "extra", None) or {})
            payload = extra.get("payload") if extra.get("from_trigger") else None
            if isinstance(payload, dict) and isinstance(payload.get("batch"), dict):
                batch = payload["batch"]
                out.append(
                    {
                        "batch_name": batch.get("name"),
                        "site": batch.get("site"),
                        "core_key": batch.get("key"),
                        "files": batch.get("files"),
                        "bytes": batch.get("bytes"),
                        "uri": payload.get("uri"),
                        "source": "trigger",
                    }
                )
            elif "batch_name" in extra:
                out.append({**{k: extra.get(k) for k in ("batch_name", "site", "core_key", "files", "bytes", "uri")}, "source": "operator"})
    return out
