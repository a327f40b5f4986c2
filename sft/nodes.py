"""Which machines take part in the job, read the way torchrun, Kubernetes and SLURM describe them.

    NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT     torchrun's names; or its PET_NNODES, PET_NODE_RANK, ...
                                                    (what Kubeflow's PyTorchJob sets in each pod)
    SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST  inside `srun` when NNODES is not set
    neither                                         one node: the same code with NNODES=1

These variables keep their own names (never SFT_): schedulers set them. Their problems are reported
with the SFT_* ones (sft/settings.py), before anything runs.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Mapping

DEFAULT_PORT = 29500  # torchrun's own default for --master-port
VARIABLES = {
    "NNODES": "Number of machines (nodes) in the job; default 1. NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT "
              "are also read as torchrun's PET_NNODES, ... (which Kubeflow's PyTorchJob sets).",
    "NODE_RANK": "This machine's index, 0 to NNODES-1; node 0 decides, writes the reports and uploads.",
    "MASTER_ADDR": "Address of node 0, reachable from every node; needed when NNODES > 1.",
    "MASTER_PORT": f"Port of node 0 for torchrun's rendezvous (default {DEFAULT_PORT}); the job's controllers "
                   "use the next one up.",
    "SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST": "Read under srun when NNODES is unset: the node count, "
                                                      "this node's index, node 0 = the list's first host.",
}


@dataclass(frozen=True)
class Nodes:
    """The machines of one job and this one's place among them."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None on one node: each launch picks a free port (two jobs can share a machine)

    @property
    def leads(self) -> bool:
        """Node 0 decides, writes run/ and uploads; the others follow its launches."""
        return self.node_rank == 0

    @property
    def store_port(self) -> int:
        """The controllers' own store, next to torchrun's rendezvous port."""
        return (self.master_port or DEFAULT_PORT) + 1

    def describe(self) -> str:
        return f"node {self.node_rank} of {self.nnodes}, node 0 at {self.master_addr}:{self.master_port}"


class NodesError(Exception):
    """The node variables are wrong: one line per problem, as the settings report them."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def from_env(environ: Mapping[str, str]) -> Nodes:
    """The nodes as the environment describes them; raises NodesError listing every problem."""
    if _given(environ, _torchrun(environ, "NNODES")) or not _given(environ, "SLURM_NNODES"):
        names = tuple(_torchrun(environ, name) for name in ("NNODES", "NODE_RANK", "MASTER_ADDR"))
        raw = {name: environ.get(name, "").strip() for name in names}
    else:
        names = ("SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST")
        raw = {name: environ.get(name, "").strip() for name in names}
        raw["SLURM_JOB_NODELIST"] = first_host(raw["SLURM_JOB_NODELIST"])
        addr = _torchrun(environ, "MASTER_ADDR")
        if _given(environ, addr):  # e.g. node 0's address on the fast network, not its host name
            names, raw[addr] = names[:2] + (addr,), environ[addr].strip()
    count_var, rank_var, addr_var = names
    problems: list[str] = []
    nnodes = _whole(count_var, raw[count_var] or "1", 1, problems)
    node_rank = _whole(rank_var, raw[rank_var] or "0", 0, problems)
    if nnodes is not None and node_rank is not None and node_rank >= nnodes:
        problems.append(f"{rank_var}={raw[rank_var]!r}: expected 0 to {nnodes - 1} ({count_var}={nnodes})")
    port_var = _torchrun(environ, "MASTER_PORT")
    port = _port(port_var, environ.get(port_var, "").strip(), problems)
    if nnodes is not None and nnodes > 1 and not raw[addr_var]:
        problems.append(f"{addr_var}: not set; with {count_var}={nnodes} every node needs node 0's address")
    if problems:
        raise NodesError(problems)
    if nnodes == 1:
        return Nodes(master_port=port)
    return Nodes(nnodes, node_rank, raw[addr_var], port or DEFAULT_PORT)


def problems(environ: Mapping[str, str], launcher: str) -> list[str]:
    """Every problem with the node variables, and with the launcher for several nodes ([] when fine)."""
    try:
        nodes = from_env(environ)
    except NodesError as e:
        return e.problems
    if nodes.nnodes > 1 and launcher == "deepspeed":
        # The deepspeed launcher starts remote nodes itself, over ssh from a hostfile; here each node
        # starts its own ranks, which is what torchrun's static rendezvous does.
        return [f"SFT_LAUNCHER='deepspeed': with {nodes.nnodes} nodes use SFT_LAUNCHER=torchrun (the deepspeed "
                "launcher needs a hostfile and ssh between the machines)"]
    return []


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[01-04,07],cpu3' -> 'gpu01', 'a[1-2]-ib' -> 'a1-ib'."""
    depth, end = 0, len(nodelist)
    for i, char in enumerate(nodelist):  # the first entry ends at the first comma outside brackets
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = i
            break
    # each bracket holds ranges "01-04,07": its first value is the text before the first , or -
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], nodelist[:end])


def _torchrun(environ: Mapping[str, str], name: str) -> str:
    """NAME, or torchrun's PET_NAME where only that one is set."""
    return "PET_" + name if not _given(environ, name) and _given(environ, "PET_" + name) else name


def _given(environ: Mapping[str, str], name: str) -> bool:
    return bool(environ.get(name, "").strip())


def _whole(name: str, raw: str, least: int, problems: list[str]) -> int | None:
    try:
        value = int(raw)
    except ValueError:
        problems.append(f"{name}={raw!r}: expected a whole number")
        return None
    if value < least:
        problems.append(f"{name}={raw!r}: expected at least {least}")
        return None
    return value


def _port(name: str, raw: str, problems: list[str]) -> int | None:
    if not raw:
        return None
    # the controllers listen on MASTER_PORT + 1, which must be a port too
    if not raw.isdigit() or not 1 <= int(raw) <= 65534:
        problems.append(f"{name}={raw!r}: expected a port number from 1 to 65534")
        return None
    return int(raw)


def free_port() -> int:
    """A TCP port free on this machine now (a one-node job's rendezvous, the all-reduce test's)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
