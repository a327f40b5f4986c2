"""The Kubernetes manifests (scripts/trainjob.yaml, Kubeflow Trainer v2; scripts/pytorchjob.yaml, the training
operator v1): what the image needs of them, and their probes' command run for real against an output folder."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, clean_environ
from sft.controller import status
from sft.settings import Settings

PYTHON, SCRIPT = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", (REPO / "Dockerfile").read_text(), re.M)[1])[-2:]


def trainjob() -> tuple[dict, dict]:
    runtime, job = yaml.safe_load_all((REPO / "scripts" / "trainjob.yaml").read_text())
    return runtime, job


def containers() -> dict[str, dict]:
    runtime, _ = trainjob()
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    (trainjob_container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    pytorchjob = yaml.safe_load((REPO / "scripts" / "pytorchjob.yaml").read_text())
    (pytorch_container,) = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    return {"trainjob": trainjob_container, "pytorchjob": pytorch_container}


def test_the_trainjob_runs_the_image_on_its_runtime_with_real_settings():
    runtime, job = trainjob()
    assert (runtime["apiVersion"], runtime["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime")
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    ref = job["spec"]["runtimeRef"]
    assert (ref["name"], ref["kind"]) == (runtime["metadata"]["name"], "TrainingRuntime")
    assert "torch" in runtime["spec"]["mlPolicy"]  # Trainer's torch policy: the PET_* variables the job reads
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    pod = node["template"]["spec"]["template"]["spec"]
    container = containers()["trainjob"]
    # Trainer fills the container named node; the image's own entrypoint runs the job
    assert container["name"] == "node" and "command" not in container and "args" not in job["spec"]["trainer"]
    assert pod["terminationGracePeriodSeconds"] > Settings().stop_grace_seconds
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/data", "/dev/shm"}
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == container["image"] and trainer["numNodes"] >= 1
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] >= 1
    names = {e["name"] for e in trainer["env"]}
    assert all(name.startswith(("SFT_", "HF_")) for name in names)
    Settings(**{name[4:].lower(): "x" for name in names if name.startswith("SFT_")})  # every one a real setting


@pytest.mark.parametrize("manifest", ["trainjob", "pytorchjob"])
@pytest.mark.parametrize("probe", ["startupProbe", "livenessProbe"])
def test_each_probe_is_status_check_of_the_image_and_runs(manifest, probe, tmp_path):
    """The probe's command with the image's interpreter and script (the Dockerfile's ENTRYPOINT) made this
    checkout's: it parses, and answers for SFT_OUTPUT_DIR as a probe reads it (3: no run there yet)."""
    command = containers()[manifest][probe]["exec"]["command"]
    assert command[:4] == [PYTHON, SCRIPT, "status", "--check"]
    env = {**clean_environ(tmp_path), "SFT_OUTPUT_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), *command[2:]], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (status.NO_RUN, f"{tmp_path}: no run here (no run/events.jsonl)")
