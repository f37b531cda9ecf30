"""Requests to the API server per node per hour under churn: a PLACEHOLDER.

The API-server source (``sources/kubeapi.py``: list + watch of ResourceSlices,
ResourceClaims and Pods, DESIGN §1) does not exist yet, so there is nothing to count. When it
lands, this benchmark should run it against the simulated API server over the ``scale``
scenario's churn hour and report requests per hour (lists, watches, re-lists after 410)
against a baseline of one list per resource per interval (polling). Until then it reports
``status: placeholder`` and no rows, and ``run.py`` prints it as such.
"""

from __future__ import annotations

from .common import Config, Result


def run(config: Config) -> Result:
    return Result(
        description="API-server requests per node per hour under churn (lists, watches, re-lists).",
        baseline="one list per resource type per interval (polling)",
        status="placeholder",
        notes=["TODO(lead): fill in once sources/kubeapi.py and the simulated API server exist"],
    )
