"""Several nodes, one job: the node variables, and two entrypoint.py processes as two nodes over 127.0.0.1.

On one machine the output folder is shared by construction, as SFT_OUTPUT_DIR must be between real
nodes (README: Several machines). Each node runs one CPU rank, so the two-node job has the world of
one node with two ranks, and must give its losses.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (REPO, demo_env, process_tree, read_summary, run_entrypoint, send_signal,
                      step_losses)
from hub_fixtures import WRITE_TOKEN, client_env, hub_process  # noqa: F401  (hub_process: a fixture)
from hubserver import HubError, RepoStore
from sft import checkpoints, exitcodes
from sft.controller import coordinate
from sft.controller.launch import RANK_PROGRAM, command
from sft.planner.inputs import Ranks
from sft.nodes import Nodes, NodesError, first_host, from_env
from sft.handoff import CheckpointRecord
from sft.settings import Settings
from sft.hub.layout import hub_checkpoints

# ZeRO-3, fp32 and unpacked rows, so that the losses compare to 1e-4 across layouts (docs/facts.md).
JOB = dict(zero_stage="3", packing="false", precision="fp32", seed=0, logging_steps=1, max_steps=24, save_steps=4,
           learning_rate=2e-3, probe_steps=0, node_timeout_seconds=30)
TIMEOUT = JOB["node_timeout_seconds"]

# -- the node variables ---------------------------------------------------------------------------

PARSED = [
    ({}, Nodes()),
    ({"NNODES": "1", "MASTER_ADDR": "10.0.0.1"}, Nodes()),  # one node: nothing to reach
    ({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"},
     Nodes(2, 1, "10.0.0.1", 1234)),
    ({"NNODES": "4", "NODE_RANK": "0", "MASTER_ADDR": "head"}, Nodes(4, 0, "head", 29500)),
    ({"SLURM_NNODES": "4", "SLURM_NODEID": "3", "SLURM_JOB_NODELIST": "gpu[01-04,07],cpu3"},
     Nodes(4, 3, "gpu01", 29500)),
    ({"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "a,b", "MASTER_ADDR": "10.1.1.1",
      "MASTER_PORT": "6000"}, Nodes(2, 1, "10.1.1.1", 6000)),
    ({"SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "gpu07"}, Nodes()),
    # a Kubeflow PyTorchJob pod: torchrun's PET_ names, MASTER_* plain
    ({"PET_NNODES": "3", "PET_NODE_RANK": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
      "WORLD_SIZE": "3", "RANK": "2"}, Nodes(3, 2, "job-master-0", 23456)),
    # NNODES wins over SLURM's own (a torchrun-style script inside an allocation)
    ({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "x", "SLURM_NNODES": "8", "SLURM_NODEID": "5",
      "SLURM_JOB_NODELIST": "n[1-8]"}, Nodes(2, 1, "x", 29500)),
]


@pytest.mark.parametrize("environ,nodes", PARSED)
def test_node_variables(environ, nodes):
    assert from_env(environ) == nodes


@pytest.mark.parametrize("nodelist,first", [
    ("gpu[01-04,07],cpu3", "gpu01"), ("node1,node2", "node1"), ("a[1-2]-ib", "a1-ib"),
    ("rack[1-2]-n[01-04]", "rack1-n01"), ("x[7]", "x7"), ("single", "single"), ("gpu[10,02]", "gpu10")])
def test_first_host_of_a_slurm_nodelist(nodelist, first):
    assert first_host(nodelist) == first


BAD_NODES = [
    ({"NNODES": "two"}, ["NNODES='two': expected a whole number"]),
    ({"NNODES": "0"}, ["NNODES='0': expected at least 1"]),
    ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "h"}, ["NODE_RANK='2': expected 0 to 1 (NNODES=2)"]),
    ({"NNODES": "2", "NODE_RANK": "-1", "MASTER_ADDR": "h"}, ["NODE_RANK='-1': expected at least 0"]),
    ({"NODE_RANK": "1"}, ["NODE_RANK='1': expected 0 to 0 (NNODES=1)"]),
    ({"NNODES": "2"}, ["MASTER_ADDR: not set; with NNODES=2"]),
    ({"MASTER_PORT": "65535"}, ["MASTER_PORT='65535': expected a port number from 1 to 65534"]),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "5", "PET_MASTER_ADDR": "h"}, ["PET_NODE_RANK='5': expected 0 to 1"]),
    ({"SLURM_NNODES": "2", "SLURM_NODEID": "x", "SLURM_JOB_NODELIST": ""},
     ["SLURM_NODEID='x': expected a whole number", "SLURM_JOB_NODELIST: not set; with SLURM_NNODES=2"]),
]


@pytest.mark.parametrize("environ,problems", BAD_NODES)
def test_bad_node_variables(environ, problems):
    with pytest.raises(NodesError) as e:
        from_env(environ)
    assert len(e.value.problems) == len(problems)
    for got, want in zip(e.value.problems, problems):
        assert got.startswith(want), got


@pytest.mark.parametrize("extra,messages", [
    ({"NNODES": "2", "NODE_RANK": "2", "MASTER_PORT": "x", "SFT_SEED": "-1"},
     ["NODE_RANK='2': expected 0 to 1", "MASTER_PORT='x': expected a port number", "MASTER_ADDR: not set",
      "SFT_SEED='-1'"]),
    ({"SLURM_NNODES": "3", "SLURM_NODEID": "3", "SLURM_JOB_NODELIST": "n[1-3]"},
     ["SLURM_NODEID='3': expected 0 to 2 (SLURM_NNODES=3)"]),
    ({"NNODES": "2", "MASTER_ADDR": "h", "SFT_LAUNCHER": "deepspeed"},
     ["SFT_LAUNCHER='deepspeed': with 2 nodes use SFT_LAUNCHER=torchrun"]),
])
def test_bad_node_variables_exit_2_with_the_settings(tmp_path, extra, messages):
    env = demo_env(tmp_path)
    env.update(extra)
    result = run_entrypoint(env, timeout=120)
    assert result.returncode == exitcodes.BAD_SETTINGS, result.stdout + result.stderr
    for message in messages:
        assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_torchrun_command_names_the_nodes():
    s = Settings(node_timeout_seconds=45)
    cmd = command(s, Ranks(8, tuple(range(8)), 2), Nodes(2, 1, "10.0.0.1", 29500), 29500, RANK_PROGRAM, "spec.json")
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    for arg in ("--nnodes=2", "--node-rank=1", "--nproc-per-node=8", "--master-addr=10.0.0.1",
                "--master-port=29500", "--rdzv-conf=timeout=45"):
        assert arg in cmd


def test_a_checkpoint_without_every_nodes_shards_is_incomplete(tmp_path):
    """On a shared folder the other node's shards may be missing: count them against the recorded world."""
    from checkpoint_layout import make_checkpoint

    ckpt = make_checkpoint(tmp_path, 4, ranks=2)
    (ckpt / CheckpointRecord.FILE).write_text('{"stage": "3", "world_size": 4}')
    assert checkpoints.problem(ckpt) == "shards of 2 of the 4 ranks that wrote it"
    (ckpt / CheckpointRecord.FILE).write_text('{"stage": "3", "world_size": 2}')
    assert checkpoints.problem(ckpt) is None


