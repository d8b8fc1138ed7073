"""The world-model strategy: which open action to try next, when to back off, how to learn from a result.

Pure functions over immutable records; deterministic given ``StrategyConfig.seed`` (no global
random state is read). `ksearch.run.controller.Controller.step` makes one attempt per cycle::

    decision = decide(tree, state, cfg)                  # None: ask the proposer to expand the tree
    candidate = proposer.propose(tree, decision.node_id, parent_candidate); evaluation = judge(candidate)
    tree = attach(tree, node_id, candidate.id, summary)
    state = update_state(state, tree, node_id, summary)  # closes the cycle
    tree, results = apply(tree, proposer.refine(tree, node_id, state))   # revise(...) + new children

``update_state(..., end_cycle=False)`` is there for a proposer that makes several attempts per node.
Vocabulary: a *branch* is a first-level subtree (a kernel family); an *evaluation* is one
benchmarked attempt; a *cycle* is one selected node with all its attempts.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Literal, NamedTuple

from pydantic import Field

from ksearch.errors import SearchError
from ksearch.search.edits import Update
from ksearch.search.worldmodel import PASSING, ROOT_ID, EvalSummary, Node, NodeStatus, Record, Tree

_TRIED = frozenset({NodeStatus.SOLVED, NodeStatus.REGRESSED, NodeStatus.FAILED})


#: the strategies a run can use (``--strategy``)
STRATEGIES = ("worldmodel", "evolve", "random")


class StrategyConfig(Record):
    """Knobs of the strategy; the defaults are the tested ones.

    Attributes:
        kind: ``worldmodel`` (the world model's ranking, back-off and the planner's choice: `decide`),
            ``evolve`` (an evolutionary loop over the kernels measured so far: `decide_evolve`) or ``random``
            (uniform over the frontier: `decide_random`).
        difficulty_cap: 1-5; actions harder than this are skipped while easier ones are open.
        cooldown_cycles: >= 0; full cycles a failed action waits before it (or a re-proposal of the
            same action title under the same parent) may be chosen again.
        stagnation_window: >= 1; evaluations without improving the best after which the active
            branch counts as stagnating and selection backs off to a competing branch.
        prior_rating: 0-10; the rating assumed when confidence is 0.
        explore: >= 0; weight of the exploration bonus.
        difficulty_cost: >= 0; score taken off a difficulty-5 action (linear from 0 at difficulty 1).
        depth_bonus: >= 0; weight of the preference for going deeper along good measured paths.
        seed: breaks exact score ties (through a hash of seed and node id, never global random).
        top_k: >= 1; alternatives listed in a `Decision`.
        fail_rating: 0-10; the evidence rating `revise` takes from a failed action.
        sibling_nudge: 0-1; how far `revise` moves open siblings against the node's surprise.
        child_nudge: 0-1; how far `revise` moves open children with the node's measured quality.
    """

    difficulty_cap: int = Field(default=4, ge=1, le=5)
    cooldown_cycles: int = Field(default=2, ge=0)
    stagnation_window: int = Field(default=5, ge=1)
    prior_rating: float = Field(default=5.0, ge=0, le=10)
    explore: float = Field(default=0.3, ge=0)
    difficulty_cost: float = Field(default=0.2, ge=0)
    depth_bonus: float = Field(default=0.2, ge=0)
    seed: int = 0
    top_k: int = Field(default=3, ge=1)
    fail_rating: float = Field(default=2.0, ge=0, le=10)
    sibling_nudge: float = Field(default=0.2, ge=0, le=1)
    child_nudge: float = Field(default=0.2, ge=0, le=1)
    kind: Literal["worldmodel", "evolve", "random"] = "worldmodel"
    #: evolve: islands (populations evolved apart; kernel families are dealt to them in turn)
    islands: int = Field(default=3, ge=1)
    #: evolve: share of parents drawn uniformly from the island's population (exploration)
    exploration: float = Field(default=0.2, ge=0, le=1)
    #: evolve: share of parents drawn from the island's elites, best first (exploitation); the rest are drawn in
    #: proportion to their scores
    exploitation: float = Field(default=0.7, ge=0, le=1)
    #: evolve: every this many evaluations the global elites join every island's choice (migration)
    migration_interval: int = Field(default=10, ge=1)
    #: evolve, random: no planner writes actions (the llm proposer): the strategy draws a parent and asks for a new
    #: child of it, an improvement of the parent's kernel (`Decision.spawn`), instead of drawing an open action
    spawn: bool = False


class SearchState(Record):
    """What the strategy remembers between cycles (saved with the run, so resume keeps it).

    Attributes:
        cycle: cycles completed (>= 0).
        evaluations: evaluations (attempts) recorded (>= 0).
        best_score: best geometric-mean speedup over baseline seen, None before any pass.
        best_node_id: the node that holds it.
        since_improvement: evaluations since the best last improved.
        active_branch: first-level node id of the last evaluated node (None for the root).
        branch_since_improvement: evaluations in the active branch since it became active or last
            improved the best; backoff starts when this reaches the stagnation window.
        recent_failures: node id -> index of the cycle in which it failed (drives the cooldown).
        regressions: ids of nodes whose passing candidate was slower than their parent's.
        refine_pending: ids of nodes whose evaluation was committed without the proposer's refinement (its
            model failed or the run stopped first): a resumed run asks for those refinements before anything else.
    """

    cycle: int = Field(default=0, ge=0)
    evaluations: int = Field(default=0, ge=0)
    best_score: float | None = None
    best_node_id: str | None = None
    since_improvement: int = Field(default=0, ge=0)
    active_branch: str | None = None
    branch_since_improvement: int = Field(default=0, ge=0)
    recent_failures: dict[str, int] = Field(default_factory=dict)
    regressions: tuple[str, ...] = ()
    refine_pending: tuple[str, ...] = ()


class Decision(Record):
    """Which node to try next, and why.

    Attributes:
        node_id: the chosen open node.
        reason: one line, e.g. "backoff: branch 'chunked-scan' stagnated 5 evals; switching to
            'register-state'".
        score: the chosen node's selection score (see `score`).
        backoff: True when the stagnating branch was left for a competing one.
        alternatives: (node id, score) of the chosen node then the best others, at most top_k.
        spawn: node_id is the parent of a new action to add and try (see the field).
    """

    node_id: str
    reason: str
    score: float
    backoff: bool = False
    alternatives: tuple[tuple[str, float], ...] = ()
    #: ``node_id`` is a parent: the controller adds a new open child under it (an improvement of its kernel,
    #: payload ``improve``) and tries that (`StrategyConfig.spawn`)
    spawn: bool = False


class ScoreTerms(NamedTuple):
    """The parts of a selection score (see `score`)."""

    mean: float
    explore: float
    cost: float
    exploit: float
    total: float


DEFAULT = StrategyConfig()


def score_terms(node: Node, tree: Tree, cfg: StrategyConfig = DEFAULT) -> ScoreTerms:
    """The selection score of an open node, term by term (see `score` for the formula)."""
    r, c = node.rating / 10.0, node.confidence
    mean = c * r + (1.0 - c) * cfg.prior_rating / 10.0
    tried = sum(1 for s in tree.siblings(node.id) if s.status in _TRIED)
    explore = cfg.explore * (1.0 - c) / math.sqrt(1.0 + tried)
    cost = cfg.difficulty_cost * (node.difficulty - 1) / 4.0
    depth = tree.depth(node.id)
    parent_score = tree.parent_score(node.id)
    best = tree.best()
    best_score = best.evaluation.score if best and best.evaluation else 1.0
    quality = min(1.0, parent_score / best_score) if parent_score and best_score else 0.0
    exploit = cfg.depth_bonus * quality * (1.0 - 1.0 / depth) if depth >= 1 else 0.0
    return ScoreTerms(mean, explore, cost, exploit, mean + explore - cost + exploit)


def score(node: Node, tree: Tree, cfg: StrategyConfig = DEFAULT) -> float:
    """Selection score of an open node: an optimistic (upper-confidence style) value, higher is better.

    ``score = mean + explore - cost + exploit`` with, for rating ``r`` (0-10), confidence ``c``
    (0-1), difficulty ``d`` (1-5) and depth ``k`` (1 = first level):

    - ``mean = c * r/10 + (1 - c) * prior/10``: the rating shrunk toward the prior (5/10) as far
      as the planner is unsure of it; a confident 9 beats a guessed 9.
    - ``explore = explore_w * (1 - c) / sqrt(1 + tried_siblings)``: a bonus that grows as
      confidence falls (the spread of the belief, as in UCB's mean + k * std) and shrinks as more
      alternatives at the same decision have been measured (diminishing information).
    - ``cost = difficulty_cost * (d - 1)/4``: hard actions cost attempts and fail more often.
    - ``exploit = depth_bonus * q * (1 - 1/k)``, ``q = min(1, parent_score / best_score)``: a
      mild, saturating preference for extending good measured paths (0 at first level, half the
      weight at depth 2); ``q`` discounts paths well behind the best (e.g. under a regression).

    With the defaults the terms span about mean 0-1, explore 0-0.3, cost 0-0.2, exploit 0-0.2, so
    no single number decides: a confident rating-7 easy action beats a rating-8 difficulty-4 one,
    and a low-confidence rating-6 one can beat a confident rating-7 one (exploration).

    Args:
        node: an open node of ``tree``.
        tree: the world model.
        cfg: strategy knobs.

    Returns:
        The score, about -0.2 to 1.5 with the defaults.
    """
    return score_terms(node, tree, cfg).total


def _tiebreak(seed: int, node_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{node_id}".encode()).digest()[:8], "big")


def _norm(title: str) -> str:
    return " ".join(title.lower().split())


def cooling(node: Node, tree: Tree, state: SearchState, cfg: StrategyConfig = DEFAULT) -> bool:
    """True when the node, or the same action title under the same parent, failed too recently.

    A failure in cycle ``k`` blocks until cycle ``k + 1 + cooldown_cycles`` starts, so a failed
    action is never chosen again at once, even when the planner re-proposes it as a new node.
    """
    for fid, k in state.recent_failures.items():
        if state.cycle >= k + 1 + cfg.cooldown_cycles or fid not in tree:
            continue
        failed = tree[fid]
        if fid == node.id:
            return True
        if failed.parent_id == node.parent_id and failed.action and node.action:
            if _norm(failed.action.title) == _norm(node.action.title):
                return True
    return False


def _label(tree: Tree, node_id: str | None) -> str:
    return "root" if node_id is None else f"'{tree[node_id].label}'"


def decide(tree: Tree, state: SearchState, cfg: StrategyConfig = DEFAULT) -> Decision | None:
    """Choose the next open action on the frontier, and say why.

    Steps: take the frontier (`Tree.frontier`); leave out cooling actions (`cooling`); the node the
    planner named (`Tree.chosen`, an edit ``choose``) is taken when it is left; else keep
    actions within the difficulty cap, unless none is, then relax the cap; while other actions are being
    judged (`Tree.in_flight`), keep the actions in branches with nothing in flight, else those answering
    another decision than the ones in flight, if any (`_spread`); when the active branch
    has gone ``stagnation_window`` evaluations without improving the best, keep only actions
    outside it if any (backoff to the best competing branch: the one holding the best-scoring
    action); rank by score, then lower difficulty, then higher rating, then a seeded hash of the id.

    Args:
        tree: the world model.
        state: the search state.
        cfg: strategy knobs.

    Returns:
        The decision, or None when no action can be tried now (the frontier is empty or every
        open action is cooling): the planner should be asked for new actions.
    """
    if cfg.kind == "random":
        return decide_random(tree, state, cfg)
    if cfg.kind == "evolve":
        return decide_evolve(tree, state, cfg)
    frontier = tree.frontier()
    cool = [n.id for n in frontier if cooling(n, tree, state, cfg)]
    pool = [n for n in frontier if n.id not in cool]
    if not pool:
        return None
    notes = [f"cooldown skips {', '.join(cool)}"] if cool else []
    capped = [n for n in pool if n.difficulty <= cfg.difficulty_cap]
    if not capped:
        capped = pool
        notes.append(f"difficulty cap {cfg.difficulty_cap} relaxed: every open action is harder")
    ranked = sorted(
        ((score(n, tree, cfg), n) for n in capped),
        key=lambda sn: (-round(sn[0], 9), sn[1].difficulty, -sn[1].rating, _tiebreak(cfg.seed, sn[1].id)),
    )
    if tree.in_flight:  # several evaluations at once: spread them over branches, not k near-copies
        spread = _spread(ranked, tree)
        if spread and spread[0][1].id != ranked[0][1].id:
            notes.append(f"spread: {ranked[0][1].id} waits, its branch or decision is being judged")
        ranked = spread or ranked
    chosen, backoff = ranked[0], False
    stale = state.active_branch
    k = state.branch_since_improvement
    picked = next(((score(n, tree, cfg), n) for n in pool if n.id == tree.chosen), None)
    if tree.chosen is not None and tree.chosen in cool:
        notes.append(f"the planner's choice {tree.chosen} is in its failure cooldown")
    if picked is not None:  # the planner named it (an edit `choose`): its word over the ranking and the backoff
        chosen, head = picked, "the planner's choice"
        if picked[1].id != ranked[0][1].id:
            notes.append(f"the ranking would take {ranked[0][1].id}")
    elif stale is not None and stale in tree and k >= cfg.stagnation_window:
        outside = [sn for sn in ranked if tree.branch_of(sn[1].id) != stale]
        if outside:
            chosen, backoff = outside[0], True
            head = (
                f"backoff: branch {_label(tree, stale)} stagnated {k} evals; "
                f"switching to {_label(tree, tree.branch_of(chosen[1].id))}"
            )
        else:
            head = f"branch {_label(tree, stale)} stagnated {k} evals"
            head += " but no competing branch is open; staying"
    else:
        head = "ranked first"  # why it was chosen (the ranking's top), not a measured result
    s, n = chosen
    detail = f"{n.id} {n.label!r}: ranking {s:.3f} (rating {n.rating:g}, confidence {n.confidence:g}, "
    detail += f"difficulty {n.difficulty}, depth {tree.depth(n.id)})"
    others = [(m.id, round(v, 6)) for v, m in ranked if m.id != n.id][: cfg.top_k - 1]
    return Decision(
        node_id=n.id,
        reason="; ".join([head, detail, *notes]),
        score=s,
        backoff=backoff,
        alternatives=((n.id, round(s, 6)), *others),
    )


def _rng(tree: Tree, state: SearchState, cfg: StrategyConfig) -> random.Random:
    """The draws of one decision: seeded by the run's seed and where the search stands (evaluations, nodes, jobs in
    flight), so a resumed run, or a run given the same order of completions, draws the same."""
    return random.Random(f"{cfg.seed}:{state.evaluations}:{len(tree)}:{sorted(tree.in_flight)}")


def _open_pool(tree: Tree, state: SearchState, cfg: StrategyConfig) -> list[Node]:
    """The frontier without actions in their failure cooldown."""
    return [n for n in tree.frontier() if not cooling(n, tree, state, cfg)]


def decide_random(tree: Tree, state: SearchState, cfg: StrategyConfig = DEFAULT) -> Decision | None:
    """The ``random`` strategy: an action drawn uniformly from the frontier (failed actions still wait out their
    cooldown), ratings and confidences ignored: the baseline that shows what the world model's ranking adds.
    With the patterns proposer the frontier is every one-step move of the pack from every kernel measured so far.
    None when nothing can be tried now."""
    if cfg.spawn:
        parent = _rng(tree, state, cfg).choice(_population(tree))
        return Decision(node_id=parent.id, spawn=True, score=0.0, alternatives=((parent.id, 0.0),), reason=(
            f"random: parent {parent.id}, uniform over {len(_population(tree))} kernels; a new improvement of it"))
    pool = _open_pool(tree, state, cfg)
    if not pool:
        return None
    n = _rng(tree, state, cfg).choice(pool)
    return Decision(node_id=n.id, reason=f"random: {n.id} {n.label!r}, uniform over {len(pool)} open actions",
                    score=0.0, alternatives=((n.id, 0.0),))


def _population(tree: Tree) -> list[Node]:
    """The programs an evolutionary loop breeds from: the root (the naive kernel) and every node holding a passing
    kernel (solved or regressed)."""
    return [n for n in tree if n.id == ROOT_ID or n.status in PASSING]


def decide_evolve(tree: Tree, state: SearchState, cfg: StrategyConfig = DEFAULT) -> Decision | None:
    """The ``evolve`` strategy: an evolutionary loop in the manner of OpenEvolve (islands, a MAP-Elites archive,
    parents drawn by exploration / exploitation / fitness; github.com/codelion/openevolve, its ProgramDatabase),
    over the same tree, judge and proposer: the tree is its archive of programs, not a plan it reasons over.

    1. Island: the evaluations so far modulo ``cfg.islands`` (islands take turns). Kernel families (first-level
       branches, in the order they were inserted) are dealt to the islands in turn; the root belongs to all.
    2. Archive: the island's population (the root and its passing kernels) binned by a MAP-Elites grid of
       (family, depth: the moves from the naive kernel, 4 and more in one bin); a cell's elite is its best score.
       Every ``cfg.migration_interval`` evaluations the global elites join the island's choice (migration).
    3. Parent: with probability ``cfg.exploration`` uniform over the population; with ``cfg.exploitation`` an
       elite, ranked by score, the i-th best with weight 1/(i+1); otherwise in proportion to the score.
    4. Child (the mutation): uniform over the parent's open actions (with the patterns proposer, the pack's
       one-step moves from the parent's kernel). A parent with none is set aside and another drawn; when no
       parent has any, uniform over the whole frontier. With ``cfg.spawn`` (no planner writes actions: the llm
       proposer) the parent itself is returned with ``spawn``: the controller adds an improvement of its kernel.

    Ratings, confidences and the planner's choice are not read. None when nothing can be tried now."""
    pool = {n.id for n in _open_pool(tree, state, cfg)}
    if not pool and not cfg.spawn:
        return None
    rng = _rng(tree, state, cfg)
    families = [n.id for n in tree.children(ROOT_ID)]
    island = state.evaluations % cfg.islands
    mine = {f for i, f in enumerate(families) if i % cfg.islands == island}
    population = [n for n in _population(tree) if n.id == ROOT_ID or tree.branch_of(n.id) in mine]

    def elites(nodes: list[Node]) -> list[Node]:
        cells: dict[tuple, Node] = {}
        for n in nodes:
            key = (tree.branch_of(n.id), min(tree.depth(n.id), 4))
            if key not in cells or (tree.score_of(n.id) or 0.0) > (tree.score_of(cells[key].id) or 0.0):
                cells[key] = n
        return sorted(cells.values(), key=lambda n: -(tree.score_of(n.id) or 0.0))

    archive = elites(population)
    migrated = state.evaluations > 0 and state.evaluations % cfg.migration_interval == 0
    if migrated:
        archive = elites(archive + elites(_population(tree)))
    candidates = list(population if not migrated else {n.id: n for n in population + archive}.values())
    tried: set[str] = set()
    while True:
        left = [n for n in candidates if n.id not in tried]
        if not left:
            break
        r = rng.random()
        elite_left = [n for n in archive if n.id not in tried]
        if r < cfg.exploration or not elite_left:
            parent, how = rng.choice(left), "explore"
        elif r < cfg.exploration + cfg.exploitation:
            parent = rng.choices(elite_left, weights=[1.0 / (i + 1) for i in range(len(elite_left))])[0]
            how = "exploit"
        else:
            parent = rng.choices(left, weights=[tree.score_of(n.id) or 1e-3 for n in left])[0]
            how = "fitness"
        if cfg.spawn:
            return Decision(node_id=parent.id, spawn=True, score=0.0, alternatives=((parent.id, 0.0),), reason=(
                f"evolve: island {island + 1} of {cfg.islands}{' (migration)' if migrated else ''}, parent "
                f"{parent.id} ({how}, {_g(tree.score_of(parent.id))}x); a new improvement of it"))
        kids = [k for k in tree.children(parent.id) if k.id in pool]
        if kids:
            child = rng.choice(kids)
            return Decision(node_id=child.id, score=0.0, alternatives=((child.id, 0.0),), reason=(
                f"evolve: island {island + 1} of {cfg.islands}{' (migration)' if migrated else ''}, parent "
                f"{parent.id} ({how}, {_g(tree.score_of(parent.id))}x), child {child.id} {child.label!r} uniform "
                f"over its {len(kids)} open actions"))
        tried.add(parent.id)
    n = tree[rng.choice(sorted(pool))]
    return Decision(node_id=n.id, score=0.0, alternatives=((n.id, 0.0),), reason=(
        f"evolve: island {island + 1} of {cfg.islands} has no parent with open actions; {n.id} {n.label!r} "
        f"uniform over the frontier ({len(pool)})"))


