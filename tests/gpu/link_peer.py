"""The draft's side of the link test, importable by a "spawn" child: join, echo every message back, then leave."""

import torch

from engine.ssd.transport import DRAFT_RANK, connect, join_store

TIMEOUT_S = 60.0


def echo(address: str, device: str, messages: int) -> None:
    endpoint = connect(join_store(address, TIMEOUT_S), DRAFT_RANK, torch.device(device), TIMEOUT_S)
    try:
        for _ in range(messages):
            endpoint.send(endpoint.recv(TIMEOUT_S), TIMEOUT_S)
    finally:
        endpoint.close()
