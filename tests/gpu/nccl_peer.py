"""The draft's side of the NCCL round-trip test, importable by a "spawn" child: join, echo one message."""

import torch

from engine.ssd.transport import DRAFT_RANK, connect, join_store

TIMEOUT_S = 60.0


def echo(address: str, device: str) -> None:
    endpoint = connect(join_store(address, TIMEOUT_S), DRAFT_RANK, torch.device(device), TIMEOUT_S)
    try:
        endpoint.send(endpoint.recv(TIMEOUT_S), TIMEOUT_S)
    finally:
        endpoint.close()
