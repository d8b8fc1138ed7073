"""Tests for ksearch.report.summary: the final report's table and what it says of the best kernel's final checks
(the report itself, `ksearch.records.FinalReport`, is built here from hand-made measurements)."""

from ksearch.records import Evaluation, FinalMeasurements, FinalReport, HiddenWorkloads, Status, WorkloadResult
from ksearch.report.summary import summary_table, verdict_lines

RUN = {"id": "r1", "task": "t", "target": "cpu", "status": "finished"}


def _ev(status: Status, ms: float | None, message: str = "", cid: str = "c") -> Evaluation:
    return Evaluation(candidate_id=cid, task="t", target="cpu", status=status, message=message,
                      workloads=[WorkloadResult(workload="w", status=status, median_ms=ms)])


def _hidden(status: Status, message: str = "", axes=({"n": 3}, {"n": 7})) -> HiddenWorkloads:
    return HiddenWorkloads(axes=list(axes), evaluation=Evaluation(candidate_id="c", task="t", target="cpu",
                                                                 status=status, message=message))


def _report(best: Evaluation | None = None, reference: dict | None = None, hidden: HiddenWorkloads | None = None,
            notes: list[str] | None = None, reference_name: str = "numpy") -> FinalReport:
    final = FinalMeasurements(best_candidate_id=best.candidate_id if best else None,
                              naive=_ev(Status.PASSED, 4.0, cid="n"), best=best, hidden=hidden,
                              reference=reference or {}, reference_name=reference_name, reference_notes=notes or [])
    return FinalReport.build(RUN, 5 if best else 0, "n1" if best else None, final, "/k.c" if best else None)


def test_summary_rows_and_speedups():
    s = _report(_ev(Status.PASSED, 1.0), {"w": WorkloadResult(workload="w", status=Status.PASSED, median_ms=8.0)})
    (row,) = s.workloads
    assert row.speedup_vs_naive == 4.0 and row.speedup_vs_reference == 8.0
    assert s.best_status is Status.PASSED and s.hidden_workloads is None
    assert "hidden_workloads" not in s.model_dump(mode="json")
    assert summary_table(s).row_count == 1


def test_a_best_kernel_that_fails_a_hidden_workload_is_said_so():
    best = _ev(Status.INCORRECT_NUMERICAL, 1.0, "hidden workload hidden-1: 3 of 21 elements outside")
    s = _report(best, hidden=_hidden(Status.INCORRECT_NUMERICAL, "hidden-1: 3 of 21 elements outside"))
    assert s.hidden_workloads.status is Status.INCORRECT_NUMERICAL and s.hidden_workloads.axes[1] == {"n": 7}
    (line,) = verdict_lines(s)
    assert "FAILED its final check (INCORRECT_NUMERICAL)" in line and "hidden-1" in line


def test_hidden_workloads_passed_or_skipped_are_reported():
    s = _report(_ev(Status.PASSED, 1.0), hidden=_hidden(Status.PASSED))
    assert verdict_lines(s) == ["the best kernel also passed 2 hidden workloads (sizes drawn with a secret seed): "
                                "n=3; n=7"]
    s = _report(_ev(Status.PASSED, 1.0), hidden=_hidden(Status.SKIPPED, "no valid hidden workload", axes=()))
    assert verdict_lines(s) == ["hidden workloads: SKIPPED: no valid hidden workload"]
    assert verdict_lines(_report()) == []


def test_baseline_notes_reach_the_summary_and_its_lines():
    s = _report(_ev(Status.PASSED, 1.0), reference_name="reference",
                notes=["baseline torch-sdpa skipped: torch is not installed (pip install torch)"])
    assert s.reference_notes == ["baseline torch-sdpa skipped: torch is not installed (pip install torch)"]
    assert any("torch is not installed" in line for line in verdict_lines(s))


def test_the_tree_view_counts_hidden_open_and_dropped_nodes_apart():
    """Folded children are named for what they are: dropped nodes are no open actions."""
    from rich.console import Console

    from ksearch.report.summary import tree_view
    from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, Node, NodeStatus, Tree, attach

    t = attach(Tree.new(), ROOT_ID, "base", EvalSummary(status="PASSED", score=1.0, latency_ms={"w": 1.0}))
    t = t.replace(*(Node(id=f"o{i}", parent_id=ROOT_ID, action=Action(title=f"o{i}")) for i in range(3)),
                  Node(id="d0", parent_id=ROOT_ID, action=Action(title="d0"), status=NodeStatus.DROPPED))
    console = Console(width=200, record=True)
    console.print(tree_view(t, show_open=False))
    text = console.export_text()
    assert "… 3 open actions, 1 dropped" in text and "o1" not in text


def test_the_decision_path_says_which_step_took_a_setting_away():
    """n1 sets a knob of the tiled choice; n2 replaces the choice (untiled: no such knob): n1's line says its
    setting is not in the kernel and names n2; nodes without a pack path (llm) are shown as they are."""
    from ksearch.report.summary import decision_path
    from ksearch.search.edits import Insert, apply
    from ksearch.search.worldmodel import ROOT_ID, Action, Tree

    def node(parent, decision, choice, knobs, step, choices=None):
        return Insert(parent_id=parent, decision=decision, choice=choice, action=Action(title=choice),
                      payload={"choices": choices or {"pre": "tiled"}, "knobs": knobs, "step": step})

    tree, (r1,) = apply(Tree.new(), [node(ROOT_ID, "knob token_tile", "token_tile=32", {"token_tile": 32},
                                          {"knob": "token_tile", "value": 32})])
    tree, (r2,) = apply(tree, [node(r1.node_ids[0], "pre-pass", "untiled", {},
                                    {"decision": "pre", "choice": "untiled"}, {"pre": "untiled"})])
    lines = decision_path(tree, r2.node_ids[0])
    assert "token_tile=32  [not in this kernel: dropped by" in lines[1] and r2.node_ids[0] in lines[1]
    assert "not in this kernel" not in lines[0] + lines[2]
