"""Reads one run of an MLflow file store with MLflow's own client and prints what it sees as JSON.

Usage: python read_run.py TRACKING_DIR RUN_ID
"""

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
# MLflow 3 keeps the file store in maintenance mode and refuses it unless this is set.
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

root, run_id = sys.argv[1], sys.argv[2]
client = MlflowClient(tracking_uri="file:" + os.path.abspath(root))
run = client.get_run(run_id)
experiments = client.search_experiments()


def artifacts(path=None):
    out = []
    for entry in client.list_artifacts(run_id, path):
        if entry.is_dir:
            out.extend(artifacts(entry.path))
        else:
            out.append({"path": entry.path, "size": entry.file_size})
    return out


print(
    json.dumps(
        {
            "version": mlflow.__version__,
            "experiments": sorted([[e.experiment_id, e.name] for e in experiments]),
            "experiment_id": run.info.experiment_id,
            "run_name": run.info.run_name,
            "status": run.info.status,
            "start_time": run.info.start_time,
            "end_time": run.info.end_time,
            "params": run.data.params,
            "metrics": run.data.metrics,
            "tags": run.data.tags,
            "history": {
                key: [[m.step, m.value, m.timestamp] for m in client.get_metric_history(run_id, key)]
                for key in run.data.metrics
            },
            "artifacts": artifacts(),
        }
    )
)
