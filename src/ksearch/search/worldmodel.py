"""The world model: a decision tree of optimization plans, as immutable records.

Every root-to-leaf path is a complete optimization plan; the children of a node are competing
alternatives for the next decision (e.g. *state placement*: registers / shared memory / global).
The root stands for the baseline kernel; its children are the competing *kernel families*
(first-level *branches*).

Who writes what:

- the planner (an LLM or the offline patterns proposer) edits the tree only through the validated
  edit records of `ksearch.search.edits` (insert, update, split, delete);
- the controller records what was measured with `attach` (sets candidate, evaluation and status).

An attached candidate can never be overwritten or detached. Trees are values: every operation returns
a new `Tree` and leaves its argument unchanged.

Node status, and what each one means:

- ``open``: not tried yet; the only status `ksearch.search.strategy.select` picks.
- ``solved``: tried, a passing candidate is attached and it is at least as fast as its parent's.
- ``regressed``: tried, a passing candidate is attached but it is slower than its parent's candidate.
  Recorded as a regression, never as progress (it never becomes the best node).
- ``failed``: tried, no attempt passed. Terminal; the planner may insert an easier variant.
- ``dropped``: removed by the planner (delete or split) before it was tried; kept for the record.

A node whose kernel is being judged (a search with several evaluations in flight, `Tree.in_flight`) stays
``open`` until its evaluation is attached, but is off the frontier, and edits treat it as tried: it cannot be
deleted, split or moved, and its decision, choice and action are the ones its kernel was written for.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from ksearch.errors import SearchError

#: Id of the root node (the baseline kernel).
ROOT_ID = "root"

#: Evaluation status string of a passing candidate (same spelling as ``ksearch.records.Status``).
PASSED = "PASSED"


class NodeStatus(str, Enum):
    """Where a node stands; see the module docstring for the meaning of each value."""

    OPEN = "open"
    SOLVED = "solved"
    FAILED = "failed"
    REGRESSED = "regressed"
    DROPPED = "dropped"


#: Statuses whose node holds a passing candidate (its code is a valid starting point for children).
PASSING = frozenset({NodeStatus.SOLVED, NodeStatus.REGRESSED})


class Record(BaseModel):
    """Base of world-model records: immutable, unknown keys rejected, JSON round-trip exact."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)


class Impacts(Record):
    """Predicted effect of an action on the kernel's bottlenecks, each rated 0 (bad) to 10 (good).

    Attributes:
        memory_bandwidth: 0-10, how much the action helps use DRAM bandwidth (10: reaches the roof).
        register_pressure: 0-10, how well the action keeps register pressure in check (10: no spills,
            high occupancy; 0: spills certain).
        hw_fit: 0-10, fit to the compute units and hardware limits (SIMD width, shared memory,
            special-function rate).
        notes: free text: the reasoning or the risk behind the ratings.
    """

    memory_bandwidth: float = Field(default=5.0, ge=0, le=10)
    register_pressure: float = Field(default=5.0, ge=0, le=10)
    hw_fit: float = Field(default=5.0, ge=0, le=10)
    notes: str = ""


class Action(Record):
    """What to do to the parent's kernel to realise a node's choice.

    Attributes:
        title: short imperative name, e.g. "keep the scan state in registers". Also the action's
            identity for the failure cooldown (compared case- and space-insensitively).
        description: what to change, precise enough for a coder.
        difficulty: 1 (a knob change) to 5 (a rewrite with new synchronization).
        expected_speedup: predicted speedup of this node's candidate over its parent's, a factor > 0
            (1.0: no change), or None when the planner gave no number.
    """

    title: str = Field(min_length=1)
    description: str = ""
    difficulty: int = Field(default=3, ge=1, le=5)
    expected_speedup: float | None = Field(default=None, gt=0)


