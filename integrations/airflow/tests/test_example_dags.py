"""The example DAGs under ``dag.test()`` (SQLite metadata database, no scheduler) against a real
relay, sender and puller on loopback (forte_site.py): a batch sent and delivered byte for byte
with every task succeeding, the same waited for in the triggerer, and transfers that fail at the
edge and at the core failing the task with forte's own error text."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.listeners import hookimpl
from airflow.listeners.listener import get_listener_manager
from conftest import airflow_3_0, load_example, sync_to_db
from forte_site import SITE, Site, get_json, incompressible, outside_address, tree, write_batch

POKE = "0.5"


class Failures:
    """An Airflow listener: each failed task's error (the exception the task raised)."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}

    @hookimpl
    def on_task_instance_failed(self, previous_state, task_instance, error) -> None:
        self.errors[task_instance.task_id] = str(error)


def run(dag, conf: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], Any]:
    """``dag.test(run_conf=conf)``: each task's state, each failed task's error, the run."""
    if airflow_3_0():
        sync_to_db(dag)  # 3.1's dag.test() does it itself
    failures = Failures()
    listeners = get_listener_manager()
    listeners.add_listener(failures)
    try:
        dagrun = dag.test(run_conf=conf)
    finally:
        listeners.pm.unregister(failures)
    states = {ti.task_id: str(ti.state) for ti in dagrun.get_task_instances()}
    return states, failures.errors, dagrun


def xcom(dagrun, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=dagrun.dag_id, run_id=dagrun.run_id, task_id=task_id, key="return_value")
            .one()
        )
        return XComModel.deserialize_value(row)


def asset_events(uri: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).filter(AssetModel.uri == uri)
        return [dict(e.extra or {}) for e in rows]


def queued_runs(dag_id: str) -> int:
    """Asset-triggered runs of ``dag_id`` waiting for the scheduler (asset_dag_run_queue)."""
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(AssetDagRunQueue).filter(AssetDagRunQueue.target_dag_id == dag_id).count()


def sample_source(root: Path) -> Path:
    return write_batch(
        root,
        {
            "readme.txt": b"forte from Airflow\n",
            "empty.dat": b"",
            "sensors/accel-0001.bin": incompressible(300_000, 1),
            "sensors/accel-0002.bin": incompressible(2_500_000, 2),
            "sensors/log.csv": b"t,x\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(20_000)),
        },
    )


def connect(monkeypatch, site: Site) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_FORTE_EDGE", site.conn_env(site.edge_addr))
    monkeypatch.setenv("AIRFLOW_CONN_FORTE_CORE", site.conn_env(site.core_addr))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = Site(tmp_path_factory.mktemp("site"))
    yield site
    site.stop()


def assert_all_succeeded(states: dict[str, str], errors: dict[str, str], site: Site) -> None:
    assert errors == {} and set(states.values()) == {"success"}, f"{states} {errors}\n{site.all_logs()}"


