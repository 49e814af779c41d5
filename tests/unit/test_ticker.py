"""Each run's periodic pass (operator/atlas_operator/ticker.py): every interval per run, its first at its own point of
the interval, never two of one run at once, the latest copy of the run, and none after its deletion."""

from __future__ import annotations

import asyncio
import time

from atlas_operator.ticker import RunTicker, first_delay

INTERVAL = 0.2


def body(name: str, version: str) -> dict:
    meta = {"name": name, "namespace": "ns", "resourceVersion": version, "managedFields": [{"manager": "kopf"}]}
    return {"kind": "AtlasTraining", "metadata": meta}


def test_first_ticks_are_spread_over_the_interval():
    delays = [first_delay(10.0) for _ in range(200)]
    assert all(5.0 <= d <= 15.0 for d in delays)
    assert len({int(d) for d in delays}) >= 8  # spread, not bunched in one second


def test_each_run_ticks_every_interval_with_its_latest_copy_until_deleted():
    async def scenario() -> tuple[dict[str, list], list[dict]]:
        ticks: dict[str, list] = {"a": [], "b": []}
        seen: list[dict] = []

        async def tick(run: dict) -> None:
            ticks[run["metadata"]["name"]].append(time.monotonic())
            seen.append(run)
            await asyncio.sleep(INTERVAL * 1.5 if run["metadata"]["name"] == "b" else 0)  # b's pass outlasts a tick

        ticker = RunTicker(INTERVAL, tick, limit=4)
        task = asyncio.get_running_loop().create_task(ticker.run_forever())
        ticker.seen(("AtlasTraining", "ns", "a"), None, body("a", "1"))
        ticker.seen(("AtlasTraining", "ns", "b"), "ADDED", body("b", "1"))
        await asyncio.sleep(INTERVAL * 2)
        ticker.seen(("AtlasTraining", "ns", "a"), "MODIFIED", body("a", "2"))
        await asyncio.sleep(INTERVAL * 3)
        ticker.seen(("AtlasTraining", "ns", "a"), "DELETED", body("a", "3"))
        deleted_at = len(ticks["a"])
        await asyncio.sleep(INTERVAL * 3)
        task.cancel()
        ticks["a deleted at"] = [deleted_at]
        return ticks, seen

    ticks, seen = asyncio.run(scenario())
    a = ticks["a"]
    assert 4 <= len(a) <= 7, a  # about one per interval over ~5 intervals (the first after 0.5-1.5 of one)
    gaps = [later - earlier for earlier, later in zip(a, a[1:], strict=False)]
    assert all(gap >= INTERVAL * 0.9 for gap in gaps), gaps
    assert len(a) == ticks["a deleted at"][0]  # none after its DELETED event
    versions = [run["metadata"]["resourceVersion"] for run in seen if run["metadata"]["name"] == "a"]
    assert versions == sorted(versions) and versions[-1] == "2"  # the latest copy, from its MODIFIED on
    assert all("managedFields" not in run["metadata"] for run in seen)
    b = ticks["b"]
    assert all(later - earlier >= INTERVAL * 1.5 for earlier, later in zip(b, b[1:], strict=False)), b  # no overlap


def test_a_run_made_again_before_its_deleted_namesakes_tick_keeps_one_tick_per_interval():
    async def scenario() -> list[float]:
        ticks: list[float] = []

        async def tick(run: dict) -> None:
            ticks.append(time.monotonic())

        ticker = RunTicker(INTERVAL, tick, limit=4)
        task = asyncio.get_running_loop().create_task(ticker.run_forever())
        run = ("AtlasTraining", "ns", "again")
        ticker.seen(run, "ADDED", body("again", "1"))
        ticker.seen(run, "DELETED", body("again", "1"))
        ticker.seen(run, "ADDED", body("again", "2"))  # the first one's heap entry is still due
        await asyncio.sleep(INTERVAL * 5)
        task.cancel()
        return ticks

    ticks = asyncio.run(scenario())
    assert 3 <= len(ticks) <= 5, ticks
    assert all(later - earlier >= INTERVAL * 0.9 for earlier, later in zip(ticks, ticks[1:], strict=False)), ticks
