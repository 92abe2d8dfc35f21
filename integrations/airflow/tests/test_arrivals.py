"""Batches that arrive from the sites by themselves: a relay, two sites' ``forte send --watch``
daemons (site-a and site-b, each with its own inbox and relay token) and a ``forte pull --watch``
core on loopback (forte_site.py), no ``ForteSendOperator``: a batch is put into an inbox as an
instrument would put it.

- The Asset watched by ``ForteBatchArrivalTrigger`` (example_dags/forte_on_arrival.py): the DAG
  is synced to Airflow's database as the DAG processor would (its watcher becomes a trigger row
  tied to the Asset), the trigger is built from that row as the triggerer builds it and driven
  until it yields the event of site-b's batch, the event is submitted as the triggerer submits it
  (an Asset event, a queued run of the DAG), and the DAG runs under ``dag.test()`` as the run the
  scheduler creates for those events (``asset_triggered``, the events consumed).
- The same with Airflow's own triggerer process (``airflow triggerer``) running the watcher.
- Two sites send a batch of the same name: the hook, the sensor (poking and deferred) and the
  triggers given ``site="site-a"`` take site-a's only; ``pattern`` matches whole names.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import GET_OR_CREATE_DAGRUN, load_example, sync_to_db
from forte_site import SITE, Site, incompressible, place, tree
from test_example_dags import asset_events, place_once_running, queued_runs, run, xcom

POKE = "0.5"
SITE_B = "site-b"


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    site = Site(tmp_path_factory.mktemp("sites"), more_sites=(SITE_B,))
    yield site
    site.stop()


def connect(monkeypatch, site: Site) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_FORTE_CORE", site.conn_env(site.core_addr))
    monkeypatch.setenv("AIRFLOW_CONN_FORTE_EDGE", site.conn_env(site.edge_addr))


def wait_until(condition, what: str, site: Site, seconds: float = 120) -> Any:
    """Polls ``condition`` until it returns something true; fails naming ``what`` after
    ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds:.0f} s\n{site.all_logs()}")
        time.sleep(0.1)


def delivered(site_name: str, name: str):
    from airflow_provider_forte.hooks.forte import ForteHook

    def check():
        batch = ForteHook("forte_core").find_batch(name, role="core", site=site_name)
        return batch if batch and batch["state"] == "delivered" else None

    return check


def watch(dag, uri: str) -> list[tuple[int, Any]]:
    """Syncs the DAG as the DAG processor does; the triggers of its Asset ``uri``. Airflow 3.0
    ties an Asset's watchers to it only once the scheduler has activated the Asset (its orphanage
    pass), at the next parse; 3.1 at the first."""
    sync_to_db(dag)
    if not watcher_triggers(uri):
        from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
        from airflow.models.asset import AssetModel
        from airflow.utils.session import create_session

        with create_session() as session:
            asset = session.query(AssetModel).filter(AssetModel.uri == uri).one()
            SchedulerJobRunner._activate_referenced_assets([asset], session=session)
        sync_to_db(dag)
    return watcher_triggers(uri)


def watcher_triggers(uri: str) -> list[tuple[int, Any]]:
    """The triggers of the Asset ``uri``, each built from its row as the triggerer builds it
    (class path and keyword arguments)."""
    from airflow.models.asset import AssetModel
    from airflow.utils.module_loading import import_string
    from airflow.utils.session import create_session

    with create_session() as session:
        asset = session.query(AssetModel).filter(AssetModel.uri == uri).one()
        return [(t.id, import_string(t.classpath)(**t.kwargs)) for t in asset.triggers]


