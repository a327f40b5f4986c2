"""The command line: the server as a process of its own (``python -m hubserver`` with tests/ on the
path), for code under test that runs in another process or a container.

    python -m hubserver --port 0 --root /tmp/hub [--port-file /tmp/hub.port] \
        [--token hf_xxx=alice:write] [--tokens-file tokens.json] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path

from .common import LFS_THRESHOLD
from .server import HubServer


def _parse_tokens(args) -> dict | None:
    if not args.token and not args.tokens_file:
        return None  # DEFAULT_TOKENS
    tokens = json.loads(Path(args.tokens_file).read_text()) if args.tokens_file else {}
    for spec in args.token:
        token, _, rest = spec.partition("=")
        user, _, role = rest.partition(":")
        if not token or not user:
            raise SystemExit(f"--token expects TOKEN=USER[:ROLE], got {spec.split('=')[0][:4]}...")
        tokens[token] = {"user": user, "role": role or "write"}
    return tokens


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hubserver",
                                     description="Local fake of the Hugging Face Hub HTTP API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--root", required=True, help="directory holding the repos")
    parser.add_argument("--port-file", help="write the chosen port to this file once listening")
    parser.add_argument("--token", action="append", default=[], help="TOKEN=USER[:read|write], repeatable")
    parser.add_argument("--tokens-file", help='JSON {"TOKEN": {"user": ..., "role": ..., "orgs": [...]}}')
    parser.add_argument("--lfs-threshold", type=int, default=LFS_THRESHOLD)
    parser.add_argument("--verbose", action="store_true", help="one stderr line per request")
    args = parser.parse_args(argv)

    server = HubServer(args.root, tokens=_parse_tokens(args), host=args.host, port=args.port,
                       lfs_threshold=args.lfs_threshold, verbose=args.verbose).start()  # fmt: skip
    print(f"hubserver listening on {server.url} (port {server.port}, root {args.root})", flush=True)
    if args.port_file:  # written atomically so a poller never reads a half-written port
        tmp = f"{args.port_file}.tmp"
        Path(tmp).write_text(f"{server.port}\n")
        os.replace(tmp, args.port_file)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    server.stop()
    return 0
