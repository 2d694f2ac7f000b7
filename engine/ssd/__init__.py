"""Asynchronous speculative speculative decoding (SSD / Saguaro): the draft worker and what it needs.

A token's path: engine.strategies.ssd (target) -> channel (in process, or process + transport) ->
draft_worker (speculation_cache, tree, backups, policy) -> back to the target's verifier.
"""

from engine.ssd.messages import MalformedMessage
from engine.ssd.transport import DraftUnavailable

__all__ = ["DraftUnavailable", "MalformedMessage"]
