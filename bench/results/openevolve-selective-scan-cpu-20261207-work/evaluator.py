"""OpenEvolve's evaluator for a ksearch task: written by bench/openevolve_peer.py."""
import json, math, os, time
from pathlib import Path

SETUP = json.loads(Path(__file__).with_name("setup.json").read_text())
_judge = None
_naive = None


def _get():
    global _judge, _naive
    if _judge is None:
        from ksearch.eval.evaluator import EvalConfig, Evaluator
        from ksearch.hardware.spec import HardwareSpec
        from ksearch.run.controller import Controller, RunConfig
        from ksearch.tasks import load_task
        cfg = RunConfig.model_validate(SETUP["run"])
        hw = HardwareSpec.model_validate(SETUP["hardware"]) if SETUP.get("hardware") else None
        ecfg = Controller.eval_config(cfg)
        ecfg.profile = False
        task = load_task(cfg.task)
        _judge = Evaluator(task, cfg.target, hw, ecfg)
        _naive = _judge.naive_candidate()
        _judge.measure_naive(task.select(cfg.workloads))
    return _judge, _naive


def evaluate(program_path):
    from ksearch.eval.timing import Reference
    from ksearch.records import Candidate
    from ksearch.run.controller import score_of
    judge, naive = _get()
    t0 = time.monotonic()
    source = Path(program_path).read_text()
    cand = Candidate(target=SETUP["run"]["target"], sources={SETUP["file"]: source},
                     compile_flags=SETUP.get("flags", []))
    ev = judge.evaluate(cand, SETUP["run"].get("workloads"), SETUP["timing"], references=[Reference("naive", naive)])
    score = score_of(ev) or 0.0
    with open(Path(__file__).with_name("judged.jsonl"), "a") as f:
        f.write(json.dumps({"candidate_id": cand.id, "status": ev.status.value, "score": score,
                            "wall_s": round(time.monotonic() - t0, 2), "message": (ev.message or "")[:300]}) + "\n")
    metrics = {"combined_score": score, "correct": 1.0 if ev.status.value == "PASSED" else 0.0}
    try:
        from openevolve.evaluation_result import EvaluationResult
        return EvaluationResult(metrics=metrics, artifacts={"judge": f"{ev.status.value}: {(ev.message or '')[:1500]}"})
    except ImportError:
        return metrics
