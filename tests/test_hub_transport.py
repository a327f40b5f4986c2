"""sft/hub/transport.py: the job's downloads take Xet (huggingface_hub's default), its uploads Git LFS, the path the
tests run, unless the user says otherwise. That the job's uploads really take LFS is shown end to end by every job
test against tests/hubserver/ that leaves HF_HUB_DISABLE_XET to the job: the server refuses Xet (test_hubserver)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from sft.hub import transport


def test_uploads_take_git_lfs_unless_the_user_chose():
    assert transport.describe({}) == "through Git LFS"
    pytest.importorskip("hf_xet")
    assert "through Xet (HF_HUB_DISABLE_XET='0'" in transport.describe({"HF_HUB_DISABLE_XET": "0"})


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_read_as_huggingface_hub_reads_it(value):
    from huggingface_hub.constants import _is_true

    assert _is_true(value) and transport.describe({"HF_HUB_DISABLE_XET": value}) == "through Git LFS"


# A command added to the real CLI: what huggingface_hub decides for a download once the entrypoint's group has run,
# and for an upload once the job's uploader was made (the constant both read at each call).
PROBE = """
import entrypoint
@entrypoint.cli.command("xet-probe")
def probe():
    from huggingface_hub.utils._runtime import is_xet_available
    from sft.hub import transport
    downloads = is_xet_available()
    transport.for_uploads()
    print("xet", downloads, is_xet_available())
entrypoint.cli(["xet-probe"])
"""


@pytest.mark.parametrize("given, xet", [(None, "True False"), ("0", "True True"), ("1", "False False")])
def test_downloads_take_xet_and_uploads_git_lfs_unless_the_user_set_the_variable(given, xet):
    pytest.importorskip("hf_xet")  # without it there is no Xet to choose
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_XET"}
    if given is not None:
        env["HF_HUB_DISABLE_XET"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == f"xet {xet}"


def test_the_uploader_switches_its_process_to_git_lfs(tmp_path):
    """Every upload of the job goes through an Uploader: made, it has switched the process (no variable set)."""
    code = """
from huggingface_hub.utils._runtime import is_xet_available
from sft.hub.preflight import HubTarget
from sft.hub.uploader import Uploader
from huggingface_hub import HfApi
before = is_xet_available()
target = HubTarget("a/b", "http://127.0.0.1:9", "a", False, HfApi(endpoint="http://127.0.0.1:9"))
Uploader(target, OUT, 60, 2, log=print)
print("xet", before, is_xet_available())
""".replace("OUT", repr(str(tmp_path)))
    pytest.importorskip("hf_xet")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_XET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "xet True False"
