"""CALO: calibrated evidential graph cost models for TVM Meta-Schedule."""

import os

# Telemetry must be off before prefect, mlflow or dvc is imported anywhere in the process.
for _key, _value in {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "DVC_NO_ANALYTICS": "1",
    "MLFLOW_ENABLE_TELEMETRY": "false",
    # a progress bar per registry download: noise in a command's one-screen output
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # Prefect's temporary local server gets 20 s to start by default; a first run on a busy
    # 2-core machine (migrating its fresh database) can take longer, and then the flow fails
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}.items():
    os.environ.setdefault(_key, _value)
