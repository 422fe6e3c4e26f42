"""Where this call runs inside a multi-node parallel job: ``batchfutures.node()``.

    executor.with_settings(nodes=N).submit(fn, ...)
        -> one Batch multi-node parallel job; every node runs ``python -m batchfutures.worker``
        -> Batch (or the emulator) gives each node AWS_BATCH_JOB_NODE_INDEX, _NUM_NODES,
           _MAIN_NODE_INDEX and, on every node but the main one, _MAIN_NODE_PRIVATE_IPV4_ADDRESS
        -> inside fn, node() reads them: NodeInfo(index, count, main_index, main_address)

The main node is not told its own address (Batch sets the variable on the other nodes only), so
there it is found here: on AWS (an ECS container, which has ECS_CONTAINER_METADATA_URI_V4 or
ECS_CONTAINER_METADATA_URI) the task's private IPv4 address from the ECS task metadata endpoint
(``Networks[0].IPv4Addresses[0]`` of the container's metadata: multi-node tasks use awsvpc
networking, so it is the address the other nodes are given and the one a server socket must
bind), else the address its host name resolves to; anywhere else (the local emulator, whose
nodes all run on this machine and are told 127.0.0.1) ``127.0.0.1``.

Outside a multi-node job (a plain job, an array child, a direct call of fn) node() describes a
job of one node: index 0 of 1, main node 0 at 127.0.0.1, so fn runs unchanged there too.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping, Optional

__all__ = ["NodeInfo", "node", "LOCAL_ADDRESS"]

INDEX = "AWS_BATCH_JOB_NODE_INDEX"
COUNT = "AWS_BATCH_JOB_NUM_NODES"
MAIN_INDEX = "AWS_BATCH_JOB_MAIN_NODE_INDEX"
MAIN_ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
LOCAL_ADDRESS = "127.0.0.1"
_ECS_MARKERS = ("ECS_CONTAINER_METADATA_URI_V4", "ECS_CONTAINER_METADATA_URI")
METADATA_TIMEOUT = 2.0  # seconds: the endpoint is on the task's own link-local network


@dataclass(frozen=True)
class NodeInfo:
    """One node of a multi-node parallel job, as Batch describes it to the node."""

    index: int          # this node's index, 0..count-1
    count: int          # the job's number of nodes
    main_index: int     # the main node's index (the node whose end decides the job)
    main_address: str   # the main node's private IPv4 address

    @property
    def is_main(self) -> bool:
        return self.index == self.main_index


def node(environ: Optional[Mapping[str, str]] = None) -> NodeInfo:
    """This node's place in its multi-node job (see the module doc); ``environ``: os.environ."""
    env = os.environ if environ is None else environ
    if not env.get(INDEX):
        return NodeInfo(0, 1, 0, LOCAL_ADDRESS)
    index = _integer(env, INDEX)
    main_index = _integer(env, MAIN_INDEX, default=0)
    info = NodeInfo(index=index, count=_integer(env, COUNT, default=index + 1),
                    main_index=main_index, main_address=env.get(MAIN_ADDRESS) or "")
    if not info.main_address:  # the main node itself
        info = NodeInfo(info.index, info.count, info.main_index, own_address(env))
    return info


def own_address(environ: Mapping[str, str]) -> str:
    """The main node's address as the other nodes know it (see the module doc)."""
    uris = [environ[name] for name in _ECS_MARKERS if environ.get(name)]
    if not uris:
        return LOCAL_ADDRESS
    address = task_address(uris[0])
    if address is not None:
        return address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:  # no resolvable host name: the loopback still serves this node's own use
        return LOCAL_ADDRESS


def task_address(metadata_uri: str) -> Optional[str]:
    """The container's private IPv4 address from ECS task metadata (v4, or v3: the same
    ``Networks`` entries); None when the endpoint does not answer with one."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with opener.open(metadata_uri.rstrip("/"), timeout=METADATA_TIMEOUT) as response:
            metadata: Any = json.loads(response.read())
    except (OSError, ValueError):
        return None
    networks = metadata.get("Networks") if isinstance(metadata, dict) else None
    for network in networks if isinstance(networks, list) else []:
        addresses = network.get("IPv4Addresses") if isinstance(network, dict) else None
        for address in addresses if isinstance(addresses, list) else []:
            try:
                if ipaddress.ip_address(address).version == 4:
                    return str(address)
            except (TypeError, ValueError):
                continue
    return None


def _integer(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    raw = env.get(name)
    if not raw:
        if default is None:
            raise RuntimeError(f"{name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError(f"{name}={raw!r} is not an integer") from None
