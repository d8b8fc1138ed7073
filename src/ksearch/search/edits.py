"""Validated edit operations on the world model: the planner's only way to change the tree.

Four records, each with an ``op`` tag so a planner's JSON list parses directly (`parse_edit`):

- `Insert` (op "insert"): add one open node under ``parent_id``. The parent must be live (not
  dropped) and not failed (a child of a failed node could never be reached). Inserting under an
  open node sketches a deeper plan; the child waits until its parent is solved.
- `Update` (op "update"): change planner-owned fields of one node: ``decision``, ``choice``,
  ``action``, ``rating``, ``confidence``, ``impacts``, ``payload`` and ``parent_id`` (a move).
  ``action`` and ``impacts`` may be given partially (merged into the current value); ``payload``
  is replaced. A tried node (solved, regressed, failed), or one whose kernel is being judged
  (`Tree.in_flight`), keeps its decision, choice, action and parent: they are the history of what was measured; its rating, confidence, impacts and payload may
  change. Controller-owned fields (``candidate_id``, ``evaluation``, ``status``, ``attempts``) and
  ``id`` are never editable.
- `Split` (op "split"): replace one open node by two or more alternative open siblings (same
  parent). The node and its open subtree are dropped (kept for the record). To *refine* a node
  into sub-steps instead, insert children under it.
- `Delete` (op "delete"): drop an open node and its subtree. Refused for the root and for any
  subtree holding a tried node, an attached candidate or a node being judged.
- `Retime` (op "retime"): ask for a tried node's kernel (solved or regressed, not the root) to be judged
  again (a fresh evaluation beside its parent and the best, counted in the budget); queued on
  ``Tree.retime``, done by the controller before the next action.
- `Choose` (op "choose"): name the open node to try next (it must be on the frontier once the edits before it
  are applied); the strategy takes it unless it is in its failure cooldown (``Tree.chosen``).

`apply` is atomic per edit by default: each edit is checked against the tree as left by the
edits before it; a rejected edit changes nothing and yields a readable reason, the others still
apply. With ``atomic=True`` the batch is all-or-nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Iterable, Literal, Mapping, Union

from pydantic import Field, TypeAdapter, ValidationError

from ksearch.errors import Rejected
from ksearch.search.worldmodel import (
    ROOT_ID,
    Action,
    Impacts,
    Node,
    NodeStatus,
    Tree,
    Record,
)

#: Fields an `Update` may change.
PLANNER_FIELDS = frozenset(
    {"decision", "choice", "action", "rating", "confidence", "impacts", "payload", "parent_id"}
)
#: Fields only the controller writes (through `ksearch.search.worldmodel.attach`).
CONTROLLER_FIELDS = frozenset({"candidate_id", "evaluation", "status", "attempts"})
#: Fields of a tried node that stay as they were measured.
HISTORY_FIELDS = frozenset({"decision", "choice", "action", "parent_id"})


class NodeSpec(Record):
    """The planner-written fields of a new node (see `ksearch.search.worldmodel.Node`).

    Attributes:
        id: optional id; generated as ``n<seq>`` when None. Must be new in the tree.
        decision, choice, action, rating (0-10), confidence (0-1), impacts, payload: as on `Node`.
    """

    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:\-]{1,64}$")
    decision: str = ""
    choice: str = ""
    action: Action
    rating: float = Field(default=5.0, ge=0, le=10)
    confidence: float = Field(default=0.5, ge=0, le=1)
    impacts: Impacts = Field(default_factory=Impacts)
    payload: dict[str, Any] = Field(default_factory=dict)


class Insert(NodeSpec):
    """Add one open node under ``parent_id``."""

    op: Literal["insert"] = "insert"
    parent_id: str


class Update(Record):
    """Change planner-owned ``fields`` (name -> new value) of node ``node_id``."""

    op: Literal["update"] = "update"
    node_id: str
    fields: dict[str, Any]


class Split(Record):
    """Replace open node ``node_id`` by the alternatives ``into`` (at least two), same parent."""

    op: Literal["split"] = "split"
    node_id: str
    into: list[NodeSpec] = Field(min_length=2)


class Delete(Record):
    """Drop open node ``node_id`` and its subtree."""

    op: Literal["delete"] = "delete"
    node_id: str


class Retime(Record):
    """Judge the kernel of tried node ``node_id`` again."""

    op: Literal["retime"] = "retime"
    node_id: str


class Choose(Record):
    """Try open node ``node_id`` next."""

    op: Literal["choose"] = "choose"
    node_id: str


Edit = Annotated[Union[Insert, Update, Split, Delete, Retime, Choose], Field(discriminator="op")]
AnyEdit = Union[Insert, Update, Split, Delete, Retime, Choose]
_EDIT = TypeAdapter(Edit)


class EditResult(Record):
    """What happened to one edit of a batch.

    Attributes:
        index: position of the edit in the batch (0-based).
        op: "insert", "update", "split", "delete", "retime", "choose", or "?" when it did not parse.
        ok: True when the edit is in the returned tree.
        reason: what was done, or why it was rejected (naming the bad id or value).
        node_ids: ids created (insert, split) or changed (update, delete, split's dropped nodes).
    """

    index: int
    op: str
    ok: bool
    reason: str
    node_ids: tuple[str, ...] = ()


def explain(exc: ValidationError) -> str:
    """One line per pydantic error: ``location: message (got value)``."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "value"
        got = repr(err.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        parts.append(f"{loc}: {err['msg']} (got {got})")
    return "; ".join(parts)


def parse_edit(raw: Edit | Mapping[str, Any]) -> AnyEdit:
    """An edit record from a record or a dict with an ``op`` key. Raises `Rejected` with a reason."""
    if isinstance(raw, (Insert, Update, Split, Delete, Retime, Choose)):
        return raw
    try:
        return _EDIT.validate_python(dict(raw))
    except (ValidationError, TypeError, ValueError) as exc:
        msg = explain(exc) if isinstance(exc, ValidationError) else str(exc)
        raise Rejected(f"malformed edit: {msg}") from None


def apply(
    tree: Tree, edits: Iterable[Edit | Mapping[str, Any]], *, atomic: bool = False
) -> tuple[Tree, list[EditResult]]:
    """Apply a batch of edits, each validated against the tree left by the ones before it.

    Args:
        tree: the world model (unchanged by this call).
        edits: edit records, or dicts with an ``op`` key as a planner writes them.
        atomic: False: a rejected edit is skipped and the others apply. True: any rejection
            returns ``tree`` unchanged and marks the valid edits as rolled back.

    Returns:
        (new tree, one `EditResult` per edit in order).
    """
    cur, results = tree, []
    for i, raw in enumerate(edits):
        op = getattr(raw, "op", None) or (raw.get("op") if isinstance(raw, Mapping) else None) or "?"
        try:
            edit = parse_edit(raw)
            cur, reason, ids = _apply_one(cur, edit)
            results.append(EditResult(index=i, op=edit.op, ok=True, reason=reason, node_ids=ids))
        except Rejected as exc:
            results.append(EditResult(index=i, op=str(op), ok=False, reason=str(exc)))
        except ValidationError as exc:
            results.append(EditResult(index=i, op=str(op), ok=False, reason=explain(exc)))
    bad = [r.index for r in results if not r.ok]
    if atomic and bad:
        note = f"rolled back: edit {bad[0]} was rejected"
        results = [r if not r.ok else r.model_copy(update={"ok": False, "reason": note}) for r in results]
        return tree, results
    return cur, results


# ---- one edit ------------------------------------------------------------------------------------


def _node(tree: Tree, node_id: str) -> Node:
    if node_id not in tree:
        raise Rejected(f"unknown node id {node_id!r}")
    return tree[node_id]


def _check_parent(tree: Tree, parent_id: str) -> Node:
    parent = _node(tree, parent_id)
    if parent.status == NodeStatus.DROPPED:
        raise Rejected(f"parent {parent_id!r} is dropped")
    if parent.status == NodeStatus.FAILED:
        raise Rejected(f"parent {parent_id!r} failed; its children could never be tried")
    return parent


def _check_droppable(tree: Tree, node_id: str, verb: str) -> list[Node]:
    node = _node(tree, node_id)
    if node.id == ROOT_ID:
        raise Rejected(f"cannot {verb} the root")
    if node.status == NodeStatus.DROPPED:
        raise Rejected(f"node {node_id!r} is already dropped")
    sub = tree.subtree(node_id)
    for n in sub:
        if n.id in tree.in_flight:
            raise Rejected(f"cannot {verb} {node_id!r}: node {n.id!r} in its subtree is being judged")
        if n.candidate_id is not None or n.status not in (NodeStatus.OPEN, NodeStatus.DROPPED):
            raise Rejected(
                f"cannot {verb} {node_id!r}: node {n.id!r} in its subtree is {n.status.value} "
                f"with candidate {n.candidate_id!r}; tried nodes are history"
            )
    return [n for n in sub if n.status != NodeStatus.DROPPED]


def _new_node(tree: Tree, spec: NodeSpec, parent_id: str, taken: set[str], seq: int) -> tuple[Node, int]:
    nid = spec.id
    if nid is None:
        while f"n{seq}" in taken:
            seq += 1
        nid, seq = f"n{seq}", seq + 1
    elif nid in taken:
        raise Rejected(f"node id {nid!r} already exists")
    taken.add(nid)
    data = spec.model_dump(exclude={"op", "parent_id", "id"})
    return Node.model_validate({**data, "id": nid, "parent_id": parent_id}), seq


def _apply_one(tree: Tree, edit: AnyEdit) -> tuple[Tree, str, tuple[str, ...]]:
    taken = {n.id for n in tree}
    if isinstance(edit, Retime):
        node = _node(tree, edit.node_id)
        if node.id == ROOT_ID:
            raise Rejected("the root (the naive kernel) is the base every speedup is measured against; it is "
                           "not re-timed alone")
        if node.status not in (NodeStatus.SOLVED, NodeStatus.REGRESSED) or node.candidate_id is None:
            raise Rejected(f"only a node holding a passing kernel (solved or regressed) can be re-timed; "
                           f"{node.id!r} is {node.status.value}")
        if node.id in tree.retime:
            return tree, f"{node.id!r} is already queued for a re-time", (node.id,)
        return tree.replace(retime=(*tree.retime, node.id)), f"queued {node.id!r} for a re-time", (node.id,)
    if isinstance(edit, Choose):
        node = _node(tree, edit.node_id)
        if node.id not in {n.id for n in tree.frontier()}:
            why = (f"it is {node.status.value}" if node.status != NodeStatus.OPEN else
                   "its kernel is being judged" if node.id in tree.in_flight else
                   f"its parent {node.parent_id!r} holds no passing kernel yet")
            raise Rejected(f"only an open node on the frontier can be chosen; {node.id!r} cannot be tried now: {why}")
        return tree.replace(chosen=node.id), f"chose {node.id!r} to try next", (node.id,)
    if isinstance(edit, Insert):
        _check_parent(tree, edit.parent_id)
        node, seq = _new_node(tree, edit, edit.parent_id, taken, tree.next_seq)
        return tree.replace(node, next_seq=seq), f"inserted {node.id!r} under {edit.parent_id!r}", (node.id,)
    if isinstance(edit, Delete):
        dropped = _check_droppable(tree, edit.node_id, "delete")
        new = [n.model_copy(update={"status": NodeStatus.DROPPED}) for n in dropped]
        ids = tuple(n.id for n in dropped)
        return tree.replace(*new), f"dropped {', '.join(map(repr, ids))}", ids
    if isinstance(edit, Split):
        node = _node(tree, edit.node_id)
        if node.status != NodeStatus.OPEN:
            raise Rejected(f"only an open node can be split; {edit.node_id!r} is {node.status.value}")
        dropped = _check_droppable(tree, edit.node_id, "split")
        new = [n.model_copy(update={"status": NodeStatus.DROPPED}) for n in dropped]
        seq, made = tree.next_seq, []
        for spec in edit.into:
            child, seq = _new_node(tree, spec, node.parent_id, taken, seq)  # type: ignore[arg-type]
            made.append(child)
        ids = tuple(n.id for n in made)
        reason = f"split {edit.node_id!r} into {', '.join(map(repr, ids))}"
        return tree.replace(*new, *made, next_seq=seq), reason, ids + tuple(n.id for n in dropped)
    return _update(tree, edit)


def _update(tree: Tree, edit: Update) -> tuple[Tree, str, tuple[str, ...]]:
    node = _node(tree, edit.node_id)
    if not edit.fields:
        raise Rejected(f"update of {edit.node_id!r} changes no field")
    for key in edit.fields:
        if key == "candidate_id" and node.candidate_id is not None:
            raise Rejected(f"would overwrite candidate {node.candidate_id!r} attached to {node.id!r}")
        if key in CONTROLLER_FIELDS:
            raise Rejected(f"{key!r} is written only by the controller (attach), not by edits")
        if key == "id":
            raise Rejected("node ids never change")
        if key not in PLANNER_FIELDS:
            raise Rejected(f"unknown field {key!r}; editable: {', '.join(sorted(PLANNER_FIELDS))}")
    if node.status == NodeStatus.DROPPED:
        raise Rejected(f"node {node.id!r} is dropped")
    if node.status != NodeStatus.OPEN or node.id in tree.in_flight:
        frozen = sorted(HISTORY_FIELDS & set(edit.fields))
        if frozen:
            what = "being judged" if node.status == NodeStatus.OPEN else node.status.value
            raise Rejected(f"node {node.id!r} is {what}: its {', '.join(frozen)} are history")
    fields = dict(edit.fields)
    for key, cur in (("action", node.action), ("impacts", node.impacts)):
        if isinstance(fields.get(key), Mapping) and cur is not None:
            fields[key] = {**cur.model_dump(), **fields[key]}
    if "parent_id" in fields and fields["parent_id"] != node.parent_id:
        _move_check(tree, node, fields["parent_id"])
    new = Node.model_validate({**node.model_dump(), **fields})
    return tree.replace(new), f"updated {', '.join(sorted(fields))} of {node.id!r}", (node.id,)


def _move_check(tree: Tree, node: Node, parent_id: Any) -> None:
    if node.id == ROOT_ID:
        raise Rejected("the root has no parent")
    if not isinstance(parent_id, str):
        raise Rejected(f"parent_id must be a node id (got {parent_id!r})")
    _check_parent(tree, parent_id)
    if parent_id in {n.id for n in tree.subtree(node.id)}:
        raise Rejected(f"moving {node.id!r} under {parent_id!r} would make a cycle")
    _check_droppable(tree, node.id, "move")
