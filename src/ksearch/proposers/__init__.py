"""Proposers write tree edits and kernels: ``patterns`` (offline, from knowledge packs); ``llm`` later."""

from ksearch.proposers.base import Proposer, get_proposer

__all__ = ["Proposer", "get_proposer"]
