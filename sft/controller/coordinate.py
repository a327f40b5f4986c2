"""The controllers of several nodes kept in step: node 0 runs the job, the others start their ranks as it says.

Node 0's controller hosts a small key-value store (torch's TCPStore) on MASTER_ADDR:MASTER_PORT+1, and
the other controllers connect to it. At start, before anything runs:
    identity/R   node R's settings, code and library versions, and rank count; node 0 compares them
    agreed       node 0's verdict; if all agree, node 0 has written a random token into SFT_OUTPUT_DIR
    shared/R     whether node R read that token in its own SFT_OUTPUT_DIR (it must be one shared folder)
    ready        node 0's last verdict: every node prints the same message and stops, or all go on
Then, for each launch of the ranks (the probe, its escalations, training):
    launch/N     node 0: the run spec (in the shared folder); every node starts its launcher on it
    done/N/R     node R's launcher exit code
    launch/N     {"end": code} after the last one: every node exits with node 0's code
    alive/R      a counter node R bumps every few seconds: node 0 names a node that went silent
One node hosts no store and takes no port: it is node 0 with no one to wait for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

from .. import exitcodes
from ..console import say
from ..handoff import read_json, write_json
from ..nodes import Nodes
from ..planner.inputs import Ranks
from ..settings import Settings, env_name
from .heartbeat import Heartbeat
from ..version import code_version, versions
from .launch import Launch, Stopper

POLL_S = 0.2  # how often a waiting controller looks at the store (and lets a signal handler run)
HEARTBEAT_S = 2.0
SILENT_S = 3 * HEARTBEAT_S  # no heartbeat for this long: the node's controller is gone
BYE_S = 30.0  # at the end, how long node 0 keeps its store up for the others to read the exit code
MARKER = "nodes-shared-check.json"  # under OUTPUT/run/


class NodesFailed(Exception):
    """The nodes cannot run one job together (the message says why and what to do)."""


def join(s: Settings, nodes: Nodes, ranks: Ranks) -> Team:
    """Connect the nodes' controllers and check that they run one job on one shared folder."""
    if nodes.nnodes == 1:
        return Team(s, nodes, ranks)
    say(f"nodes: {nodes.describe()}; waiting up to {s.node_timeout_seconds} s for the others")
    team = Team(s, nodes, ranks, _connect(nodes, s.node_timeout_seconds))
    team.agree()
    return team


def _connect(nodes: Nodes, timeout_s: int):
    from torch.distributed import TCPStore

    try:  # node 0 listens and waits for every other node; the others retry until node 0 listens
        return TCPStore(nodes.master_addr, nodes.store_port, nodes.nnodes, nodes.leads, timedelta(seconds=timeout_s))
    except RuntimeError as e:
        why = _first_line(e)
    if nodes.leads:
        raise NodesFailed(f"the other {nodes.nnodes - 1} node(s) did not join within {timeout_s} s ({why}): start "
                          f"the image on every node with NNODES={nodes.nnodes}, its own NODE_RANK and "
                          f"MASTER_ADDR={nodes.master_addr}, and let them reach port {nodes.store_port} here")
    raise NodesFailed(f"cannot reach the master node {nodes.master_addr}:{nodes.store_port} within {timeout_s} s "
                      f"({why}): check MASTER_ADDR, that node 0 runs, and that the network lets this node reach "
                      f"MASTER_PORT and MASTER_PORT+1 there")


