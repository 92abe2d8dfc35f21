"""What a batch's state means to a task waiting on it (docs/api.md's batch states), shared by
the operator, the sensor and the trigger."""

from __future__ import annotations

import re
from typing import Any

# At the edge, a batch is at the relay (sealed, offered to the core) from `sent` on; once the
# core acknowledged it, the edge deletes its source (`source_deleted`) or keeps what it could
# not delete (`source_kept`).
EDGE_DONE = frozenset({"sent", "source_deleted", "source_kept"})
# At the core, `delivered`: every file verified and in place (acknowledged right after).
CORE_DONE = frozenset({"delivered"})
# Ended without getting there. forte retries a failed batch at its next scan; a cancelled one
# (`forte send --cancel`) stays cancelled until its ready marker is touched again.
FAILED = frozenset({"failed", "cancelled"})

PENDING, DONE, FAILED_ = "pending", "done", "failed"

# /api/v1/batches answers at most `limit` batches: 200 unless asked, at most 10 000.
DEFAULT_LIMIT, MAX_LIMIT = 200, 10_000


def outcome(batch: dict[str, Any] | None, role: str) -> str:
    """``pending``, ``done`` or ``failed`` for a batch of ``role`` (None: not recorded yet)."""
    if batch is None:
        return PENDING
    state = batch.get("state")
    if state in FAILED:
        return FAILED_
    if state in (EDGE_DONE if role == "edge" else CORE_DONE):
        return DONE
    return PENDING


def select(
    batches: list[dict[str, Any]],
    name: str | None,
    edge_key: str | None = None,
    site: str | None = None,
    pattern: str | None = None,
) -> dict[str, Any] | None:
    """The newest of ``batches`` named exactly ``name`` (the API's ``name`` parameter matches
    names that *contain* it), or whose key is ``edge_key`` or ``SITE/edge_key``; of ``site``
    only (exactly) and, with ``pattern``, only those whose whole name matches it (``*``, ``?``,
    whatever the case, as the API's ``pattern``). ``name`` None: any name."""

    def matches(batch: dict[str, Any]) -> bool:
        if site is not None and batch.get("site") != site:
            return False
        if pattern is not None and not name_matches(str(batch.get("name", "")), pattern):
            return False
        if name is None or batch.get("name") == name:
            return True
        key = str(batch.get("key", ""))
        return bool(edge_key) and (key == edge_key or key.endswith("/" + str(edge_key)))

    found = [x for x in batches if matches(x)]
    if not found:
        return None
    return max(found, key=lambda x: (x.get("updated_us") or 0, x.get("arrived_us") or 0))


def name_matches(name: str, pattern: str) -> bool:
    """The API's ``pattern``: the whole name, ``*`` any text, ``?`` one character, whatever
    the case (``[`` is itself)."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, re.IGNORECASE | re.DOTALL) is not None


def failure_text(batch: dict[str, Any], detail: dict[str, Any] | None) -> str:
    """forte's error text for a failed batch: its ``error`` field, else the errors of its
    failures (newest first, each once)."""
    if batch.get("error"):
        return str(batch["error"])
    errors: list[str] = []
    for failure in (detail or {}).get("failures") or []:
        error = failure.get("error")
        if error and error not in errors:
            errors.append(str(error))
    if errors:
        return "; ".join(errors)
    return f"forte recorded no error text (state {batch.get('state')!r})"


def summary(batch: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fields of a batch a task returns (small enough for XCom)."""
    if batch is None:
        return None
    keep = ("key", "role", "site", "name", "state", "files", "bytes", "arrived_us", "started_us", "ended_us")
    return {k: batch.get(k) for k in keep}