def asset_triggered_run(*, dag, session, **_):
    """The run the scheduler creates for a DAG whose Asset events are queued
    (SchedulerJobRunner._create_dag_runs_asset_triggered, Airflow 3.0 and 3.1): ``asset_triggered``, no
    logical date, the Asset events of the DAG's schedule consumed, its queue emptied; RUNNING
    here, as ``dag.test()`` runs it at once."""
    from airflow.models.asset import AssetDagRunQueue, AssetEvent, DagScheduleAssetReference
    from airflow.models.dagrun import DagRun
    from airflow.utils import timezone
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import delete, select

    events = session.scalars(
        select(AssetEvent)
        .where(
            AssetEvent.asset_id.in_(
                select(DagScheduleAssetReference.asset_id).where(DagScheduleAssetReference.dag_id == dag.dag_id)
            )
        )
        .order_by(AssetEvent.timestamp.asc(), AssetEvent.id.asc())
    ).all()
    assert events, "no Asset event to run for"
    triggered = max(e.timestamp for e in events)
    dagrun = dag.create_dagrun(
        run_id=DagRun.generate_run_id(run_type=DagRunType.ASSET_TRIGGERED, logical_date=None, run_after=triggered),
        logical_date=None,
        data_interval=None,
        run_after=triggered,
        run_type=DagRunType.ASSET_TRIGGERED,
        triggered_by=DagRunTriggeredByType.ASSET,
        state=DagRunState.RUNNING,
        start_date=timezone.utcnow(),
        session=session,
    )
    dagrun.consumed_asset_events.extend(events)
    session.execute(delete(AssetDagRunQueue).where(AssetDagRunQueue.target_dag_id == dag.dag_id))
    session.commit()
    return dagrun


def test_an_asset_watched_at_the_core_runs_its_dag_when_a_site_daemon_delivers(sites, tmp_path, monkeypatch):
    from airflow.models.trigger import Trigger
    from airflow_provider_forte.triggers.forte import ForteBatchArrivalTrigger

    connect(monkeypatch, sites)
    # An older batch of site-b, delivered before the watch starts: not an arrival.
    place(sites.inboxes[SITE_B], "before-watch", {"x.txt": b"old\n"})
    wait_until(delivered(SITE_B, "before-watch"), "site-b's batch before-watch delivered", sites)

    dag = load_example("forte_on_arrival", FORTE_EXAMPLE_SITE=SITE_B, FORTE_EXAMPLE_POKE_INTERVAL=POKE)
    asset = dag.timetable.asset_condition
    assert asset.uri == f"forte://{SITE_B}/*?delivered=forte_core", asset.uri
    triggers = watch(dag, asset.uri)
    assert len(triggers) == 1, triggers
    trigger_id, trigger = triggers[0]
    assert isinstance(trigger, ForteBatchArrivalTrigger)
    assert (trigger.site, trigger.pattern, trigger.poke_interval) == (SITE_B, None, float(POKE))

    source = {"readings.csv": b"t,v\n" + b"".join(b"%d,%d\n" % (i, 3 * i) for i in range(5000)), "raw.bin": incompressible(200_000, 11)}

    async def drive() -> list:
        events = trigger.run()
        first = asyncio.ensure_future(events.__anext__())
        # Once the trigger watches (its first poll done), a site-a batch (another site: not
        # this Asset's) and then site-b's batch arrive through the sites' own daemons.
        deadline = time.monotonic() + 30
        while trigger.watermark_us is None:
            assert not first.done(), first
            assert time.monotonic() < deadline, "the trigger made no first poll"
            await asyncio.sleep(0.05)
        place(sites.inboxes[SITE], "from-a", {"a.txt": b"site a\n"})
        place(sites.inboxes[SITE_B], "shift-1", source)
        event = await asyncio.wait_for(first, timeout=180)
        await events.aclose()
        return [event, *(await trigger.poll())]

    got = asyncio.run(drive())
    assert len(got) == 1, got  # polled once more: nothing new, nothing twice
    event = got[0]
    assert event.payload["status"] == "delivered", event
    batch = event.payload["batch"]
    assert (batch["site"], batch["name"], batch["state"]) == (SITE_B, "shift-1", "delivered"), batch
    assert event.payload["uri"] == f"forte://{SITE_B}/shift-1"
    assert tree(sites.dest / SITE_B / "shift-1") == source

    # As the triggerer: the event becomes an Asset event and queues a run of the DAG.
    Trigger.submit_event(trigger_id, event)
    events = asset_events(asset.uri)
    assert [e["payload"]["batch"]["key"] for e in events] == [batch["key"]], events
    assert events[0]["from_trigger"] is True
    assert queued_runs("forte_on_arrival") == 1

    # The run the scheduler would start for it, under dag.test().
    monkeypatch.setattr(GET_OR_CREATE_DAGRUN, asset_triggered_run)
    states, errors, dagrun = run(dag, {})
    assert errors == {} and states == {"arrived": "success"}, f"{states} {errors}\n{sites.all_logs()}"
    assert str(dagrun.run_type) in ("asset_triggered", "DagRunType.ASSET_TRIGGERED"), dagrun.run_type
    arrived = xcom(dagrun, "arrived")
    assert [(x["batch_name"], x["site"], x["core_key"], x["source"]) for x in arrived] == [
        ("shift-1", SITE_B, batch["key"], "trigger")
    ], arrived
    assert queued_runs("forte_on_arrival") == 0

    # A trigger started again from the same arguments (a restarted triggerer) does not fire
    # again for what was delivered before it started.
    again = ForteBatchArrivalTrigger(**trigger.serialize()[1])
    assert asyncio.run(_polls(again, 2)) == []