def _g(x: float | None) -> str:
    return "?" if x is None else f"{x:.3g}"


def _spread(ranked: list[tuple[float, Node]], tree: Tree) -> list[tuple[float, Node]]:
    """The ranked actions that do not crowd the ones in flight: those in branches with nothing in flight; else
    those whose parent has no child in flight (another decision, not a near-copy of one being judged); else
    none (empty: the ranking stands)."""
    busy = [tree[i] for i in tree.in_flight if i in tree]
    branches = {tree.branch_of(n.id) for n in busy}
    parents = {n.parent_id for n in busy}
    return [sn for sn in ranked if tree.branch_of(sn[1].id) not in branches] or \
        [sn for sn in ranked if sn[1].parent_id not in parents]


def select(tree: Tree, state: SearchState, cfg: StrategyConfig = DEFAULT) -> str | None:
    """The id of the node `decide` chooses, or None when nothing can be tried now."""
    d = decide(tree, state, cfg)
    return d.node_id if d else None


def update_state(
    state: SearchState, tree: Tree, node_id: str, outcome: EvalSummary, *, end_cycle: bool = True
) -> SearchState:
    """Record one evaluation of an attempt at ``node_id``.

    An evaluation *improves* when it passed, is not a regression and beats the best: with paired
    timings, when it was found faster than the best beside it (``outcome.vs_best``) and not slower
    than its parent (``outcome.vs_parent``); otherwise when its score is not below the parent's
    (`Tree.parent_score`) and beats the best score strictly. That resets both stagnation counters. A regression is recorded in ``regressions`` and counts as no progress: it never
    becomes the best and does not reset stagnation. Moving to another branch restarts the branch
    counter.

    Args:
        state: the state before.
        tree: the world model (before or after `attach`; only parents' scores are read).
        node_id: the node the attempt was made for.
        outcome: the attempt's evaluation; with ``end_cycle`` the cycle's result (the one attached).
        end_cycle: True for the last call of a cycle: counts the cycle, and a failing outcome
            starts the node's cooldown.

    Returns:
        The new state.
    """
    branch = tree.branch_of(node_id)
    parent = tree.parent_score(node_id)
    passed, new = outcome.passed, outcome.score or 0.0
    if outcome.vs_parent is not None:
        regression = passed and outcome.vs_parent == "slower"
    else:
        regression = passed and parent is not None and new < parent
    if outcome.vs_best is not None:
        improved = passed and not regression and outcome.vs_best == "faster"
    else:
        improved = passed and not regression and (state.best_score is None or new > state.best_score)
    upd: dict = {"evaluations": state.evaluations + 1}
    branch_count = state.branch_since_improvement if branch == state.active_branch else 0
    if improved:
        upd.update(best_score=outcome.score, best_node_id=node_id, since_improvement=0,
                   branch_since_improvement=0)
    else:
        upd.update(since_improvement=state.since_improvement + 1, branch_since_improvement=branch_count + 1)
    upd["active_branch"] = branch
    if regression and node_id not in state.regressions:
        upd["regressions"] = (*state.regressions, node_id)
    if end_cycle:
        if not passed:
            upd["recent_failures"] = {**state.recent_failures, node_id: state.cycle}
        upd["cycle"] = state.cycle + 1
    return state.model_copy(update=upd)