class Team:
    """This node's place in the job, and what it says to the others through node 0's store."""

    def __init__(self, s: Settings, nodes: Nodes, ranks: Ranks, store: Any = None):
        self.s, self.nodes, self.ranks, self.store = s, nodes, ranks, store
        self.seq = 0  # launches so far
        self.lost: set[int] = set()  # nodes found silent: nobody waits for them any more
        self.ended = False

    @property
    def leads(self) -> bool:
        return self.nodes.leads

    @property
    def others(self) -> range:
        return range(1, self.nodes.nnodes)

    # -- the store ------------------------------------------------------------------------------

    def _set(self, key: str, value: Any) -> None:
        try:
            self.store.set(key, json.dumps(value))
        except RuntimeError as e:
            raise NodesFailed(self._lost_master(e)) from None

    def _get(self, key: str, timeout_s: float | None, what: str) -> Any:
        """The value of key once some node sets it; polled, so signals are handled and a lost node 0 noticed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                if self.store.check([key]):
                    return json.loads(self.store.get(key))
            except RuntimeError as e:
                raise NodesFailed(self._lost_master(e)) from None
            if deadline is not None and time.monotonic() > deadline:
                raise NodesFailed(f"{what} did not come within {timeout_s:g} s")
            time.sleep(POLL_S)

    def _lost_master(self, e: Exception) -> str:
        return (f"lost the master node (node 0 at {self.nodes.master_addr}:{self.nodes.store_port}): "
                f"{_first_line(e)}; its machine or its job stopped")

    # -- at start: one job, one folder ----------------------------------------------------------

    def agree(self) -> None:
        """Same settings, code, versions and rank count everywhere, and one shared output folder."""
        timeout = self.s.node_timeout_seconds
        me = identity(self.s, self.ranks)
        if self.leads:
            others = {r: self._get(f"identity/{r}", timeout, f"node {r}'s settings") for r in self.others}
            problem = differences(me, others)
            self._verdict("agreed", problem, token=None if problem else write_marker(self.s.output_path))
            seen = {r: self._get(f"shared/{r}", timeout + BYE_S, f"node {r}'s folder check") for r in self.others}
            self._verdict("ready", unshared(self.s, sorted(r for r, ok in seen.items() if not ok)))
        else:
            self._claim_rank()
            self._set(f"identity/{self.nodes.node_rank}", me)
            agreed = self._heed("agreed", timeout + BYE_S)  # node 0 may still wait for a slower node
            self._set(f"shared/{self.nodes.node_rank}", marker_seen(self.s.output_path, agreed["token"], timeout))
            self._heed("ready", timeout + BYE_S)
        say(f"nodes: {self.nodes.nnodes} nodes run the same settings, code and versions, {self.ranks.count} "
              f"rank(s) each, and share {self.s.output_dir}")

    def _verdict(self, key: str, problem: str | None, **extra: Any) -> None:
        """Node 0 tells every node; on a problem it stops, once each has read it (its store goes with it)."""
        self._set(key, {"problem": problem, **extra})
        if problem:
            for r in self.others:
                with contextlib.suppress(NodesFailed):
                    self._get(f"{key}-read/{r}", BYE_S, f"node {r}'s reading")
            raise NodesFailed(problem)

    def _heed(self, key: str, timeout_s: float) -> dict[str, Any]:
        """Node 0's verdict on this node: the same message as everywhere, and a stop on a problem."""
        verdict = self._get(key, timeout_s, f"node 0's verdict ({key})")
        self._set(f"{key}-read/{self.nodes.node_rank}", True)
        if verdict["problem"]:
            raise NodesFailed(verdict["problem"])
        return verdict

    def _claim_rank(self) -> None:
        # A second claim is a node started with a taken NODE_RANK, or one restarted alone into a running job.
        try:
            claims = self.store.add(f"rank/{self.nodes.node_rank}", 1)
        except RuntimeError as e:
            raise NodesFailed(self._lost_master(e)) from None
        if claims > 1:
            raise NodesFailed(f"a node with NODE_RANK={self.nodes.node_rank} already joined this job: give each "
                              "node its own NODE_RANK; after a node restarts alone, start every node again")

    # -- node 0: each launch, and the end -------------------------------------------------------

    def announce(self, spec: Path, stop_file: Path) -> None:
        """Before node 0's own launcher starts: the other nodes start theirs on the same spec."""
        if self.store is None:
            return
        self.seq += 1
        self._set(f"launch/{self.seq}", {"spec": str(spec), "stop_file": str(stop_file)})

    def after_launch(self, code: int) -> None:
        """A failed launch: name the nodes that went silent and those whose launcher failed too."""
        if self.store is None or code == 0:
            return
        silent = self._silent([r for r in self.others if not self.store.check([f"done/{self.seq}/{r}"])])
        for r in silent:
            say(f"error: node {r} stopped answering (its machine, container or job is gone), so its ranks "
                  "are lost and the others' collectives failed")
        self.lost |= set(silent)
        for r in sorted(set(self.others) - self.lost):
            if self.store.check([f"done/{self.seq}/{r}"]):
                say(f"node {r}: its launcher exited with code {json.loads(self.store.get(f'done/{self.seq}/{r}'))}")

    def _silent(self, nodes: list[int]) -> list[int]:
        if not nodes:
            return []
        before = {r: self.store.add(f"alive/{r}", 0) for r in nodes}
        time.sleep(SILENT_S)
        return [r for r in nodes if self.store.add(f"alive/{r}", 0) == before[r]]

    def finish(self, code: int) -> int:
        """Node 0's last word: every other node exits with this code."""
        if self.store is None or self.ended:
            return code
        self.ended = True
        self.seq += 1
        self._set(f"launch/{self.seq}", {"end": code})
        for r in sorted(set(self.others) - self.lost):  # keep the store up until each has read it
            try:
                self._get(f"bye/{r}", BYE_S, f"node {r}'s goodbye")
            except NodesFailed as e:
                say(f"warning: {e}")
        return code

    # -- the other nodes: follow node 0 ---------------------------------------------------------

    def follow(self, stopper: Stopper) -> int:
        """Start this node's ranks for each launch node 0 announces; return node 0's exit code."""
        stopper.install()
        beating = self._heartbeat()
        try:
            while True:
                self.seq += 1
                record = self._get(f"launch/{self.seq}", None, "node 0's next launch")
                if "end" in record:
                    self._set(f"bye/{self.nodes.node_rank}", True)
                    say(f"node 0 ended the job: exit code {record['end']}")
                    return record["end"]
                code = self._launch(record, stopper)
                self._set(f"done/{self.seq}/{self.nodes.node_rank}", code)
        except NodesFailed as e:
            say(f"error: {e}")
            return exitcodes.TRAIN_FAILED
        finally:
            beating.stop()

    def _launch(self, record: dict[str, str], stopper: Stopper) -> int:
        # a SIGTERM between two launches stops the next one at its first step
        return stopper.running(Launch(self.s, self.ranks, Path(record["spec"]), Path(record["stop_file"]),
                                      self.nodes))

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(self.store, f"alive/{self.nodes.node_rank}", HEARTBEAT_S).start()