def test_send_and_process_delivers_the_batch(site, tmp_path, monkeypatch):
    connect(monkeypatch, site)
    source = sample_source(tmp_path / "source")
    dag = load_example("forte_send_and_process", FORTE_EXAMPLE_POKE_INTERVAL=POKE)
    conf = {"source": str(source), "inbox": str(site.inbox), "batch_name": "run-1", "dest": str(site.dest)}
    states, errors, dagrun = run(dag, conf)
    assert_all_succeeded(states, errors, site)
    assert states.keys() == {"send", "check_delivery"}

    # Byte for byte where the core put it ({site}/{batch}/{path}).
    assert tree(site.dest / SITE / "run-1") == tree(source)
    sent = xcom(dagrun, "send")
    assert sent["batch_name"] == "run-1" and sent["delivered"] is True and sent["site"] == SITE
    assert sent["core_key"] == f"{SITE}/{sent['edge_key']}"
    assert sent["files"] == 5 and sent["bytes"] == sum(len(b) for b in tree(source).values())
    assert sent["uri"] == f"forte://{SITE}/run-1"
    assert xcom(dagrun, "check_delivery") == {"batch_name": "run-1", "files": 5, "copies_read_back": 5, "verified": True}
    # The inbox holds the batch, whole and marked, and nothing half-copied.
    assert sorted(p.name for p in site.inbox.iterdir()) == ["run-1"]
    assert (site.inbox / "run-1" / ".ready").exists()

    # The Asset events: the declared "any batch" Asset and, through the alias, the batch's own.
    for uri in ("forte://*/*", f"forte://{SITE}/run-1"):
        events = asset_events(uri)
        assert [e["batch_name"] for e in events] == ["run-1"], (uri, events)
        assert events[0]["core_key"] == sent["core_key"]
    # (forte_on_arrival is scheduled on the core's arrivals, an Asset its watcher updates
    # whoever sent the batch: test_arrivals.py.)

    # The same batch, waited for by name with the sensor: delivered already.
    sensor_dag = load_example("forte_wait_for_batch", FORTE_EXAMPLE_POKE_INTERVAL=POKE)
    states, errors, dagrun = run(sensor_dag, {"batch_name": "run-1"})
    assert_all_succeeded(states, errors, site)
    assert xcom(dagrun, "delivered")["key"] == sent["core_key"]
    assert sorted(xcom(dagrun, "list_files")) == sorted(tree(source))

    # The hook: the batch by name, its files, a file's lineage at the core.
    from airflow_provider_forte.hooks.forte import ForteHook

    core = ForteHook("forte_core")
    batch = core.find_batch("run-1", role="core")
    assert batch is not None and batch["key"] == sent["core_key"] and batch["state"] == "delivered"
    readme = next(f for f in core.batch(batch["key"])["files"] if f["path"] == "readme.txt")
    lineage = core.lineage(readme["object_id"])
    assert {"delivered", "acknowledged"} <= {e["state"] for e in lineage["events"]}, lineage
    assert ForteHook("forte_edge").find_batch("run-1", role="edge")["key"] == sent["edge_key"]

    # A batch name cannot be sent twice: the operator refuses it before copying anything.
    states, errors, _ = run(dag, conf)
    assert states["send"] == "failed" and "already exists in the inbox" in errors["send"], errors


def test_send_and_process_waits_in_the_triggerer(site, tmp_path, monkeypatch, capfd, caplog):
    connect(monkeypatch, site)
    source = sample_source(tmp_path / "source")
    dag = load_example("forte_send_and_process", FORTE_EXAMPLE_POKE_INTERVAL=POKE, FORTE_EXAMPLE_DEFERRABLE="1")
    assert dag.task_dict["send"].deferrable
    states, errors, dagrun = run(dag, {"source": str(source), "inbox": str(site.inbox), "batch_name": "run-deferred"})
    assert_all_succeeded(states, errors, site)
    assert tree(site.dest / SITE / "run-deferred") == tree(source)
    # The task deferred, dag.test() ran the trigger in line, and the task resumed from its event.
    out = "".join(capfd.readouterr()) + caplog.text
    assert "[DAG TEST] running trigger in line" in out, out[-5000:]
    assert "forte: resumed by ForteBatchDeliveredTrigger: {'status': 'delivered'" in out, out[-5000:]
    sent = xcom(dagrun, "send")
    assert sent["delivered"] and sent["core_key"] == f"{SITE}/{sent['edge_key']}" and sent["files"] == 5

    # The sensor, deferred before the batch exists: something else (here, this test) puts it
    # into the inbox once the sensor runs; the trigger sees it delivered.
    sensor_dag = load_example("forte_wait_for_batch", FORTE_EXAMPLE_POKE_INTERVAL=POKE, FORTE_EXAMPLE_DEFERRABLE="1")
    later = write_batch(tmp_path / "later", {"x.bin": incompressible(100_000, 7)})
    placing = place_once_running(site, later, "run-later", "forte_wait_for_batch", "delivered")
    states, errors, dagrun = run(sensor_dag, {"batch_name": "run-later"})
    placing.join()
    assert_all_succeeded(states, errors, site)
    assert tree(site.dest / SITE / "run-later") == tree(later)
    assert xcom(dagrun, "delivered")["name"] == "run-later"
    out = "".join(capfd.readouterr()) + caplog.text
    resumed = [line for line in out.splitlines() if "forte: resumed by ForteBatchDeliveredTrigger: {'status': 'delivered'" in line]
    assert any("'name': 'run-later'" in line for line in resumed), out[-5000:]