class EvalSummary(Record):
    """What the controller measured for the candidate attached to a node.

    Attributes:
        status: the evaluation's overall status, spelled as ``ksearch.records.Status``
            ("PASSED", "COMPILE_ERROR", "INCORRECT_NUMERICAL", ...).
        score: geometric-mean speedup over the baseline across workloads (> 0, 1.0 = baseline), or
            None when the candidate did not pass.
        latency_ms: per-workload median latency in milliseconds, keyed by workload id.
        vs_parent: the verdict of the candidate against its parent's kernel timed beside it
            (``faster`` | ``slower`` | ``tie``: a difference inside the interval is a tie), or None
            when it was not timed beside its parent (then the scores decide, as before).
        vs_best: the same against the best kernel when the candidate was judged (None: not timed beside it).
        intervals: reference role -> [ratio, low, high] of reference time / candidate time over the timed
            workloads (geometric mean; low/high the confidence interval, None when unbounded).
    """

    status: str
    score: float | None = Field(default=None, gt=0)
    latency_ms: dict[str, float] = Field(default_factory=dict)
    vs_parent: Literal["faster", "slower", "tie"] | None = None
    vs_best: Literal["faster", "slower", "tie"] | None = None
    intervals: dict[str, list[float | None]] = Field(default_factory=dict)
    #: judgments of this kernel before this one (0: the first; a re-time the planner asked for adds one)
    round: int = Field(default=0, ge=0)
    #: the score the previous judgment of this kernel measured (None on the first)
    previous_score: float | None = None

    @property
    def paired(self) -> bool:
        """True when the decisions about this candidate were made on paired timings."""
        return self.vs_parent is not None or self.vs_best is not None

    @property
    def passed(self) -> bool:
        """True when the candidate passed every workload and has a score."""
        return self.status == PASSED and self.score is not None

    @model_validator(mode="after")
    def _check(self) -> EvalSummary:
        if self.status == PASSED and self.score is None:
            raise ValueError("a PASSED evaluation needs a score (geometric-mean speedup > 0)")
        return self


class Node(Record):
    """One decision in the world model, with the candidate that realised it (if any).

    Attributes:
        id: unique within the tree; ``"root"`` for the root.
        parent_id: the parent's id; None only for the root.
        decision: the question this node answers, e.g. "state placement".
        choice: the answer it stands for, e.g. "registers". On first-level nodes, the kernel family.
        action: what to do to the parent's kernel; None only for the root.
        rating: 0-10, the planner's overall estimate of how good this choice is.
        confidence: 0-1, how sure the planner is of the rating (0: a guess, 1: measured).
        impacts: predicted effect on the bottlenecks.
        candidate_id: the attached candidate's content hash; None while open (or failed with no
            candidate worth keeping). Set only by `attach`, never by an edit.
        evaluation: the attached candidate's evaluation summary; set only by `attach`.
        status: see `NodeStatus`; set only by `attach` and by delete/split.
        attempts: code-generation attempts spent on this node (>= 0).
        payload: free data for the proposer, e.g. the knob values this node stands for.
    """

    id: str = Field(pattern=r"^[A-Za-z0-9_.:\-]{1,64}$")
    parent_id: str | None = None
    decision: str = ""
    choice: str = ""
    action: Action | None = None
    rating: float = Field(default=5.0, ge=0, le=10)
    confidence: float = Field(default=0.5, ge=0, le=1)
    impacts: Impacts = Field(default_factory=Impacts)
    candidate_id: str | None = None
    evaluation: EvalSummary | None = None
    status: NodeStatus = NodeStatus.OPEN
    attempts: int = Field(default=0, ge=0)
    payload: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Node:
        if (self.id == ROOT_ID) != (self.parent_id is None):
            raise ValueError(f"only the root has no parent (id {self.id!r}, parent_id {self.parent_id!r})")
        if self.id != ROOT_ID and self.action is None:
            raise ValueError(f"node {self.id!r} needs an action")
        s = self.status
        if s in (NodeStatus.OPEN, NodeStatus.DROPPED) and (self.candidate_id or self.evaluation):
            raise ValueError(f"node {self.id!r} is {s.value} but has a candidate or an evaluation")
        if s in PASSING and not (self.candidate_id and self.evaluation and self.evaluation.passed):
            raise ValueError(f"node {self.id!r} is {s.value} but has no passing candidate")
        if s == NodeStatus.FAILED and (self.evaluation is None or self.evaluation.passed):
            raise ValueError(f"node {self.id!r} is failed but has no failing evaluation")
        return self

    @property
    def difficulty(self) -> int:
        """The action's difficulty 1-5 (1 for the root)."""
        return self.action.difficulty if self.action else 1

    @property
    def label(self) -> str:
        """A short human name: the choice, else the action title, else the id."""
        return self.choice or (self.action.title if self.action else "") or self.id


