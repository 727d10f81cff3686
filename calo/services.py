"""The servers some commands need (an MLflow tracking server, a Prefect server), checked before
any work: a server that is down stops the command in seconds with one line naming its address
and what to start, instead of minutes of client retries ending in a traceback.

Only servers reached over HTTP are checked; the project's own default stores (MLflow's SQLite
file, Prefect's temporary local server) need nothing running.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

from calo.config import Settings
from calo.errors import CaloError, reason

TIMEOUT_S = 5.0


def _answers(url: str) -> str | None:
    """None if `url` answers with HTTP 200, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return reason(getattr(err, "reason", err))


def mlflow_uri(settings: Settings) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", settings.mlflow.tracking_uri)


def require_mlflow(settings: Settings) -> None:
    uri = mlflow_uri(settings)
    if not uri.startswith(("http://", "https://")):
        return
    why = _answers(uri.rstrip("/") + "/health")
    if why is not None:
        raise CaloError(
            f"MLflow tracking server {uri} does not answer ({why}): start it "
            f"(`mlflow server --host HOST --port PORT`) or unset MLFLOW_TRACKING_URI to use "
            f"params.yaml's store ({settings.mlflow.tracking_uri})")


def require_prefect(api_url: str | None) -> None:
    """`api_url`: the configured Prefect API (PREFECT_API_URL), or None for none."""
    if not api_url or not api_url.startswith(("http://", "https://")):
        return
    why = _answers(api_url.rstrip("/") + "/health")
    if why is not None:
        raise CaloError(
            f"Prefect server {api_url} does not answer ({why}): start it (`prefect server "
            "start`) or unset PREFECT_API_URL to run flows on a temporary local server")