def place_once_running(site: Site, source: Path, name: str, dag_id: str, task_id: str) -> threading.Thread:
    """Puts ``source`` into the inbox as the batch ``name`` 1.5 s after the newest run of the
    task ``task_id`` of ``dag_id`` started (read from Airflow's database), as an instrument
    would, marked ready and renamed into place."""
    import sqlite3

    db = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///")

    def started() -> bool:
        with sqlite3.connect(db, timeout=10) as con:
            # Task instance ids are UUIDv7: the newest sorts last. Started: its process told
            # Airflow it runs (which records the host), and it has not finished; it may have
            # deferred already, and be queued again for its trigger.
            row = con.execute(
                "SELECT state, hostname FROM task_instance WHERE dag_id = ? AND task_id = ? ORDER BY id DESC LIMIT 1",
                (dag_id, task_id),
            ).fetchone()
        return bool(row and row[1] and row[0] not in ("success", "failed", "skipped", "upstream_failed"))

    def place() -> None:
        deadline = time.monotonic() + 60
        while not started() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.5)
        tmp = site.inbox / f".{name}"
        shutil.copytree(source, tmp)
        (tmp / ".ready").write_bytes(b"")
        os.rename(tmp, site.inbox / name)

    thread = threading.Thread(target=place, daemon=True)
    thread.start()
    return thread


def test_a_batch_the_edge_fails_fails_the_task_with_forte_error(tmp_path, monkeypatch):
    # A relay that holds at most 1 MiB per site, and a batch of 1.5 MB that no codec shrinks,
    # each file an object of its own: the relay takes some and then refuses, nothing in the
    # batch is waiting for the core to free room, and the edge records the batch failed. Its
    # scans are 3 s apart, so it stays failed between two attempts.
    site = Site(
        tmp_path / "site",
        relay_flags=("--quota-per-site", "1MiB"),
        send_flags=("--bundle-below", "0"),
        interval=3,
    )
    try:
        connect(monkeypatch, site)
        source = write_batch(tmp_path / "huge", {f"{i}.bin": incompressible(500_000, i) for i in range(3)})
        dag = load_example("forte_send_and_process", FORTE_EXAMPLE_POKE_INTERVAL=POKE, FORTE_EXAMPLE_TIMEOUT="120")
        states, errors, _ = run(dag, {"source": str(source), "inbox": str(site.inbox), "batch_name": "huge"})
        assert states == {"send": "failed", "check_delivery": "upstream_failed"}, f"{states} {errors}\n{site.all_logs()}"
        error = errors["send"]
        print(f"the send task failed with: {error}")
        assert "batch 'huge' failed at the edge" in error, error
        # forte's own words, as its API gives them.
        edge = get_json(f"http://{site.edge_addr}/api/v1/batches?name=huge&role=edge")["batches"][0]
        assert edge["error"] and edge["error"] in error, (edge, error)
        assert "nothing in it is waiting for the core" in error, error
    finally:
        site.stop()


def test_a_batch_the_core_fails_fails_the_task_and_the_sensor_with_forte_error(tmp_path, monkeypatch, capfd):
    # The core's destination holds another file where the batch's a.txt is to go: the core
    # verifies the batch and refuses to replace it, and records the batch failed. Its scans
    # are 3 s apart, so it stays failed between two attempts.
    site = Site(tmp_path / "site", interval=3)
    try:
        connect(monkeypatch, site)
        source = write_batch(tmp_path / "run-x", {"a.txt": b"from the edge\n", "b.txt": b"b\n"})
        clash = site.dest / SITE / "run-x" / "a.txt"
        clash.parent.mkdir(parents=True)
        clash.write_bytes(b"something else, already at the core\n")

        dag = load_example("forte_send_and_process", FORTE_EXAMPLE_POKE_INTERVAL=POKE, FORTE_EXAMPLE_TIMEOUT="120")
        states, errors, _ = run(dag, {"source": str(source), "inbox": str(site.inbox), "batch_name": "run-x"})
        assert states == {"send": "failed", "check_delivery": "upstream_failed"}, f"{states} {errors}\n{site.all_logs()}"
        error = errors["send"]
        print(f"the send task failed with: {error}")
        assert "batch 'run-x' failed at the core" in error, error
        core = get_json(f"http://{site.core_addr}/api/v1/batches?name=run-x&role=core")["batches"][0]
        assert core["state"] == "failed" and core["error"] and core["error"] in error, (core, error)
        assert "already exists with other contents" in error, error
        assert clash.read_bytes() == b"something else, already at the core\n"

        # The same, the wait deferred: the trigger's event says failed, with the same text.
        clash_y = site.dest / SITE / "run-y" / "a.txt"
        clash_y.parent.mkdir(parents=True)
        clash_y.write_bytes(b"something else\n")
        capfd.readouterr()
        deferred = load_example(
            "forte_send_and_process", FORTE_EXAMPLE_POKE_INTERVAL=POKE, FORTE_EXAMPLE_TIMEOUT="120", FORTE_EXAMPLE_DEFERRABLE="1"
        )
        states, errors, _ = run(deferred, {"source": str(source), "inbox": str(site.inbox), "batch_name": "run-y"})
        assert states == {"send": "failed", "check_delivery": "upstream_failed"}, f"{states} {errors}\n{site.all_logs()}"
        print(f"the deferred send task failed with: {errors['send']}")
        assert "batch 'run-y' failed at the core" in errors["send"], errors
        assert f"{clash_y} already exists with other contents" in errors["send"], errors
        assert "forte: resumed by ForteBatchDeliveredTrigger: {'status': 'failed'" in "".join(capfd.readouterr())

        for deferrable in ("", "1"):
            sensor_dag = load_example(
                "forte_wait_for_batch", FORTE_EXAMPLE_POKE_INTERVAL=POKE, FORTE_EXAMPLE_DEFERRABLE=deferrable, FORTE_EXAMPLE_TIMEOUT="60"
            )
            states, errors, _ = run(sensor_dag, {"batch_name": "run-x"})
            assert states == {"delivered": "failed", "list_files": "upstream_failed"}, (deferrable, states, errors)
            print(f"the sensor (deferrable={bool(deferrable)}) failed with: {errors['delivered']}")
            assert "batch 'run-x' failed at the core" in errors["delivered"], errors
            assert "already exists with other contents" in errors["delivered"], errors
    finally:
        site.stop()