class Tree(Record):
    """The world model: nodes in insertion order, the root first.

    Attributes:
        nodes: every node ever created (dropped ones included), parents before children at creation.
        next_seq: counter for generated ids (``n<seq>``); only grows.
        retime: ids of tried nodes whose candidates are to be judged again (the planner's request).
        chosen: the open node the planner named to try next, or None (the strategy chooses).
        in_flight: node id -> id of the candidate being judged for it (dispatched, not yet attached; a re-time
            in flight names a tried node). A resumed run judges these candidates first.

    Raises:
        pydantic.ValidationError: on duplicate ids, a missing or second root, an unknown parent, a
            cycle, or a child under a dropped node that is not itself dropped.
    """

    nodes: tuple[Node, ...]
    next_seq: int = Field(default=1, ge=1)
    #: tried nodes whose kernels the planner asked to time again (`ksearch.search.edits.Retime`), in order
    retime: tuple[str, ...] = ()
    #: the open node the planner asked to try next (`ksearch.search.edits.Choose`); cleared when it is tried
    chosen: str | None = None
    #: nodes whose candidates are being judged (node id -> candidate id), set by the controller
    in_flight: dict[str, str] = Field(default_factory=dict)
    _index: dict[str, Node] = PrivateAttr(default_factory=dict)
    _children: dict[str, list[str]] = PrivateAttr(default_factory=dict)

    @classmethod
    def new(cls, decision: str = "baseline", choice: str = "baseline", **fields: Any) -> Tree:
        """Make a tree holding only an open root (the baseline kernel, not measured yet)."""
        return cls(nodes=(Node(id=ROOT_ID, decision=decision, choice=choice, **fields),))

    @model_validator(mode="after")
    def _check_structure(self) -> Tree:
        index: dict[str, Node] = {}
        for n in self.nodes:
            if n.id in index:
                raise ValueError(f"duplicate node id {n.id!r}")
            index[n.id] = n
        if ROOT_ID not in index:
            raise ValueError("the tree has no root node 'root'")
        children: dict[str, list[str]] = {i: [] for i in index}
        for n in self.nodes:
            if n.parent_id is not None:
                if n.parent_id not in index:
                    raise ValueError(f"node {n.id!r} has unknown parent {n.parent_id!r}")
                children[n.parent_id].append(n.id)
                parent = index[n.parent_id]
                if parent.status == NodeStatus.DROPPED and n.status != NodeStatus.DROPPED:
                    raise ValueError(f"node {n.id!r} lives under dropped node {parent.id!r}")
        for n in self.nodes:  # every walk up must reach the root within len(nodes) steps
            cur, steps = n, 0
            while cur.parent_id is not None:
                cur, steps = index[cur.parent_id], steps + 1
                if steps > len(self.nodes):
                    raise ValueError(f"cycle through node {n.id!r}")
        for nid in self.in_flight:
            if nid not in index:
                raise ValueError(f"node {nid!r} is in flight but not in the tree")
        self._index, self._children = index, children
        return self

    # ---- queries -------------------------------------------------------------------------------

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._index

    def __getitem__(self, node_id: str) -> Node:
        """The node with this id. Raises SearchError naming the id when it is unknown."""
        try:
            return self._index[node_id]
        except KeyError:
            raise SearchError(f"unknown node id {node_id!r}") from None

    def __iter__(self) -> Iterator[Node]:  # type: ignore[override]
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def root(self) -> Node:
        return self._index[ROOT_ID]

    def children(self, node_id: str, *, live: bool = False) -> list[Node]:
        """Children of a node in insertion order; ``live=True`` leaves out dropped ones."""
        self[node_id]
        kids = [self._index[i] for i in self._children[node_id]]
        return [k for k in kids if k.status != NodeStatus.DROPPED] if live else kids

    def siblings(self, node_id: str, *, live: bool = False) -> list[Node]:
        """The other children of the node's parent (empty for the root)."""
        parent = self[node_id].parent_id
        return [] if parent is None else [s for s in self.children(parent, live=live) if s.id != node_id]

    def path(self, node_id: str) -> list[Node]:
        """Nodes from the root to ``node_id``, both included: the plan this node completes."""
        out = [self[node_id]]
        while out[-1].parent_id is not None:
            out.append(self._index[out[-1].parent_id])
        return out[::-1]

    def depth(self, node_id: str) -> int:
        """0 for the root, 1 for a first-level node (a kernel family), and so on."""
        return len(self.path(node_id)) - 1

    def subtree(self, node_id: str) -> list[Node]:
        """The node and all its descendants, parents before children."""
        out, todo = [], [node_id]
        while todo:
            nid = todo.pop(0)
            out.append(self[nid])
            todo.extend(self._children[nid])
        return out

    def branch_of(self, node_id: str) -> str | None:
        """Id of the first-level ancestor (the node itself at depth 1); None for the root."""
        path = self.path(node_id)
        return path[1].id if len(path) > 1 else None

    def frontier(self) -> list[Node]:
        """Open nodes that can be tried now, in insertion order.

        A node is on the frontier when it is open and its parent is the root or holds a passing
        candidate (solved or regressed): its action is applied to the parent's code, so that code
        must exist and be correct. A regressed parent counts: its candidate is correct, and a
        follow-up step may recover the loss (e.g. a layout change that makes vectorization
        possible); the strategy's path-quality term discounts it. Children of open, failed or
        dropped nodes wait, and so do nodes whose kernels are being judged (`in_flight`).
        """
        out = []
        for n in self.nodes:
            if n.status != NodeStatus.OPEN or n.parent_id is None or n.id in self.in_flight:
                continue
            parent = self._index[n.parent_id]
            if parent.id == ROOT_ID or parent.status in PASSING:
                out.append(n)
        return out

    def score_of(self, node_id: str) -> float | None:
        """The node's measured score (speedup over baseline), 1.0 for an unmeasured root, else None."""
        n = self[node_id]
        if n.evaluation is not None and n.evaluation.passed:
            return n.evaluation.score
        return 1.0 if n.id == ROOT_ID else None

    def parent_score(self, node_id: str) -> float | None:
        """The score a node's candidate is compared with to detect a regression (see `score_of`)."""
        parent = self[node_id].parent_id
        return None if parent is None else self.score_of(parent)

    def best(self) -> Node | None:
        """The solved node with the highest score (earliest on ties), the measured root included;
        None when nothing is solved. Regressed nodes never count, and neither does a node judged
        beside the best of its time that was not found faster than it (``vs_best`` tie or slower:
        its score, derived from that best's, may still come out a little higher)."""
        best, best_score = None, 0.0
        for n in self.nodes:
            if n.status == NodeStatus.SOLVED and n.evaluation is not None and \
                    n.evaluation.vs_best in (None, "faster"):
                if best is None or n.evaluation.score > best_score:  # type: ignore[operator]
                    best, best_score = n, n.evaluation.score  # type: ignore[assignment]
        return best

    def replace(self, *nodes: Node, next_seq: int | None = None, **fields: Any) -> Tree:
        """A new tree with these nodes replacing same-id ones, new ids appended (validated); ``fields``: other
        tree fields to set (retime, chosen, in_flight), the rest kept."""
        new = {n.id: n for n in nodes}
        kept = tuple(new.pop(n.id, n) for n in self.nodes)
        keep = {"retime": self.retime, "chosen": self.chosen, "in_flight": self.in_flight, **fields}
        return Tree(nodes=kept + tuple(new.values()), next_seq=next_seq or self.next_seq, **keep)


