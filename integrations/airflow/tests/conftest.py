"""Airflow for the tests: its own AIRFLOW_HOME (a temporary directory) with a SQLite metadata
database, migrated once; the example DAGs as its DAG folder. Airflow reads its configuration
when first imported, so the environment is set here, before any test module imports it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLE_DAGS = HERE.parent / "example_dags"
sys.path.insert(0, str(HERE))

_HOME = tempfile.mkdtemp(prefix="forte-airflow-home-")
os.environ["AIRFLOW_HOME"] = _HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(EXAMPLE_DAGS)
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_HOME}/airflow.db"
# Unpaused, so that an Asset event queues a run of the DAG scheduled on it (forte_on_arrival),
# which a test checks; no scheduler runs here to start it.
os.environ["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"


@pytest.fixture(scope="session", autouse=True)
def airflow_db():
    """``airflow db migrate`` on the SQLite database, once."""
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, env=os.environ.copy()
    )
    assert done.returncode == 0, f"airflow db migrate failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    yield
    shutil.rmtree(_HOME, ignore_errors=True)


_loaded = 0


def load_example(name: str, **env: str):
    """The DAG of ``example_dags/<name>.py``, parsed now with ``env`` set (the examples read
    FORTE_EXAMPLE_* when parsed)."""
    global _loaded
    _loaded += 1
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        spec = importlib.util.spec_from_file_location(f"forte_example_{name}_{_loaded}", EXAMPLE_DAGS / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return module.dag


def sync_to_db(dag) -> None:
    """What the DAG processor does with a parsed DAG file: the DAG, its Assets and its Assets'
    watchers (trigger rows tied to the Asset) into the metadata database, in the bundle
    ``dags-folder``. (Airflow 3.1's ``dag.test()`` does it for a DAG not in the database yet;
    3.0's does not, and a task's outlets must be active Assets there.)"""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.models.dagbag import DagBag
    from airflow.utils.session import create_session

    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
    if getattr(dag, "relative_fileloc", None) is None:
        # As a DagBag of the DAG folder sets it (the examples are that folder).
        dag.relative_fileloc = os.path.relpath(dag.fileloc, EXAMPLE_DAGS)
    bag = DagBag(collect_dags=False, include_examples=False)
    bag.bag_dag(dag)
    try:
        from airflow.models.dagbag import sync_bag_to_db  # Airflow 3.1
    except ImportError:  # Airflow 3.0
        bag.sync_to_db("dags-folder", None)
    else:
        sync_bag_to_db(bag, "dags-folder", None)


def airflow_3_0() -> bool:
    import airflow

    return airflow.__version__.startswith("3.0.")


#: Where ``dag.test()`` gets its run: patched to run the run an Asset event queues.
GET_OR_CREATE_DAGRUN = (
    "airflow.models.dag._get_or_create_dagrun" if airflow_3_0() else "airflow.models.dagrun.get_or_create_dagrun"
)