def test_shared_folder_marker(tmp_path):
    token = coordinate.write_marker(tmp_path / "a")
    assert coordinate.marker_seen(tmp_path / "a", token, timeout_s=0)
    assert not coordinate.marker_seen(tmp_path / "b", token, timeout_s=0.2)  # another machine's own disk
    assert not coordinate.marker_seen(tmp_path / "a", "an earlier start's token", timeout_s=0)
    message = coordinate.unshared(Settings(output_dir="/data/out", node_timeout_seconds=60), [1, 3])
    assert message.startswith("SFT_OUTPUT_DIR is not shared between the nodes: node(s) 1, 3 did not see, within 60 s")


def test_differences_name_the_node_and_the_settings():
    s = Settings()
    mine = coordinate.identity(s, Ranks(8, tuple(range(8))))
    other = coordinate.identity(Settings(seed=7, max_steps=100), Ranks(4, tuple(range(4))))
    other["code_sha256"] = "0" * 64
    message = coordinate.differences(mine, {1: mine, 2: other})
    assert "node 1" not in message
    assert "node 2 runs other code than node 0" in message
    assert "node 2's settings differ from node 0's: SFT_MAX_STEPS=100 (node 0: -1), SFT_SEED=7 (node 0: 42)" in message
    assert "node 2 has 4 rank(s) and node 0 8" in message
    assert coordinate.differences(mine, {1: mine}) is None