def attach(
    tree: Tree,
    node_id: str,
    candidate_id: str | None,
    evaluation: EvalSummary,
    parent_score: float | None = None,
    *,
    attempts: int = 1,
) -> Tree:
    """Record what the controller measured for a node (the planner never calls this).

    Sets the node's candidate, evaluation and status: ``failed`` when the evaluation did not pass,
    ``regressed`` when it passed but is slower than its parent (paired timings: the verdict
    ``vs_parent == "slower"``, a tie is never a regression; unpaired: a score below
    ``parent_score``), else ``solved``. The root may be attached too (the baseline; it is never a
    regression).

    Args:
        tree: the world model.
        node_id: an open node (or the unmeasured root).
        candidate_id: the candidate's content hash; required when the evaluation passed, optional
            (the best failing attempt, for the record) when it did not.
        evaluation: the candidate's evaluation summary.
        parent_score: the parent's score (speedup over baseline) to compare with; None takes it from
            the tree (`Tree.parent_score`: the parent's measured score, 1.0 for an unmeasured root).
        attempts: code-generation attempts spent in this cycle, added to the node's count.

    Returns:
        The new tree.

    Raises:
        SearchError: unknown node, a node that is not open (an attached candidate is never
            overwritten), or a passing evaluation without a candidate id.
    """
    node = tree[node_id]
    if node.status != NodeStatus.OPEN or node.candidate_id is not None or node.evaluation is not None:
        raise SearchError(
            f"node {node_id!r} is {node.status.value} with candidate {node.candidate_id!r}; "
            "an attached candidate is never overwritten"
        )
    if evaluation.passed and not candidate_id:
        raise SearchError(f"a passing evaluation on node {node_id!r} needs a candidate id")
    if parent_score is None and node.parent_id is not None:
        parent_score = tree.parent_score(node_id)
    if not evaluation.passed:
        status = NodeStatus.FAILED
    elif evaluation.vs_parent is not None:
        status = NodeStatus.REGRESSED if evaluation.vs_parent == "slower" else NodeStatus.SOLVED
    elif parent_score is not None and evaluation.score < parent_score:  # type: ignore[operator]
        status = NodeStatus.REGRESSED
    else:
        status = NodeStatus.SOLVED
    new = node.model_copy(
        update=dict(
            candidate_id=candidate_id,
            evaluation=evaluation,
            status=status,
            attempts=node.attempts + max(0, attempts),
        )
    )
    chosen = None if tree.chosen == node_id else tree.chosen
    return tree.replace(Node.model_validate(new.model_dump()), chosen=chosen)