async def _polls(trigger, n: int) -> list:
    out = []
    for _ in range(n):
        out += await trigger.poll()
    return out


def test_a_site_a_sensor_and_trigger_ignore_site_b_batch_of_the_same_name(sites, tmp_path, monkeypatch):
    from airflow_provider_forte.hooks.forte import ForteHook
    from airflow_provider_forte.sensors.forte import ForteBatchDeliveredSensor
    from airflow_provider_forte.triggers.forte import ForteBatchArrivalTrigger, ForteBatchDeliveredTrigger

    connect(monkeypatch, sites)
    core = ForteHook("forte_core")
    name = "Same-Name-7"
    b_files = {"from.txt": b"site b\n"}
    place(sites.inboxes[SITE_B], name, b_files)
    b_batch = wait_until(delivered(SITE_B, name), f"site-b's {name} delivered", sites)
    assert b_batch["key"].startswith(f"{SITE_B}/")

    # Only site-b's exists: the hook, a poke and the trigger for site-a see none.
    assert core.find_batch(name, role="core")["key"] == b_batch["key"]
    assert core.find_batch(name, role="core", site=SITE) is None
    sensor = ForteBatchDeliveredSensor(task_id="a", batch_name=name, site=SITE, core_conn_id="forte_core")
    assert sensor.poke({}) is False
    assert ForteBatchDeliveredSensor(task_id="b", batch_name=name, site=SITE_B).poke({}).xcom_value["key"] == b_batch["key"]

    async def pending_trigger() -> list:
        trigger = ForteBatchDeliveredTrigger(batch_name=name, forte_conn_id="forte_core", site=SITE, poke_interval=0.2, deadline=time.time() + 1.5)
        return [e async for e in trigger.run()]

    timed_out = asyncio.run(pending_trigger())
    assert [e.payload["status"] for e in timed_out] == ["timeout"], timed_out

    # The sensor of the example DAG for site-a, deferred: site-a's batch of the same name is
    # put into site-a's inbox once the sensor runs; it fires for that one.
    sensor_dag = load_example(
        "forte_wait_for_batch", FORTE_EXAMPLE_POKE_INTERVAL=POKE, FORTE_EXAMPLE_DEFERRABLE="1", FORTE_EXAMPLE_TIMEOUT="180"
    )
    a_source = tmp_path / "a"
    a_source.mkdir()
    (a_source / "from.txt").write_bytes(b"site a, the same name\n")
    placing = place_once_running(sites, a_source, name, "forte_wait_for_batch", "delivered")
    states, errors, dagrun = run(sensor_dag, {"batch_name": name, "site": SITE, "pattern": ""})
    placing.join()
    assert errors == {} and set(states.values()) == {"success"}, f"{states} {errors}\n{sites.all_logs()}"
    got = xcom(dagrun, "delivered")
    assert got["site"] == SITE and got["name"] == name and got["key"].startswith(f"{SITE}/"), got
    assert got["key"] != b_batch["key"]
    assert tree(sites.dest / SITE / name) == tree(a_source)
    assert tree(sites.dest / SITE_B / name) == b_files

    # The pattern, whatever the case, with the site: each site's own.
    assert core.find_batch(pattern="same-*-?", role="core", site=SITE_B)["key"] == b_batch["key"]
    assert core.find_batch(pattern="SAME-NAME-*", role="core", site=SITE)["key"] == got["key"]
    assert core.find_batch(pattern="same-*-??", role="core") is None
    b_sensor = ForteBatchDeliveredSensor(task_id="p", pattern="same-name-*", site=SITE_B)
    assert b_sensor.poke({}).xcom_value["key"] == b_batch["key"]

    # The arrival trigger from the start: each site's trigger fires for its own batch only,
    # once; with the pattern, only the batches it matches.
    async def fired(**kwargs) -> list[str]:
        trigger = ForteBatchArrivalTrigger(forte_conn_id="forte_core", since_us=1, **kwargs)
        first = [e.payload["batch"]["key"] for e in await trigger.poll()]
        assert await trigger.poll() == []
        return first

    assert asyncio.run(fired(site=SITE, pattern="same-name-?")) == [got["key"]]
    assert asyncio.run(fired(site=SITE_B, pattern="same-name-?")) == [b_batch["key"]]
    both = asyncio.run(fired(pattern="same-name-7"))
    assert sorted(both) == sorted([got["key"], b_batch["key"]]), both
    assert b_batch["key"] not in asyncio.run(fired(site=SITE))


