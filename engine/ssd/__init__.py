"""Asynchronous speculative speculative decoding (SSD / Saguaro): the draft worker and what it needs.

A token's path: engine.strategies.ssd (target) -> channel (in process, or a worker process over a transport)
-> draft_worker (speculation_cache, tree, backups, policy) -> back to the target's verifier. README.md maps
the files.
"""

from engine.ssd.messages import MalformedMessage
from engine.ssd.transport import DraftUnavailable

__all__ = ["DraftUnavailable", "MalformedMessage"]