# -- two processes as two nodes -----------------------------------------------------------------


def free_port_pair() -> int:
    """A port P with P+1 free too: torchrun's rendezvous and the controllers' store."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two consecutive free ports")


def node_env(tmp_path: Path, port: int, rank: int, **settings) -> dict[str, str]:
    """Node RANK of two; the same SFT_OUTPUT_DIR for both (one machine: a shared folder)."""
    env = demo_env(tmp_path, **{**JOB, "cpu_ranks": 1, **settings})
    # one thread a rank, as in the one-node run: 2 cores for 2 ranks
    env.update(NNODES="2", NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    return env


def start(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)


def two_nodes(tmp_path: Path, tag: str, node1: dict | None = None, extra: tuple[dict, dict] = ({}, {}),
              meanwhile=None, **settings) -> list[tuple[int, str]]:
    """Both nodes to the end: (exit code, output) of node 0 and node 1; node1: settings of node 1 only,
    extra: other variables of each node; meanwhile(procs, logs): called once both started."""
    port = free_port_pair()
    logs = [tmp_path / f"{tag}-node{rank}.log" for rank in (0, 1)]
    envs = [node_env(tmp_path, port, 0, **settings), node_env(tmp_path, port, 1, **{**settings, **(node1 or {})})]
    for env, more in zip(envs, extra):
        env.update(more)
    procs = [start(env, log) for env, log in zip(envs, logs)]
    if meanwhile is not None:
        meanwhile(procs, logs)
    return [(p.wait(timeout=600), log.read_text()) for p, log in zip(procs, logs)]


def kill_node(proc: subprocess.Popen) -> None:
    """kill -9 of a whole node: its controller, the launcher (in its own session) and the ranks."""
    send_signal(process_tree(proc.pid), signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def one_node(tmp_path_factory) -> dict[int, float]:
    """The reference: one node with two CPU ranks, the same job."""
    tmp = tmp_path_factory.mktemp("one-node")
    env = demo_env(tmp, **{**JOB, "cpu_ranks": 2})
    env["OMP_NUM_THREADS"] = "1"
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return step_losses(read_summary(tmp / "out"))


@pytest.mark.slow
def test_two_nodes_give_one_nodes_losses_upload_every_shard_and_hold_one_lock(one_node, hub_process, tmp_path):
    # the probe first: node 1 follows node 0 through two launches; node 0 alone uploads, and needs the token
    hub = client_env(hub_process.url, tmp_path / "hf-home")
    store = RepoStore(tmp_path / "hub-process")

    def hub_files() -> dict:
        try:
            return store.files("models", "alice/two-nodes", "main")[1]
        except HubError:  # no repo yet
            return {}

    def upload_while_paused(procs, logs):
        """24 steps train in about 2 s here, perhaps between two upload rounds: both nodes' ranks pause
        (SIGSTOP: a slow step) from the first checkpoint until node 0 has uploaded one. Meanwhile a third job
        started on the shared folder stops at once: node 0 alone holds its lock (node 1 takes none, or it would
        refuse itself), and the error names node 0's controller."""
        # complete, not only begun: the ranks' background writers (threads of the ranks) stop with them, and a
        # checkpoint whose files are still being written is not uploaded (CI: SIGSTOP mid-write, nothing in 120 s)
        wait_for_a_complete_checkpoint(tmp_path / "out", procs, logs[0])
        ranks = [p for proc in procs for p in process_tree(proc.pid)[1:]]
        send_signal(ranks, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 120
            while not hub_checkpoints(hub_files())[0]:
                assert time.monotonic() < deadline, "no checkpoint reached the Hub"
                assert all(p.poll() is None for p in procs), logs[0].read_text()[-3000:]
                time.sleep(0.1)
            third = run_entrypoint(demo_env(tmp_path, **JOB), timeout=300)
        finally:
            send_signal(ranks, signal.SIGCONT)
        assert third.returncode == exitcodes.OUTPUT_BUSY, third.stdout[-3000:] + third.stderr[-3000:]
        assert f"error: another job is running on {tmp_path / 'out'} (pid {procs[0].pid} on " in third.stdout

    # the ranks wait in a collective while they are paused: their timeout must outlast the third job's start on a
    # busy machine (30 s did not, under a parallel test run with a busy core)
    (code0, log0), (code1, log1) = two_nodes(tmp_path, "run", probe_steps=2, hub_repo="alice/two-nodes",
                                             upload_minutes=0.02, extra=({**hub, "HF_TOKEN": WRITE_TOKEN}, hub),
                                             meanwhile=upload_while_paused, node_timeout_seconds=300)
    assert code0 == 0, log0[-3000:]
    assert code1 == 0 and "node 0 ended the job: exit code 0" in log1, log1[-3000:]
    assert "--nnodes=2 --node-rank=1" in log1 and log1.count("$ ") == 2
    summary = read_summary(tmp_path / "out")
    assert (summary["status"], summary["nodes"], summary["ranks"], summary["probe"]["world_size"]) == ("done", 2, 2, 2)
    losses = step_losses(summary)
    assert losses.keys() == one_node.keys() and len(losses) == JOB["max_steps"]
    worst = max(abs(losses[k] - one_node[k]) for k in losses)
    assert worst < 1e-4, f"two nodes differ from one node with two ranks by {worst}"
    newest = tmp_path / "out" / f"checkpoint-{JOB['max_steps']}"
    assert checkpoints.problem(newest) is None and checkpoints.shard_ranks(newest) == [0, 1]
    # on the Hub: the newest checkpoint uploaded, with both nodes' shards, and the final model (the last
    # checkpoint goes up only if an upload round comes between its save and the end: final/ supersedes it)
    files = hub_files()
    step = hub_checkpoints(files)[0][-1]
    assert f"checkpoints/checkpoint-{step}/manifest.json" in files and "manifest.json" in files
    shards = f"checkpoints/checkpoint-{step}/global_step{step}/zero_pp_rank_{{}}_mp_rank_00_optim_states.pt"
    for rank in (0, 1):
        assert shards.format(rank) in files


@pytest.mark.slow
def test_different_settings_stop_every_node_with_one_message(tmp_path):
    (code0, log0), (code1, log1) = two_nodes(tmp_path, "mismatch", node1={"max_steps": 30})
    message = "node 1's settings differ from node 0's: SFT_MAX_STEPS=30 (node 0: 24)"
    assert code0 == code1 == exitcodes.PREFLIGHT, log0 + log1
    assert message in log0 and message in log1
    assert not (tmp_path / "out" / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_node_alone_fails_within_the_timeout(tmp_path):
    port = free_port_pair()
    took = []
    for rank in (1, 0):  # each alone: its start, 2 s of waiting, its exit; never the default's 1800 s
        started = time.monotonic()
        took.append((run_entrypoint(node_env(tmp_path, port, rank, node_timeout_seconds=2), timeout=120),
                     time.monotonic() - started))
    (follower, follower_s), (leader, leader_s) = took
    # each well under a minute alone; the bound leaves room for a start on a loaded machine (the two, one after the
    # other, took 67 s together beside a three-worker test run)
    assert follower_s < 90 and leader_s < 90, (follower_s, leader_s)
    assert follower.returncode == exitcodes.PREFLIGHT
    assert f"cannot reach the master node 127.0.0.1:{port + 1} within 2 s" in follower.stdout
    assert leader.returncode == exitcodes.PREFLIGHT
    assert "the other 1 node(s) did not join within 2 s" in leader.stdout


def wait_for(path: Path, procs: list[subprocess.Popen], log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert all(p.poll() is None for p in procs), log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)


def wait_for_a_complete_checkpoint(output: Path, procs: list[subprocess.Popen], log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not any(checkpoints.problem(c) is None for c in checkpoints.all_checkpoints(output)):
        assert all(p.poll() is None for p in procs), log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no complete checkpoint in {output}"
        time.sleep(0.05)


@pytest.mark.slow
def test_killed_node_fails_the_other_a_stop_stops_both_and_they_resume(one_node, tmp_path):
    """kill -9 of node 1: node 0 fails within the timeout. Started again, SIGTERM to node 1 alone stops
    both (the stop file is in the shared folder). Started again, they finish with one node's losses."""
    port = free_port_pair()
    envs = [node_env(tmp_path, port, rank) for rank in (0, 1)]
    logs = [tmp_path / f"node{rank}.log" for rank in (0, 1)]
    nodes = [start(env, log) for env, log in zip(envs, logs)]
    wait_for(tmp_path / "out" / "checkpoint-4" / "trainer_state.json", nodes, logs[0])
    kill_node(nodes[1])  # its machine dies: no handler runs
    killed = time.monotonic()
    code = nodes[0].wait(timeout=TIMEOUT + 60)
    assert time.monotonic() - killed < TIMEOUT, "node 0 took longer than SFT_NODE_TIMEOUT_SECONDS to fail"
    log = logs[0].read_text()
    assert code == exitcodes.TRAIN_FAILED, log[-3000:]
    assert "node 1 stopped answering" in log

    nodes = [start(env, log) for env, log in zip(envs, logs)]
    wait_for(tmp_path / "out" / "checkpoint-12" / "trainer_state.json", nodes, logs[0])
    nodes[1].terminate()  # a scheduler stops one node
    codes = [p.wait(timeout=120) for p in nodes]
    assert codes == [exitcodes.STOPPED] * 2, logs[0].read_text()[-3000:]
    stopped = read_summary(tmp_path / "out")["train"]["global_step"]
    assert 12 <= stopped < JOB["max_steps"] and checkpoints.problem(tmp_path / "out" / f"checkpoint-{stopped}") is None

    (code0, log0), (code1, log1) = two_nodes(tmp_path, "again")
    assert code0 == code1 == 0, log0[-3000:] + log1[-3000:]
    summary = read_summary(tmp_path / "out")
    assert summary["resumed_from"].endswith(f"checkpoint-{stopped}")
    assert summary["train"]["global_step"] == JOB["max_steps"]
    losses = step_losses(summary)
    after = [k for k in one_node if k > stopped]
    assert after and max(abs(losses[k] - one_node[k]) for k in after) < 1e-4


# -- the shipped scheduler files ------------------------------------------------------------------


def test_pytorchjob_manifest_runs_the_image_on_every_pod():
    import yaml

    job = yaml.safe_load((REPO / "scripts" / "pytorchjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["template"] == replicas["Master"]["template"]
    (container,) = replicas["Master"]["template"]["spec"]["containers"]
    assert container["name"] == "pytorch" and "command" not in container  # the image's own entrypoint
    ports = sorted(p["containerPort"] for p in container["ports"])
    assert ports[1] == ports[0] + 1  # MASTER_PORT and the controllers' MASTER_PORT+1
    names = {e["name"] for e in container["env"]}
    assert all(name.startswith(("SFT_", "HF_")) for name in names)
    Settings(**{name[4:].lower(): "x" for name in names if name.startswith("SFT_")})  # every one a real setting


def test_slurm_script_is_valid_bash_and_passes_slurms_node_variables():
    script = REPO / "scripts" / "slurm.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert all(f"-e {name}" in text for name in ("SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST"))
