"""The draft's side of the NCCL round-trip test, importable by a "spawn" child: join, echo one message."""

import torch

from engine.ssd.transport import Endpoint

TIMEOUT_S = 60.0


def echo(address: str, device: str) -> None:
    endpoint = Endpoint.connect(address, torch.device(device), TIMEOUT_S)
    try:
        endpoint.send(endpoint.recv(TIMEOUT_S), TIMEOUT_S)
    finally:
        endpoint.close()
