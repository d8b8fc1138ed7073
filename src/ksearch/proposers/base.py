"""The proposer contract: the planner's edits and the coder's kernels, as plain records.

A proposer is stateless between calls: everything it needs to continue is in the tree (node payloads), so a
resumed run asks it the same questions and gets the same answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ksearch.errors import SearchError
from ksearch.records import Candidate, Evaluation
from ksearch.search.edits import Edit
from ksearch.search.strategy import SearchState
from ksearch.search.worldmodel import Tree

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec
    from ksearch.llm.settings import LLMSettings
    from ksearch.search.strategy import StrategyConfig
    from ksearch.store.db import Store
    from ksearch.tasks.loader import Task


class Proposer(Protocol):
    name: str

    def initial_edits(self, tree: Tree) -> list[Edit]:
        """Edits that build the first tree under the (measured) root: competing kernel families and open
        actions."""

    def propose(self, tree: Tree, node_id: str, parent: Candidate | None) -> Candidate:
        """The kernel for an open node: the node's action applied to its parent's kernel (``parent``; None
        means the task's naive kernel). Raises KnowledgeError when it cannot render one."""

    def refine(self, tree: Tree, node_id: str, state: SearchState,
               evaluation: Evaluation | None = None) -> list[Edit]:
        """Edits after ``node_id`` was evaluated and attached: new open actions under it, ratings and
        confidences revised from the evidence. ``evaluation``: the judge's verdict on the node's kernel this step
        (the step, and with it the evaluation, is written to the store after the refinement), None when the
        step judged nothing new."""

    def expand(self, tree: Tree, state: SearchState) -> list[Edit]:
        """Edits when nothing on the frontier can be chosen: new actions, or [] when the ideas are spent."""


def get_proposer(name: str, task: Task, target: str, hardware: HardwareSpec | None, settings: LLMSettings | None = None,
                 store: Store | None = None, strategy: StrategyConfig | None = None,
                 workloads: list[str] | None = None, progress: Callable[[str], object] | None = None) -> Proposer:
    """The proposer called ``name`` for (task, target). ``settings``: the llm proposer's `LLMSettings`;
    ``store``: the run's store (the llm proposer logs its calls there and replays them on resume);
    ``strategy``: the run's StrategyConfig; ``workloads``: the run's workload selection (None: all), the only
    ones the llm proposer's prompts list; ``progress``: told each llm call as it starts.

    Raises SearchError naming the known proposers; ConfigError (ksearch.errors) for unusable llm settings."""
    if name == "patterns":
        from ksearch.proposers.patterns import PatternsProposer

        return PatternsProposer(task, target, hardware)
    if name == "llm":
        if settings is None:
            raise SearchError("the llm proposer needs a model: --model NAME (and --base-url for a local server)")
        from ksearch.proposers.llm.factory import build_llm_proposer

        return build_llm_proposer(task, target, hardware, settings, store, strategy, workloads, progress)
    raise SearchError(f"unknown proposer {name!r}; known: patterns (offline, from the knowledge packs), llm")
