"""Search: the world model (a decision tree of optimization plans), its edits, and strategies."""

from ksearch.search.edits import Delete, EditResult, Insert, NodeSpec, Split, Update, apply, parse_edit
from ksearch.search.strategy import (
    Decision,
    SearchState,
    StrategyConfig,
    decide,
    revise,
    score,
    select,
    update_state,
)
from ksearch.search.worldmodel import (
    ROOT_ID,
    Action,
    EvalSummary,
    Impacts,
    Node,
    NodeStatus,
    Tree,
    attach,
)

__all__ = [
    "ROOT_ID",
    "Action",
    "Decision",
    "Delete",
    "EditResult",
    "EvalSummary",
    "Impacts",
    "Insert",
    "Node",
    "NodeSpec",
    "NodeStatus",
    "SearchState",
    "Split",
    "StrategyConfig",
    "Tree",
    "Update",
    "apply",
    "attach",
    "decide",
    "parse_edit",
    "revise",
    "score",
    "select",
    "update_state",
]
