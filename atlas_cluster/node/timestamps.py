"""Timestamps as the API writes them (RFC 3339 in UTC; microseconds where the field is a MicroTime)."""

from __future__ import annotations

import datetime as dt


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
