"""sft/hub/transport.py: the job's Hub traffic takes Git LFS, the path the tests run, unless the user says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from sft.hub import transport


def test_git_lfs_unless_the_user_chose():
    env = {}
    transport.choose(env)
    assert env == {"HF_HUB_DISABLE_XET": "1"} and transport.describe(env) == "through Git LFS"
    mine = {"HF_HUB_DISABLE_XET": "0"}
    transport.choose(mine)
    assert mine == {"HF_HUB_DISABLE_XET": "0"}  # the user's choice stands, and the log names it
    pytest.importorskip("hf_xet")
    assert "through Xet (HF_HUB_DISABLE_XET='0'" in transport.describe(mine)


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_read_as_huggingface_hub_reads_it(value):
    from huggingface_hub.constants import _is_true

    assert _is_true(value) and transport.describe({"HF_HUB_DISABLE_XET": value}) == "through Git LFS"


# A command added to the real CLI: what huggingface_hub decides once the entrypoint's group has run.
PROBE = """
import entrypoint
@entrypoint.cli.command("xet-probe")
def probe():
    from huggingface_hub.utils._runtime import is_xet_available
    print("xet", is_xet_available())
entrypoint.cli(["xet-probe"])
"""


@pytest.mark.parametrize("given, xet", [(None, False), ("0", True)])
def test_the_entrypoint_sets_it_before_huggingface_hub_reads_it(given, xet):
    pytest.importorskip("hf_xet")  # without it there is no Xet to choose
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_XET"}
    if given is not None:
        env["HF_HUB_DISABLE_XET"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == f"xet {xet}"
