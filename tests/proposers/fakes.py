"""Helpers of the llm proposer's tests: a scripted fake client, a fixed hardware spec, small trees."""

from __future__ import annotations

import json

from ksearch.records import Candidate, Evaluation, Status, WorkloadResult
from ksearch.hardware.spec import CacheLevel, HardwareSpec
from ksearch.llm.base import LLMReply
from ksearch.search.edits import Insert, apply
from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, Tree, attach
from ksearch.tasks import load_task

TASK = load_task("selective-scan")
BENCH = [w.name for w in TASK.workloads if w.purpose == "bench"]
NAIVE_MS = {name: 40.0 * 2 ** i for i, name in enumerate(BENCH)}


class FakeClient:
    """Answers ``ask`` with scripted replies in order (a str becomes LLMReply(text=...); an exception instance is
    raised) and records every call: role, purpose, messages, model, max_tokens, node_id."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.calls: list[dict] = []

    def ask(self, role, purpose, messages, *, model, max_tokens=4096, node_id=None):
        self.calls.append(dict(role=role, purpose=purpose, messages=list(messages), model=model,
                               max_tokens=max_tokens, node_id=node_id))
        if not self.replies:
            raise AssertionError(f"unexpected call #{len(self.calls)} ({purpose}): no scripted reply left")
        r = self.replies.pop(0)
        if isinstance(r, BaseException):
            raise r
        return r if isinstance(r, LLMReply) else LLMReply(text=r, model=model)

    def last_user(self) -> str:
        return self.calls[-1]["messages"][-1].content

    def purposes(self) -> list[str]:
        return [c["purpose"] for c in self.calls]


class FakeEvidence:
    """What a run's store answers about candidates and evaluations (``candidate``, ``evaluation_of``)."""

    def __init__(self, candidates: dict[str, Candidate] | None = None,
                 evaluations: dict[str, Evaluation] | None = None):
        self.candidates, self.evaluations = candidates or {}, evaluations or {}

    def candidate(self, cid):
        return self.candidates.get(cid)

    def evaluation_of(self, cid):
        return self.evaluations.get(cid)


def fixed_cpu_spec() -> HardwareSpec:
    """A CPU spec with fixed figures (never detected), so prompts are the same on every machine."""
    return HardwareSpec(
        name="test-cpu", kind="cpu", vendor="ExampleVendor", model="Example CPU 8-core", cores=8, threads=16,
        simd_isa=["avx2", "fma", "f16c"], simd_width_bits=256, simd_width=8,
        caches=[CacheLevel(level=1, kind="data", size_bytes=48 * 1024), CacheLevel(level=2, size_bytes=1 << 20),
                CacheLevel(level=3, size_bytes=32 << 20, shared_by_cores=8)],
        memory_bandwidth_gbs=60.0, peak_flops={"float32": 1.2e12}, exp_rate_per_s=8.0e9,
        source="fixed spec for tests")


def fixed_gpu_spec() -> HardwareSpec:
    return HardwareSpec(
        name="test-gpu", kind="gpu", vendor="NVIDIA", model="Example GPU", cores=132, threads=270336,
        simd_width=32, memory_bandwidth_gbs=4800.0, peak_flops={"float32": 6.0e13, "float16": 9.0e14},
        exp_rate_per_s=2.0e12, shared_memory_per_block_bytes=227 * 1024, max_threads_per_block=1024,
        source="fixed spec for tests")


def root_tree() -> Tree:
    """A tree whose root holds the measured naive kernel (what initial_edits sees)."""
    return attach(Tree.new(), ROOT_ID, "naive0000000000", EvalSummary(status="PASSED", score=1.0, latency_ms=NAIVE_MS))


def small_tree() -> Tree:
    """root -> fam-rows (solved, 4x) -> {exp-poly (open), tile (open, improve)}; root -> fam-lanes (open)."""
    tree, res = apply(root_tree(), [
        Insert(parent_id=ROOT_ID, id="fam-rows", decision="kernel family", choice="rows-omp",
               action=Action(title="rows in parallel", description="OpenMP over the (batch, channel) rows; state in a "
                             "local array", difficulty=2, expected_speedup=3.0), rating=7, confidence=0.5),
        Insert(parent_id=ROOT_ID, id="fam-lanes", decision="kernel family", choice="channel-lanes",
               action=Action(title="channels in SIMD lanes", description="8 channels per AVX2 vector, state in "
                             "registers", difficulty=3, expected_speedup=8.0), rating=8, confidence=0.4),
    ])
    assert all(r.ok for r in res)
    tree = attach(tree, "fam-rows", "candrows00000000",
                  EvalSummary(status="PASSED", score=4.0, latency_ms={k: v / 4 for k, v in NAIVE_MS.items()}))
    tree, res = apply(tree, [
        Insert(parent_id="fam-rows", id="exp-poly", decision="exp", choice="exp2-poly",
               action=Action(title="polynomial exp2", description="replace expf by a degree-5 polynomial exp2 with "
                             "log2(e) folded into A", difficulty=3, expected_speedup=2.0), rating=7, confidence=0.4),
        Insert(parent_id="fam-rows", id="tile", decision="tuning", choice="token tile",
               action=Action(title="tune the token tile", description="try token tiles of 32 to 256", difficulty=1),
               rating=5, confidence=0.3, payload={"improve": True}),
    ])
    assert all(r.ok for r in res)
    return tree


def edits_json(edits: list[dict], fence: bool = True, prose: str = "") -> str:
    body = json.dumps(edits, indent=1)
    return f"{prose}```json\n{body}\n```\n" if fence else body


def family(fid: str, **kw) -> dict:
    d = {"op": "insert", "parent_id": ROOT_ID, "id": fid, "decision": "kernel family", "choice": fid,
         "action": {"title": f"family {fid}", "description": f"implement family {fid}", "difficulty": 2,
                    "expected_speedup": 3.0},
         "rating": 6, "confidence": 0.5}
    d.update(kw)
    return d


def failing_evaluation(cid: str) -> Evaluation:
    return Evaluation(
        candidate_id=cid, task=TASK.name, target="cpu", status=Status.INCORRECT_NUMERICAL,
        message="odd: out beyond tolerance", compile_log="",
        workloads=[WorkloadResult(workload="tiny", status=Status.PASSED),
                   WorkloadResult(workload="odd", status=Status.INCORRECT_NUMERICAL,
                                  message="out: 17 of 12321 elements beyond tolerance",
                                  max_abs_err=0.37, max_rel_err=0.021),
                   WorkloadResult(workload="mamba370m-L512", status=Status.SKIPPED)])