def retimed(tree: Tree, node_id: str, candidate_id: str, evaluation: EvalSummary) -> Tree:
    """Record a fresh measurement of a tried node's kernel (the planner's re-time request, taken off
    ``tree.retime``): its evaluation is replaced by the new one and its status follows it as in `attach`
    (failed, regressed against its parent, or solved). The candidate stays the same.

    Raises:
        SearchError: unknown node, or one without this attached candidate.
    """
    node = tree[node_id]
    if node.candidate_id != candidate_id or node.status not in (NodeStatus.SOLVED, NodeStatus.REGRESSED,
                                                                NodeStatus.FAILED):
        raise SearchError(f"node {node_id!r} ({node.status.value}, candidate {node.candidate_id!r}) cannot be "
                          f"re-timed with candidate {candidate_id!r}")
    if not evaluation.passed:
        status = NodeStatus.FAILED
    elif evaluation.vs_parent is not None:
        status = NodeStatus.REGRESSED if evaluation.vs_parent == "slower" else NodeStatus.SOLVED
    else:
        parent = tree.parent_score(node_id)
        status = NodeStatus.REGRESSED if parent is not None and evaluation.score < parent else NodeStatus.SOLVED  # type: ignore[operator]
    old = node.evaluation
    evaluation = evaluation.model_copy(update={"round": (old.round + 1) if old else 1,
                                               "previous_score": old.score if old else None})
    new = node.model_copy(update=dict(evaluation=evaluation, status=status))
    return tree.replace(Node.model_validate(new.model_dump()),
                        retime=tuple(i for i in tree.retime if i != node_id))