def _clamp(x: float, lo: float, hi: float) -> float:
    return round(min(hi, max(lo, x)), 3)


def evidence_rating(speedup: float) -> float:
    """Map a measured speedup over the parent to a 0-10 rating: ``10 s^2 / (1 + s^2)``.

    1.0x -> 5, 2x -> 8, 3x -> 9, 0.5x -> 2: symmetric in log-speedup, saturating at 0 and 10.
    """
    return 10.0 * speedup * speedup / (1.0 + speedup * speedup)


def revise(
    tree: Tree, node_id: str, measured: float | None = None, cfg: StrategyConfig = DEFAULT
) -> list[Update]:
    """Edits that move ratings and confidences toward the evidence of a tried node.

    - The node: rating moves toward the evidence rating (`evidence_rating` of the speedup over its
      parent, or ``fail_rating`` when it failed) by ``1 - c/2`` of the gap (far when the planner
      was unsure), and confidence closes half its gap to 1.
    - Open siblings (competing alternatives): rating moves by ``-sibling_nudge * (e - r)``: when
      the node beat its rating, the alternatives lose a little; when it fell short, they gain.
    - Open children (only if the node passed): rating moves by ``child_nudge * (e - 5)``: a
      good base makes the steps planned on it more promising.
    - When the action predicted a speedup, siblings' and children's confidence is scaled by
      ``1 - 0.5 * min(1, |log2(measured / predicted)|)``: a prediction off by 2x or more halves it.

    Args:
        tree: the world model, with the node attached.
        node_id: a solved, regressed or failed node.
        measured: the node's speedup over its parent's candidate (> 0); None takes it from the tree.
        cfg: strategy knobs (fail_rating, sibling_nudge, child_nudge).

    Returns:
        `Update` edits (rating and confidence only) for nodes whose values change; empty for the root.

    Raises:
        SearchError: unknown node, or a node not tried yet.
    """
    node = tree[node_id]
    if node.status not in _TRIED:
        raise SearchError(f"node {node_id!r} is {node.status.value}; only a tried node can be revised")
    if node.parent_id is None:
        return []
    passed = node.status in PASSING
    if passed and measured is None:
        parent = tree.parent_score(node_id) or 1.0
        measured = node.evaluation.score / parent  # type: ignore[union-attr,operator]
    e = evidence_rating(measured) if passed and measured else cfg.fail_rating
    surprise = None
    if passed and measured and node.action and node.action.expected_speedup:
        surprise = min(1.0, abs(math.log2(measured / node.action.expected_speedup)))
    r, c = node.rating, node.confidence
    out = []

    def emit(n: Node, rating: float, confidence: float) -> None:
        rating, confidence = _clamp(rating, 0, 10), _clamp(confidence, 0, 1)
        if (rating, confidence) != (n.rating, n.confidence):
            out.append(Update(node_id=n.id, fields={"rating": rating, "confidence": confidence}))

    emit(node, r + (1 - c / 2) * (e - r), c + (1 - c) / 2)
    shrink = 1.0 if surprise is None else 1.0 - 0.5 * surprise
    for s in tree.siblings(node_id):
        if s.status == NodeStatus.OPEN:
            emit(s, s.rating - cfg.sibling_nudge * (e - r), s.confidence * shrink)
    if passed:
        for ch in tree.children(node_id):
            if ch.status == NodeStatus.OPEN:
                emit(ch, ch.rating + cfg.child_nudge * (e - 5.0), ch.confidence * shrink)
    return out
