"""Apache Airflow provider for forte: a hook over forte's JSON API, an operator that sends a
directory as a batch and waits for its delivery, a sensor and a trigger that wait for a batch to
be delivered at the core, and Assets for batches (integrations/airflow/README.md)."""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """What Airflow's ProvidersManager reads (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-provider-forte",
        "name": "forte",
        "description": "Send sensor data through forte (edge, relay, core) and wait for its delivery.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "forte",
                "tags": ["software"],
            }
        ],
        "hooks": [{"integration-name": "forte", "python-modules": ["airflow_provider_forte.hooks.forte"]}],
        "operators": [{"integration-name": "forte", "python-modules": ["airflow_provider_forte.operators.forte"]}],
        "sensors": [{"integration-name": "forte", "python-modules": ["airflow_provider_forte.sensors.forte"]}],
        "triggers": [{"integration-name": "forte", "python-modules": ["airflow_provider_forte.triggers.forte"]}],
        "connection-types": [
            {"connection-type": "forte", "hook-class-name": "airflow_provider_forte.hooks.forte.ForteHook"}
        ],
    }
