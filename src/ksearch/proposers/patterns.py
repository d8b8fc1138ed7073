"""The offline ``patterns`` proposer: plans and kernels composed from a knowledge pack, no network.

The first tree holds the pack's kernel families as competing first-level branches. When a node's kernel
passes and is not slower than its parent's, its children are the pack's remaining moves on that path: every
other choice of a decision still at its default, and every other value of a knob still at its default. Each
child carries its full path (family, choices, knobs) in its payload, so the kernel of any node renders from
the node alone and a resumed run renders exactly the same code. Priors (rating, confidence, difficulty,
impacts) come from the pack; a move already measured elsewhere in the tree starts from that evidence
instead. After each evaluation the ratings are revised from the measurement (`strategy.revise`).

Constraints come from the hardware catalog through the target's static limit rules
(`static_limits.device_limit_rules`: shared/threadgroup memory per block, threads per block, for the run's
device where the catalog has it): before a family, choice or knob value becomes a node, its kernel is rendered
and measured, and a move whose kernel would break a limit is not proposed. Each such move is recorded with the
judge's message in the payload of the node it would have gone under (``payload["pruned"]``: a list of
``{"step": ..., "reason": ...}``; the root's for families), so the tree says why a path was never tried.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ksearch.errors import KnowledgeError
from ksearch.records import Candidate, Evaluation
from ksearch.eval.static_checks import check
from ksearch.eval.static_limits import device_limit_rules
from ksearch.knowledge.pack import FAMILY_KEY, Pack, load_pack
from ksearch.search.edits import Insert, Update
from ksearch.search.strategy import SearchState, StrategyConfig, revise
from ksearch.search.worldmodel import ROOT_ID, PASSING, Action, Impacts, Node, NodeStatus, Tree
from ksearch.targets import get_target

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec
    from ksearch.tasks.loader import Task


#: variants of a failed family root inserted at a time; a root whose tried variants (this many or more) all failed
#: is given up
REPAIR_BATCH = 3


def _path_key(choices: dict, knobs: dict) -> str:
    return json.dumps({"c": choices, "k": knobs}, sort_keys=True)


class PatternsProposer:
    """Proposer for (task, target) from the knowledge pack, filtered to what the hardware supports (``hardware``:
    the device's spec, whose SIMD instruction sets select the pack's variants and whose catalog limits the rendered
    kernels must pass; None: the whole pack).

    Raises:
        KnowledgeError: no pack for this task and target.
    """

    name = "patterns"

    def __init__(self, task: Task, target: str, hardware: HardwareSpec | None,
                 strategy: StrategyConfig | None = None):
        self.definition = task.definition
        pack = load_pack(task.name, target)
        flags = list(getattr(hardware, "simd_isa", None) or [])
        self.pack: Pack = pack.applicable(flags) if hardware is not None else pack
        self.strategy = strategy or StrategyConfig()
        #: the limit rules a rendered kernel must pass (values from the hardware catalog)
        self.limit_rules = device_limit_rules(get_target(target).limit_family, hardware)

    def _candidate(self, choices: dict, knobs: dict) -> Candidate:
        kernel = self.pack.render(self.definition, choices, knobs)
        return kernel.candidate(self.name)

    def violation(self, choices: dict, knobs: dict) -> str | None:
        """Why the kernel of a path would break a hard limit of the device (the static checks' messages: the
        computed value, the limit and its catalog source), or None when it fits or no limit rule applies."""
        if not self.limit_rules:
            return None
        findings = check(self._candidate(choices, knobs), self.limit_rules)
        return "; ".join(str(f) for f in findings) or None

    @staticmethod
    def _record(tree: Tree, node_id: str, pruned: list[dict]) -> list[Update]:
        """An update adding ``pruned`` moves to the node's payload (none when there are none or all are known)."""
        payload = dict(tree[node_id].payload)
        known = payload.get("pruned", [])
        new = [p for p in pruned if p not in known]
        if not new:
            return []
        return [Update(node_id=node_id, fields={"payload": {**payload, "pruned": [*known, *new]}})]

    # -- the planner's side -------------------------------------------------------------------------

    def initial_edits(self, tree: Tree) -> list[Insert | Update]:
        edits: list[Insert | Update] = []
        pruned = []
        for fam in self.pack.families:
            why = self.violation({FAMILY_KEY: fam.id}, {})
            if why:
                pruned.append({"step": {"family": fam.id}, "reason": why})
                continue
            edits.append(Insert(
                parent_id=ROOT_ID, decision="kernel family", choice=fam.id,
                action=Action(title=fam.title, description=fam.description, difficulty=fam.difficulty),
                rating=fam.rating, confidence=fam.confidence, impacts=Impacts(**fam.impacts.model_dump()),
                payload={"choices": {FAMILY_KEY: fam.id}, "knobs": {}, "step": {"family": fam.id}},
            ))
        return edits + self._record(tree, ROOT_ID, pruned)

    def refine(self, tree: Tree, node_id: str, state: SearchState,
               evaluation: Evaluation | None = None) -> list[Insert | Update]:
        edits: list[Insert | Update] = list(revise(tree, node_id, None, self.strategy))
        node = tree[node_id]
        if node.status == NodeStatus.SOLVED and node_id != ROOT_ID:
            kids, pruned = self._children(tree, node)
            edits += kids + self._record(tree, node_id, pruned)
        return edits

    def expand(self, tree: Tree, state: SearchState) -> list[Insert | Update]:
        """Children for the best passing node that has none yet (a regressed one too: its code is correct and
        a later step may recover the loss). When every passing node is expanded: the one-step variants of a
        family root that failed (highest rated first), since one broken part of a family's default (a combine
        kernel, say) need not be in its variants; an H200 decode run whose split-kv root had such a bug ended
        after 2 of 40 evaluations. They go under the root (each is a whole path rendered from the pack, not an
        edit of the failed code, and the frontier never holds children of a failed node), with
        ``payload["repair_of"]`` naming the failed root; they are not expanded so again when they fail. Only
        family roots: a failed move under a passing node has had its siblings tried. The variants come
        ``REPAIR_BATCH`` at a time, highest rated first, and a root whose first ``REPAIR_BATCH`` or more tried
        variants all failed is given up (the broken part is shared: a budget of 20-40 s GPU evaluations should
        not go to twenty variants that fail the same way). [] when nothing is left."""
        passing = [n for n in tree if n.status in PASSING and n.id != ROOT_ID and not tree.children(n.id)]
        passing.sort(key=lambda n: -(n.evaluation.score or 0.0))
        for node in passing:
            kids, pruned = self._children(tree, node)
            if kids:
                return [*kids, *self._record(tree, node.id, pruned)]
        failed_roots = [n for n in tree if n.status == NodeStatus.FAILED and n.parent_id == ROOT_ID
                        and "repair_of" not in n.payload]
        failed_roots.sort(key=lambda n: -n.rating)
        for node in failed_roots:
            repairs = [n.status for n in tree if n.payload.get("repair_of") == node.id]
            if NodeStatus.OPEN in repairs:   # a batch not yet tried (expand also runs when open nodes are cooling)
                continue
            if len(repairs) >= REPAIR_BATCH and not any(st in PASSING for st in repairs):
                continue
            kids, pruned = self._children(tree, node)
            kids = sorted(kids, key=lambda k: -k.rating)[:REPAIR_BATCH]
            if kids:   # titles name the family: cooling matches titles under one parent, and these share the root
                return [*(k.model_copy(update={
                    "parent_id": ROOT_ID, "payload": {**k.payload, "repair_of": node.id},
                    "decision": f"{k.decision} (variant of failed {node.choice})",
                    "action": k.action.model_copy(update={"title": f"{node.choice}: {k.action.title}"})})
                    for k in kids), *self._record(tree, node.id, pruned)]
        return []

    def _children(self, tree: Tree, node: Node) -> tuple[list[Insert], list[dict]]:
        """The open moves under ``node``, and those left out because their kernel breaks a device limit
        (``{"step", "reason"}`` each)."""
        choices = dict(node.payload.get("choices", {}))
        knobs = dict(node.payload.get("knobs", {}))
        family = choices.get(FAMILY_KEY, self.pack.default_family)
        resolved = self.pack.resolve(choices, knobs)
        seen = {_path_key(n.payload.get("choices", {}), n.payload.get("knobs", {})) for n in tree
                if n.status != NodeStatus.DROPPED}
        evidence = self._evidence(tree)
        out: list[Insert] = []
        pruned: list[dict] = []
        for dec in self.pack.decisions_for(family):
            if dec.id in choices:
                continue
            current = resolved.choices[dec.id]
            for ch in dec.choices:
                if ch.id == current:
                    continue
                new_choices = {**choices, dec.id: ch.id}
                # the old choice's knobs go with it, except those the new choice has too and whose value it takes:
                # dropping a token_tile=32 set above when gather became vector-transpose (both tile) made the
                # path say 32 and the kernel 64
                old = self.pack.decision(dec.id).choice(current).knobs
                kept_knobs = {k: v for k, v in knobs.items()
                              if k not in old or (k in ch.knobs and ch.knobs[k].coerce(v) is not None)}
                key = _path_key(new_choices, kept_knobs)
                if key in seen:
                    continue
                seen.add(key)
                step = {"decision": dec.id, "choice": ch.id}
                why = self.violation(new_choices, kept_knobs)
                if why:
                    pruned.append({"step": step, "reason": why})
                    continue
                rating, confidence = evidence.get(json.dumps(step, sort_keys=True), (ch.rating, ch.confidence))
                out.append(Insert(
                    parent_id=node.id, decision=dec.title, choice=ch.id,
                    action=Action(title=ch.title, description=ch.description, difficulty=ch.difficulty),
                    rating=rating, confidence=confidence, impacts=Impacts(**ch.impacts.model_dump()),
                    payload={"choices": new_choices, "knobs": kept_knobs, "step": step},
                ))
        for dec_id, ch_id in resolved.choices.items():
            ch = self.pack.decision(dec_id).choice(ch_id)
            for kname, knob in ch.knobs.items():
                if kname in knobs:
                    continue
                for value in knob.values:
                    if value == resolved.knobs[kname]:
                        continue
                    new_knobs = {**knobs, kname: value}
                    key = _path_key(choices, new_knobs)
                    if key in seen:
                        continue
                    seen.add(key)
                    step = {"knob": kname, "value": value}
                    why = self.violation(choices, new_knobs)
                    if why:
                        pruned.append({"step": step, "reason": why})
                        continue
                    rating, confidence = evidence.get(json.dumps(step, sort_keys=True), (5.0, 0.3))
                    out.append(Insert(
                        parent_id=node.id, decision=f"knob {kname}", choice=f"{kname}={value}",
                        action=Action(title=f"{kname} = {value}",
                                      description=knob.description or f"tune {kname} of {dec_id}.{ch_id}",
                                      difficulty=1),
                        rating=rating, confidence=confidence, impacts=Impacts(),
                        payload={"choices": choices, "knobs": new_knobs, "step": step},
                    ))
        return out, pruned

    @staticmethod
    def _evidence(tree: Tree) -> dict[str, tuple[float, float]]:
        """step -> (rating, confidence) of the latest tried node that made the same move elsewhere."""
        out: dict[str, tuple[float, float]] = {}
        for n in tree:
            step = n.payload.get("step")
            if step and n.status in (NodeStatus.SOLVED, NodeStatus.REGRESSED, NodeStatus.FAILED):
                out[json.dumps(step, sort_keys=True)] = (n.rating, min(n.confidence, 0.8))
        return out

    # -- the coder's side ---------------------------------------------------------------------------

    def propose(self, tree: Tree, node_id: str, parent: Candidate | None) -> Candidate:
        """Render the node's full path. Raises KnowledgeError when the path does not render."""
        node = tree[node_id]
        if "choices" not in node.payload:
            raise KnowledgeError(f"node {node_id!r} has no pack path in its payload (inserted by another planner?)")
        return self._candidate(node.payload["choices"], node.payload.get("knobs", {}))
