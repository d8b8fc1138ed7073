"""The ``llm`` proposer: a planner model edits the world model, a coder model writes the kernels.

The planner answers every question with one JSON array of edit records (`ksearch.search.edits`: insert,
update, split, delete, tagged by ``op``). The proposer parses the array (`ksearch.proposers.llm.parse`), validates it by
applying it to the current tree (`ksearch.search.edits.apply`, edit by edit), and when the reply does not parse
or some edits are rejected it sends the reply back in the same conversation with one line per problem, up to
``max_fix_rounds`` times; the planner answers with the whole corrected array each time. Only edits that
validate are returned, so a rejected edit changes nothing; a reply that never validates yields none.

Planner calls (``purpose`` of `LLMClient.ask`):

- ``plan:initial``: the first tree: the root's analysis (kernel classification, the math, the memory layout,
  bottleneck regimes, knobs) in the root's payload, two or three competing kernel families as first-level
  branches, and at least three open actions.
- ``plan:refine``: after a node passed (solved or regressed): ratings, confidence and impacts revised from the
  evidence, the gap between prediction and result noted, next steps inserted.
- ``plan:failure``: after a node failed: downscore it and its alternatives (update), drop what would fail the
  same way (delete), or retry with a fix (an insert whose payload says ``{"retry_of": "<failed id>"}``).
- ``plan:expand``: when no open action can be tried (the controller found the frontier empty or cooling).

Coder calls (one per `propose`, the kernel taken from the reply exactly as written, `ksearch.proposers.llm.parse`):

- ``code:first``: the parent's kernel plus the node's action;
- ``code:debug``: the node failed (a later attempt at it) or its payload has ``retry_of`` naming a failed node:
  the failed kernel, the compiler or runtime message, the failing workload and the size of the error;
- ``code:improve``: the node's payload has ``"improve": true``: the parent's kernel with per-workload median
  times and % of the roofline floor of the parent and of the best node so far.

The controller makes one attempt per node; a failed node is terminal (`ksearch.search.worldmodel`), so a "later
attempt" is a retry node the planner inserts after a failure (``plan:failure``), and the coder then debugs the
failed node's kernel. The failed kernel and its evaluation come from ``evidence`` (the run's store: anything
with ``candidate(id)`` and ``evaluation_of(id)``) or from the candidates this proposer made in this process.

Everything of an evaluation a candidate can influence (the judge's message, each workload's message, the
compile log; they quote the kernel's stderr, its exceptions and its source lines) and the reason a coder's reply
held no kernel go into prompts only as `ksearch.llm.untrusted.Untrusted` (bounded, cleaned, fenced as data).
Status names, workload names and numbers are the judge's own and are shown as they are.

LLM errors (LLMBudgetExhausted, LLMUnavailable, LLMError) propagate: the controller stops the run cleanly.
A coder reply without a usable kernel raises KnowledgeError (the controller records the node as failed with
the message).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ksearch.errors import ConfigError, KnowledgeError, ReplyError, TaskError
from ksearch.records import Candidate, Evaluation, Status
from ksearch.proposers.llm import context as ctx
from ksearch.llm import untrusted
from ksearch.llm.base import LLMReply, Message, Role, is_truncated
from ksearch.proposers.llm.parse import Edit, check_edits, extract_code, extract_json_array
from ksearch.search.edits import Choose, Delete, Insert, Retime, Split, Update, apply
from ksearch.search.strategy import SearchState, StrategyConfig, decide, revise
from ksearch.search.worldmodel import ROOT_ID, Node, NodeStatus, Tree
from ksearch.targets import get_target, target_names
from ksearch.targets.base import aliases

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec
    from ksearch.tasks.loader import Task


class Asker(Protocol):
    """What the planner and the coder are asked through: `ksearch.llm.client.LLMClient` (or a test's fake)."""

    def ask(self, role: Role, purpose: str, messages: list[Message], *, model: str, max_tokens: int = 4096,
            node_id: str | None = None) -> LLMReply: ...


class Evidence(Protocol):
    """Where failed kernels and their evaluations are read: the run's `ksearch.store.db.Store` (or a test's)."""

    def candidate(self, candidate_id: str) -> Candidate | None: ...

    def evaluation_of(self, candidate_id: str) -> Evaluation | None: ...


#: largest payload (characters of JSON) of an inserted or updated node; the root's analysis may take more
PAYLOAD_CHARS = 1200
ROOT_PAYLOAD_CHARS = 4000

class LLMProposer:
    """Proposer backed by language models (see the module docstring).

    Args:
        task: the loaded task (`ksearch.tasks.loader.Task`).
        target: the target's name (any target: its facts shape the prompts and the reply format).
        hardware: the device's HardwareSpec (roofline floors; shown in prompts from context "hardware" on).
        planner, coder: objects with ``ask(role, purpose, messages, *, model, max_tokens, node_id)`` returning
            an `LLMReply` (the same client twice is fine).
        planner_model, coder_model: model names passed to ``ask``.
        context: none | hardware | full (what the prompts carry; `ksearch.proposers.llm.context`).
        max_fix_rounds: times a reply that does not parse or validate is sent back with its errors.
        evidence: where failed kernels and their evaluations are read (the run's Store, or anything with
            ``candidate(id)`` and ``evaluation_of(id)``); None: only what this proposer made in this process.
        strategy: the run's strategy knobs (which actions count as triable after an edit: cooldowns).
        planner_max_tokens, coder_max_tokens: reply limits per call.
        workloads: the run's workload selection (None: all of the task's); the prompts list only these.

    Raises:
        ConfigError: an unknown context level, or a target the coder cannot write for.
        KnowledgeError: the task ships no naive kernel for the target.
    """

    name = "llm"

    def __init__(self, task: Task, target: str, hardware: HardwareSpec | None, *, planner: Asker, coder: Asker,
                 planner_model: str, coder_model: str, context: str = "full", max_fix_rounds: int = 3,
                 evidence: Evidence | None = None,
                 strategy: StrategyConfig | None = None, planner_max_tokens: int = 8192,
                 coder_max_tokens: int = 16384, workloads: list[str] | None = None):
        concrete = [n for n in target_names() if n not in aliases()]  # an alias (mlx) is resolved before
        if target not in concrete:
            raise ConfigError(f"the llm proposer writes kernels for {', '.join(concrete)}, not {target!r}")
        self._target = get_target(target)
        if self._target.naive_candidate(task) is None:
            raise KnowledgeError(f"task {task.name!r} has no naive kernel for target {target!r}")
        self.task, self.target, self.hardware = task, target, hardware
        self.planner, self.coder = planner, coder
        self.planner_model, self.coder_model = planner_model, coder_model
        self.level = ctx.check_level(context)
        self.max_fix_rounds = max(0, int(max_fix_rounds))
        self.evidence = evidence
        self.strategy = strategy or StrategyConfig()
        self.planner_max_tokens, self.coder_max_tokens = planner_max_tokens, coder_max_tokens
        self._static = {
            "level": self.level,
            "target": target,
            "task": ctx.task_view(task, target, workloads),
            "rules": ctx.rules_view(target),
            "hardware": (ctx.hardware_view(hardware, task, workloads)
                         if hardware is not None and self.level != "none" else None),
            "pack": ctx.pack_view(task, target, hardware) if self.level == "full" else None,
            "translation": ctx.translation_view(target, self.level),
            "payload_chars": PAYLOAD_CHARS,
            "root_payload_chars": ROOT_PAYLOAD_CHARS,
            "cooldown": self.strategy.cooldown_cycles,
        }
        self._made: dict[str, Candidate] = {}  # candidate id -> candidate written in this process
        self._judged: dict[str, Evaluation] = {}  # candidate id -> its evaluation, handed to `refine` this process
        self._no_kernel: dict[str, str] = {}  # node id -> why the coder's reply held no kernel

    # -- prompts ------------------------------------------------------------------------------------------

    def _render(self, template: str, **extra: Any) -> str:
        return ctx.render(template, **self._static, **extra)

    def _world(self, tree: Tree, node_id: str | None, state: SearchState | None = None, *,
               frontier: bool = True) -> dict | None:
        """The world-model view of context full (None below it); ``frontier``: a planner's view (the frontier and
        the compact tree instead of the active path)."""
        if self.level != "full":
            return None
        return {**ctx.tree_view(tree, node_id, state, self.strategy), "show_frontier": frontier}

    def _evaluations(self, tree: Tree, node_ids: list[str]) -> dict[str, Evaluation]:
        """The full evaluations (intervals, errors, check workloads) of some nodes, where they can be found."""
        out = {}
        for nid in node_ids:
            _, ev = self._lookup(tree[nid].candidate_id)
            if ev is not None:
                out[nid] = ev
        return out

    def _timings(self, tree: Tree, columns: list[tuple[str, str]]) -> dict:
        """Per-workload times with intervals and accuracy; the roofline floor and % of floor only from context
        "hardware" on (they come from the hardware spec)."""
        return ctx.timings(tree, columns, self.hardware if self.level != "none" else None, self.task,
                           self._evaluations(tree, [nid for _, nid in columns]))

    def _kernel(self, tree: Tree, node: Node) -> dict[str, Any] | None:
        """The node's kernel as the planner sees it: its diff from the parent's kernel (the naive one for a
        first-level node), or the whole kernel when the diff would be longer; None when it left none."""
        cand, _ = self._lookup(node.candidate_id)
        if cand is None:
            return None
        parent = None
        if node.parent_id is not None and node.parent_id != ROOT_ID:
            parent, _ = self._lookup(tree[node.parent_id].candidate_id)
        base = parent if parent is not None else self._target.naive_candidate(self.task)
        view = ctx.kernel_view(cand.sources, dict(base.sources) if base is not None else None,
                               self._target.fence_langs, list(cand.compile_flags),
                               list(base.compile_flags) if base is not None else None)
        return {**view, "base": f"the kernel of its parent {node.parent_id}" if parent is not None else "the naive kernel"}

    def _profiles(self, tree: Tree, columns: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """The profiler and compiler evidence (`ksearch.records.Evaluation.profiles`) of some nodes, by label."""
        out = []
        for label, nid in columns:
            _, ev = self._lookup(tree[nid].candidate_id)
            out += ctx.profile_view(label, ev)
        return out

    def _planner_common(self, tree: Tree) -> dict[str, Any]:
        """What every planner prompt carries at every context level: the compact tree."""
        return {"tree": ctx.compact_tree(tree)}

    # -- the planner --------------------------------------------------------------------------------------

    def initial_edits(self, tree: Tree) -> list[Edit]:
        """The first tree (``plan:initial``). Asks once more when fewer than two competing families validate."""
        naive = self._target.naive_candidate(self.task)
        assert naive is not None  # checked in __init__
        user = self._render("plan_initial.j2", world=self._world(tree, None), root=ctx.node_view(tree, ROOT_ID),
                            measured=self._timings(tree, []), **self._planner_common(tree),
                            naive_code=ctx.code_blocks(naive.sources, naive.launch, self._target.fence_langs,
                                                       list(naive.compile_flags)))

        def need(after: Tree) -> str | None:
            fams = [n for n in after.children(ROOT_ID, live=True) if n.status == NodeStatus.OPEN]
            if len(fams) >= 2:
                return None
            return (f"the tree has {len(fams)} open kernel famil{'y' if len(fams) == 1 else 'ies'} under 'root'; "
                    "insert two or three competing kernel families as children of 'root'")

        return self._plan("plan:initial", user, tree, None, need)

    def refine(self, tree: Tree, node_id: str, state: SearchState,
               evaluation: Evaluation | None = None) -> list[Edit]:
        """Edits after ``node_id`` was evaluated and attached (``plan:refine``; ``plan:failure`` for a failed node).
        ``evaluation``: this step's verdict on the node's kernel, not in the store yet (the judge's messages, the
        compile log and the failing workload reach the failure prompt from it).

        Continuation: after a solved node the planner must leave an open child under it, after a regressed or
        failed one at least one action the strategy can choose next. When the validated edits leave none the
        planner is asked once more; if it still leaves none, nothing is inserted in its place: the edits that
        validated are returned and the controller's next step finds no action and calls `expand`.

        Nodes whose rating and confidence the planner's edits leave alone are moved toward the evidence by
        `ksearch.search.strategy.revise` (those updates are appended, validated like the planner's).
        """
        if evaluation is not None and evaluation.candidate_id:
            self._judged[evaluation.candidate_id] = evaluation
        node = tree[node_id]
        failed = node.status == NodeStatus.FAILED
        world = self._world(tree, node_id, state)
        view = ctx.node_view(tree, node_id)
        kernel = self._kernel(tree, node)
        common = {**self._planner_common(tree), "kernel": kernel, "kernel_base": kernel["base"] if kernel else ""}
        if failed:
            user = self._render("plan_failure.j2", world=world, node=view, failure=self._failure(tree, node),
                                **common)
            purpose = "plan:failure"
        else:
            cols = [(f"parent {node.parent_id}", node.parent_id), (f"this node {node_id}", node_id)]
            best = tree.best()
            if best is not None and best.id not in (node_id, node.parent_id):
                cols.append((f"best {best.id}", best.id))
            ev = node.evaluation
            user = self._render("plan_refine.j2", world=world, node=view, measured=self._timings(tree, cols),
                                regressed=node.status == NodeStatus.REGRESSED,
                                profiles=self._profiles(tree, [c for c in cols if c[1] != node.parent_id]),
                                retimed=ev.previous_score if ev is not None and ev.round else None, **common)
            purpose = "plan:refine"

        def need(after: Tree) -> str | None:
            if node.status == NodeStatus.SOLVED:
                if any(c.status == NodeStatus.OPEN for c in after.children(node_id, live=True)):
                    return None
                return (f"{node_id!r} passed and is the base of further steps, but it has no open child; insert at "
                        f"least one open child under {node_id!r} (the next step on this plan)")
            if decide(after, state, self.strategy) is not None:
                return None
            return ("no open action can be tried next (the frontier is empty or every open action is in its "
                    "failure cooldown); insert at least one open action under a passing node")

        edits = self._plan(purpose, user, tree, node_id, need)
        return edits + self._revisions(tree, node_id, edits)

    def expand(self, tree: Tree, state: SearchState) -> list[Edit]:
        """New open actions when no action can be tried (``plan:expand``). An explicit ``[]`` means the planner
        sees nothing left (the run ends); edits that still leave nothing triable are asked about once more."""
        user = self._render("plan_expand.j2", world=self._world(tree, None, state), **self._planner_common(tree),
                            best=ctx.node_line(tree, tree.best()) if tree.best() else None,
                            leaves=ctx.passing_leaves(tree))

        def need(after: Tree) -> str | None:
            if decide(after, state, self.strategy) is not None:
                return None
            return ("still no open action can be tried: insert open actions under solved or regressed nodes (or "
                    "root), with titles different from recently failed ones under the same parent")

        return self._plan("plan:expand", user, tree, None, need, empty_ok=True)

    def _plan(self, purpose: str, user: str, tree: Tree, node_id: str | None,
              need: Callable[[Tree], str | None], *, empty_ok: bool = False) -> list[Edit]:
        """Ask, validate, send problems back (up to max_fix_rounds), ask once more for a missing continuation
        (not after an empty array when ``empty_ok``).

        Returns the validated edits of the latest reply that parsed (none when no reply did)."""
        messages = [Message(role="system", content=self._render("planner_system.j2")),
                    Message(role="user", content=user)]
        fixes, continued = 0, False
        result: list[Edit] = []
        while True:
            reply = self.planner.ask("planner", purpose, messages, model=self.planner_model,
                                     max_tokens=self.planner_max_tokens, node_id=node_id)
            parsed, edits, errors, after = self._validate(reply, tree)
            if parsed:
                result = edits
            if errors:
                if fixes >= self.max_fix_rounds:
                    return result
                fixes += 1
                follow = self._render("plan_fix.j2", errors=errors, accepted=len(edits), parsed=parsed,
                                      cut=is_truncated(reply.finish_reason))
            else:
                problem = None if (empty_ok and not edits) else need(after)
                if problem is None or continued:
                    return result
                continued = True
                follow = self._render("plan_continue.j2", problem=problem)
            messages = [*messages, Message(role="assistant", content=reply.text or "(empty reply)"),
                        Message(role="user", content=follow)]

    def _validate(self, reply: LLMReply, tree: Tree) -> tuple[bool, list[Edit], list[str], Tree]:
        """(parsed, valid edits, one message per problem, the tree after the valid edits)."""
        try:
            items = extract_json_array(reply.text, reply.finish_reason)
        except ReplyError as e:
            return False, [], [str(e)], tree
        parsed, errors = check_edits(items)
        kept: list[tuple[int, Edit]] = []
        for i, edit in parsed:
            problem = self._check_edit(edit, tree)
            if problem:
                errors.append((i, f"edit {i} ({edit.op}): {problem}"))
            else:
                kept.append((i, edit))
        after, results = apply(tree, [e for _, e in kept])
        valid = []
        for (i, edit), res in zip(kept, results):
            if res.ok:
                valid.append(edit)
            else:
                errors.append((i, f"edit {i} ({edit.op}): {res.reason}"))
        return True, valid, [m for _, m in sorted(errors)], after

    @staticmethod
    def _check_edit(edit: Edit, tree: Tree) -> str | None:
        """What the edit records do not check but the proposer needs: an action the coder can follow, a small
        payload, a ``retry_of`` that names a failed node."""
        specs = [edit] if isinstance(edit, Insert) else list(edit.into) if isinstance(edit, Split) else []
        payloads: list[tuple[str, Any]] = [("payload", s.payload) for s in specs]
        for s in specs:
            if not s.action.description.strip():
                return f"the action {s.action.title!r} needs a description a coder can follow"
        if isinstance(edit, Update) and "payload" in edit.fields:
            payloads.append((edit.node_id, edit.fields["payload"]))
        for who, payload in payloads:
            if not isinstance(payload, dict):
                return f"payload must be an object, got {type(payload).__name__}"
            size = len(json.dumps(payload))
            limit = ROOT_PAYLOAD_CHARS if who == ROOT_ID else PAYLOAD_CHARS
            if size > limit:
                return f"payload is {size} characters of JSON; keep it under {limit}"
            ref = payload.get("retry_of")
            if ref is not None and not (isinstance(ref, str) and ref in tree and tree[ref].status == NodeStatus.FAILED):
                return f"retry_of must name a failed node (got {ref!r})"
        return None

    def _revisions(self, tree: Tree, node_id: str, edits: list[Edit]) -> list[Edit]:
        """`revise`'s rating/confidence updates for nodes the planner's edits leave alone (a node it updated in any
        field, split, deleted, chose or asked to re-time keeps what it set), validated after them."""
        # whatever node the planner edited, chose or asked to re-time in this step keeps the values it left
        touched = {e.node_id for e in edits if isinstance(e, (Update, Delete, Split, Retime, Choose))}
        base, _ = apply(tree, edits)
        mine = [u for u in revise(tree, node_id, None, self.strategy) if u.node_id not in touched]
        _, results = apply(base, mine)
        return [u for u, r in zip(mine, results) if r.ok]

    # -- the coder ----------------------------------------------------------------------------------------

    def propose(self, tree: Tree, node_id: str, parent: Candidate | None) -> Candidate:
        """The kernel for ``node_id`` (see the module docstring for which prompt). Raises KnowledgeError when the
        reply holds no usable kernel (missing block, open fence, cut at the token limit)."""
        node = tree[node_id]
        mode, failed = self.coder_mode(tree, node)
        base_sources, base_launch = self._base(parent)
        base_flags = list(parent.compile_flags) if parent is not None else []
        common = dict(world=self._world(tree, node_id, frontier=False), node=ctx.node_view(tree, node_id),
                      parent_code=ctx.code_blocks(base_sources, base_launch, self._target.fence_langs, base_flags),
                      base=f"the kernel of node {node.parent_id}" if parent is not None else "the naive kernel")
        if mode == "debug":
            failure = self._failure(tree, failed)  # type: ignore[arg-type]
            if failure["code"] is None:  # nothing to debug: the attempt left no kernel; start from the parent
                mode = "first"
                common["previous_failure"] = failure
            else:
                common["failure"] = failure
        if mode == "improve":
            best = tree.best()
            cols = [(f"parent {node.parent_id}", node.parent_id)]
            if best is not None and best.id not in (node.parent_id,):
                cols.append((f"best so far {best.id}", best.id))
            common["measured"] = self._timings(tree, cols)
            common["profiles"] = self._profiles(tree, cols)
            # an earlier improvement of the same kernel that failed: its error, as OpenEvolve feeds back artifacts
            # (a failed child is never drawn as a parent, so without this its compile log never reaches the coder)
            failed = [s for s in tree.siblings(node_id) if s.status == NodeStatus.FAILED and s.candidate_id]
            if failed:
                common["previous_failure"] = self._failure(tree, failed[-1])
        common.setdefault("previous_failure", None)
        messages = [Message(role="system", content=self._render("coder_system.j2")),
                    Message(role="user", content=self._render(f"code_{mode}.j2", **common))]
        reply = self.coder.ask("coder", f"code:{mode}", messages, model=self.coder_model,
                               max_tokens=self.coder_max_tokens, node_id=node_id)
        try:
            code = extract_code(reply.text, self.target, reply.finish_reason)
        except ReplyError as e:
            self._no_kernel[node_id] = str(e)
            raise
        meta = {"proposer": self.name, "mode": mode, "model": reply.model or self.coder_model}
        if code.notes:
            meta["notes"] = code.notes
        if is_truncated(reply.finish_reason):
            meta["truncated_after_code"] = True
        flags = code.compile_flags if code.compile_flags is not None else base_flags  # no block: kept as they were
        cand = Candidate(target=self.target, sources=code.sources, launch=code.launch, compile_flags=flags, meta=meta)
        self._made[cand.id] = cand
        return cand

    @staticmethod
    def coder_mode(tree: Tree, node: Node) -> tuple[str, Node | None]:
        """("debug", the failed node) when the node itself holds a failing evaluation or its payload's
        ``retry_of`` names a failed node; ("improve", None) when its payload has ``"improve": true``; else
        ("first", None)."""
        if node.evaluation is not None and not node.evaluation.passed:
            return "debug", node
        ref = node.payload.get("retry_of")
        if isinstance(ref, str) and ref in tree and tree[ref].status == NodeStatus.FAILED:
            return "debug", tree[ref]
        if node.payload.get("improve") is True:
            return "improve", None
        return "first", None

    def _base(self, parent: Candidate | None) -> tuple[dict[str, str], dict]:
        """The code an action applies to: the parent's candidate, or the task's naive kernel."""
        if parent is not None:
            return dict(parent.sources), dict(parent.launch)
        naive = self._target.naive_candidate(self.task)
        assert naive is not None  # checked in __init__
        return dict(naive.sources), dict(naive.launch)

    def _lookup(self, candidate_id: str | None) -> tuple[Candidate | None, Evaluation | None]:
        if not candidate_id:
            return None, None
        cand = self._made.get(candidate_id)
        ev = self._judged.get(candidate_id)
        if self.evidence is not None:
            cand = cand or self.evidence.candidate(candidate_id)
            ev = ev or self.evidence.evaluation_of(candidate_id)
        return cand, ev

    def _failure(self, tree: Tree, node: Node) -> dict[str, Any]:
        """What is known of a failed node's attempt: status, the judge's message, the compile log, the failing
        workload with its message and error size, and its code (None when the attempt left no kernel or it
        cannot be found). The messages and the log are `untrusted.Untrusted` (the candidate can write into
        them); ``note`` is the proposer's own remark, plain text."""
        summary = node.evaluation
        cand, ev = self._lookup(node.candidate_id)
        out: dict[str, Any] = {"id": node.id, "status": summary.status if summary else "?", "note": "",
                               "message": None, "log": None, "workload": None, "code": None}
        if node.candidate_id is None:
            why = self._no_kernel.get(node.id)
            if why:
                out["message"] = untrusted.Untrusted.of(why, untrusted.NO_KERNEL)
            else:
                out["note"] = "the coder's reply held no usable kernel"
        if cand is not None:
            out["code"] = ctx.code_blocks(cand.sources, cand.launch, self._target.fence_langs, cand.compile_flags)
        if ev is None:
            if node.candidate_id is not None:
                out["note"] = "the evaluation's messages are not available to this proposer"
            return out
        out["status"] = ev.status.value
        out["message"] = untrusted.Untrusted.of(ev.message, untrusted.JUDGE)
        out["log"] = untrusted.Untrusted.of(ev.compile_log, untrusted.COMPILER)
        bad = next((r for r in ev.workloads if r.status not in (Status.PASSED, Status.SKIPPED)), None)
        if bad is not None:
            try:
                axes = " ".join(f"{k}={v}" for k, v in self.task.workload(bad.workload).axes.items())
            except TaskError:
                axes = ""
            tol = [f"{t['dtype']}: rtol {t['rtol']}, atol {t['atol']}" for t in self._static["task"]["tolerance"]]
            out["workload"] = {
                "name": bad.workload, "axes": axes, "status": bad.status.value,
                "message": untrusted.Untrusted.of(bad.message, untrusted.WORKLOAD),
                "max_abs_err": ctx._g(bad.max_abs_err) if bad.max_abs_err is not None else "",
                "max_rel_err": ctx._g(bad.max_rel_err) if bad.max_rel_err is not None else "",
                "tolerance": "; ".join(tol),
            }
        return out