def test_the_triggerer_itself_records_the_asset_event(sites, tmp_path, monkeypatch):
    """The same path with Airflow's own triggerer (``airflow triggerer``, a process of its own):
    it loads the watcher's trigger from its row, runs it, and records the Asset event and the
    queued run of the DAG when site-a's daemon has delivered a batch matching the pattern."""
    import os
    import subprocess
    import sys

    from airflow_provider_forte.hooks.forte import ForteHook

    connect(monkeypatch, sites)
    core = ForteHook("forte_core")
    newest = core.batches(role="core", limit=1)
    since = (newest[0]["updated_us"] if newest else 0) + 1
    dag = load_example(
        "forte_on_arrival",
        FORTE_EXAMPLE_SITE=SITE,
        FORTE_EXAMPLE_PATTERN="RUN-????",
        FORTE_EXAMPLE_POKE_INTERVAL=POKE,
        FORTE_EXAMPLE_SINCE_US=str(since),
    )
    asset = dag.timetable.asset_condition
    (trigger_id, trigger), = watch(dag, asset.uri)
    assert (trigger.site, trigger.pattern, trigger.since_us) == (SITE, "RUN-????", since)
    queued_before = queued_runs("forte_on_arrival")

    log = tmp_path / "triggerer.log"
    with open(log, "wb") as out:
        triggerer = subprocess.Popen(
            [sys.executable, "-m", "airflow", "triggerer"], stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
    try:
        # A batch of site-a not matching the pattern, delivered first, then one that does: the
        # trigger fires for batches oldest first, so it would have fired for the first before.
        place(sites.inboxes[SITE], "run-12345", {"n.txt": b"five digits: not run-????\n"})
        wait_until(delivered(SITE, "run-12345"), "run-12345 delivered", sites)
        place(sites.inboxes[SITE], "run-0042", {"m.txt": b"matches\n"})

        def recorded():
            assert triggerer.poll() is None, f"the triggerer stopped ({triggerer.returncode}):\n{log.read_text()[-5000:]}"
            return asset_events(asset.uri)

        events = wait_until(recorded, "the triggerer's Asset event", sites, seconds=180)
    finally:
        triggerer.terminate()
        try:
            triggerer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            triggerer.kill()
            triggerer.wait()
    assert [(e["payload"]["batch"]["site"], e["payload"]["batch"]["name"]) for e in events] == [(SITE, "run-0042")], events
    assert events[0]["from_trigger"] is True and events[0]["payload"]["uri"] == f"forte://{SITE}/run-0042"
    assert queued_runs("forte_on_arrival") == queued_before + 1
