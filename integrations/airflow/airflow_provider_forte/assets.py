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
from urllib.parse import quote, unquote, urlsplit

from airflow.sdk import Asset, AssetAlias

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
