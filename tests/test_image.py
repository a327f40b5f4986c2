"""The image, built and run as users run it (scripts/test-image.sh): opt in with RUN_IMAGE_TESTS=1.

It needs root or a Docker engine (the script installs Debian's docker.io and starts dockerd when there is
none), network to PyPI and the Debian mirror, and about 10 minutes cold, 5 warm; `make test-image` runs
the same script directly. The script starts the local Hub (tests/hubserver/) as a process of its own on
127.0.0.1 for the upload, stop and resume checks (the containers use --network host), and stops it at exit. The opt-in variable does not start with SFT_: those are the job's settings.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import REPO

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(os.environ.get("RUN_IMAGE_TESTS") != "1",
                       reason="builds and runs the Docker image (minutes, root or a Docker engine): "
                              "set RUN_IMAGE_TESTS=1, or run `make test-image`"),
]


@pytest.mark.timeout(3600)
def test_image_builds_and_runs_as_users_run_it():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFT_")}
    proc = subprocess.run([str(REPO / "scripts" / "test-image.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True)
    report = proc.stdout + proc.stderr
    failed = [line for line in report.splitlines() if line.startswith("FAIL:")]
    assert proc.returncode == 0, "\n".join(failed) or report[-6000:]
