"""What a search can do for a target whose device is absent: generate its candidates and check them statically.

Used by ``ksearch run --target mlx-metal`` on a machine without an Apple GPU (a target whose
``checks_without_device`` says so): the offline proposer's knowledge
pack is rendered along every first step a search would take (the naive kernel, each family's default path,
each choice of each decision that applies to it), each candidate goes through the target's compile step (file
set and launch checks), the static rules and limits of the target (`eval.static_checks`), and its launch is
resolved for every workload of the task. Then the run stops where a device is needed, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from ksearch.eval import static_checks
from ksearch.records import Candidate
from ksearch.knowledge.pack import load_pack
from ksearch.targets import get_target
from ksearch.tasks.loader import Task


@dataclass
class Checked:
    """One generated candidate: ``label`` (family and choices), ``problem`` (None when every check passed)."""

    label: str
    candidate: Candidate
    problem: str | None


def _paths(pack) -> list[dict[str, str]]:
    out = []
    for fam in pack.families:
        out.append({"family": fam.id})
        for dec in pack.decisions:
            if dec.applies_to(fam.id):
                out += [{"family": fam.id, dec.id: ch.id} for ch in dec.choices
                        if ch.applies_to(fam.id) and ch.id != dec.default_for(fam.id)]
    return out


def check_candidates(task: Task, target: str, workloads=None) -> list[Checked]:
    """Generate the candidates a search would start from (see the module docstring) and check each without a
    device. ``workloads``: names to resolve launches for (default: all). Raises KnowledgeError when the task has
    no pack for ``target``."""
    t = get_target(target)
    selected = task.select(workloads)
    rules = static_checks.rules_for(t.rule_family)
    generated: list[tuple[str, Candidate]] = []
    naive = t.naive_candidate(task)
    if naive is not None:
        generated.append(("naive (the task's)", naive))
    pack = load_pack(task.definition.name, target)
    for path in _paths(pack):
        k = pack.render(task.definition, path)
        label = " ".join([k.family] + [f"{d}={c}" for d, c in path.items() if d != "family"])
        generated.append((label, k.candidate()))
    out = []
    for label, cand in generated:
        out.append(Checked(label, cand, _problem(t, cand, task, rules, selected)))
    return out


def _problem(t, cand: Candidate, task: Task, rules, selected) -> str | None:
    res = t.compile(cand, task.definition, 60.0)
    if not res.ok:
        return f"compile step: {res.log}"
    findings = static_checks.check(cand, rules)
    if findings:
        return "static checks: " + "; ".join(str(f) for f in findings)
    for w in selected:  # the launch must resolve for every workload (`Target.launch_problem`)
        problem = t.launch_problem(cand, task.definition, task.definition.axis_values(w))
        if problem:
            return f"launch for workload {w.name or w.uuid}: {problem}"
    return None
