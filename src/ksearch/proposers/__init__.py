"""Proposers write tree edits and kernels: ``patterns`` (offline, from knowledge packs) and ``llm`` (a planner and a
coder model; the package `ksearch.proposers.llm`)."""

from ksearch.proposers.base import Proposer, get_proposer

__all__ = ["Proposer", "get_proposer"]