def test_the_hook_reads_the_api_and_names_the_url_in_errors(site, monkeypatch):
    from airflow.exceptions import AirflowException
    from airflow_provider_forte.hooks.forte import ForteHook

    connect(monkeypatch, site)
    edge, core = ForteHook("forte_edge"), ForteHook("forte_core")
    assert edge.info()["role"] == "edge" and edge.info()["api"] == 1
    assert core.info()["role"] == "core"
    assert isinstance(core.failures(), list)
    with pytest.raises(AirflowException) as refused:
        core.batch("site-a/no-such-batch")
    assert f"http://{site.core_addr}/api/v1/batches/site-a/no-such-batch" in str(refused.value)
    assert "404" in str(refused.value)
    with pytest.raises(AirflowException) as bad:
        core.batches(state="no-such-state")
    assert "400" in str(bad.value) and "state" in str(bad.value)


def test_the_connection_password_is_sent_as_bearer_token(tmp_path, monkeypatch):
    """The daemons serve their API on this machine's outside address with a token: a request
    from there (not loopback) needs it. The hook and the trigger's client send the connection's
    password as the token; without it, forte's refusal (401) is the error."""
    import asyncio

    from airflow.exceptions import AirflowException
    from airflow_provider_forte.hooks.forte import ForteAsyncClient, ForteHook

    token = "http-token-0123456789abcdef"
    site = Site(tmp_path / "site", http_host=outside_address(), http_token=token)
    try:
        monkeypatch.setenv("AIRFLOW_CONN_FORTE_EDGE", site.conn_env(site.edge_addr, token))
        monkeypatch.setenv("AIRFLOW_CONN_FORTE_CORE", site.conn_env(site.core_addr, token))
        monkeypatch.setenv("AIRFLOW_CONN_FORTE_NO_TOKEN", site.conn_env(site.core_addr))
        assert ForteHook("forte_edge").info()["role"] == "edge"
        assert ForteHook("forte_core").failures() == []
        with pytest.raises(AirflowException) as refused:
            ForteHook("forte_no_token").info()
        text = str(refused.value)
        assert f"GET http://{site.core_addr}/api/v1: 401 " in text and "--http-token-file" in text, text

        async def through_the_trigger_client():
            client = await ForteAsyncClient.for_connection("forte_core")
            none = await client.find_batch("nothing-yet", role="core")
            refused = await ForteAsyncClient.for_connection("forte_no_token")
            try:
                await refused.batches()
            except AirflowException as e:
                return none, str(e)
            return none, None

        none, error = asyncio.run(through_the_trigger_client())
        assert none is None
        assert error and "401" in error and "--http-token-file" in error, error
    finally:
        site.stop()