# -- what the nodes compare ---------------------------------------------------------------------


def identity(s: Settings, ranks: Ranks) -> dict[str, Any]:
    """What must be equal on every node: settings, code, library versions, ranks per node."""
    settings = s.to_dict()
    return {"settings": settings, "settings_sha256": _sha256(json.dumps(settings, sort_keys=True, default=str)),
            "code_sha256": code_version(), "versions": versions(), "ranks": ranks.count}


def differences(mine: dict[str, Any], others: dict[int, dict[str, Any]]) -> str | None:
    """Every way the other nodes differ from node 0, one line each; None when they all agree."""
    lines = []
    for r, other in sorted(others.items()):
        if other["code_sha256"] != mine["code_sha256"]:
            lines.append(f"node {r} runs other code than node 0 (sha256 of entrypoint.py, sft/, ds_configs/: "
                         f"{other['code_sha256'][:12]} against {mine['code_sha256'][:12]}): run one image everywhere")
        libs = _changed(mine["versions"], other["versions"], str)
        if libs:
            lines.append(f"node {r} has other versions than node 0: {libs}")
        if other["settings_sha256"] != mine["settings_sha256"]:
            settings = _changed(mine["settings"], other["settings"], env_name)
            lines.append(f"node {r}'s settings differ from node 0's: {settings}")
        if other["ranks"] != mine["ranks"]:
            lines.append(f"node {r} has {other['ranks']} rank(s) and node 0 {mine['ranks']}: every node must run as "
                         "many (same GPUs, SFT_GPUS, SFT_CPU_RANKS)")
    if not lines:
        return None
    return "the nodes do not run the same job, so none starts:\n" + "\n".join(f"  - {line}" for line in lines)


def _changed(mine: dict[str, Any], other: dict[str, Any], name) -> str:
    keys = [k for k in sorted(set(mine) | set(other)) if mine.get(k) != other.get(k)]
    return ", ".join(f"{name(k)}={other.get(k)!r} (node 0: {mine.get(k)!r})" for k in keys)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- one output folder --------------------------------------------------------------------------


def write_marker(out: Path) -> str:
    """Node 0 writes a fresh random token into the output folder; the other nodes must read it there."""
    token = secrets.token_hex(16)
    write_json(out / "run" / MARKER, {"token": token})
    return token


def marker_seen(out: Path, token: str, timeout_s: float) -> bool:
    """Whether node 0's token shows up in this node's view of the output folder within the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = read_json(out / "run" / MARKER)
        if found and found.get("token") == token:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)  # a network filesystem may show a new file only after its attribute cache expires


def unshared(s: Settings, nodes: Iterable[int]) -> str | None:
    nodes = list(nodes)
    if not nodes:
        return None
    return (f"SFT_OUTPUT_DIR is not shared between the nodes: node(s) {', '.join(map(str, nodes))} did not see, "
            f"within {s.node_timeout_seconds} s, the file node 0 wrote there ({s.output_dir}/run/{MARKER}). Every "
            f"rank writes its checkpoint shard into the same folder, so mount one shared filesystem (NFS, a "
            f"ReadWriteMany volume, Lustre) at SFT_OUTPUT_DIR on every node")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
