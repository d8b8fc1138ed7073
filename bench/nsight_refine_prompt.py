"""Record a cuda-target ``plan:refine`` prompt that carries Nsight Compute metrics (issue 20, on a GPU machine).

A two-evaluation llm search of selective-scan-fp16 on the cuda target, at ``--context hardware`` (the judge then
profiles passing kernels: `ksearch.run.controller.Controller.eval_config`), driven through the ``command`` backend
by this script's scripted stand-in: the planner gets two fixed families and one next step per refine; the coder
answers every kernel with the pack-built warp-chunks kernel a 40-evaluation search found on the H200
(bench/results/gpu-selective-scan-search-h200-20261130-best-candidate.json), marked per node so every candidate
is distinct. The stand-in writes every prompt it is sent to OUTDIR (``NN-<purpose>.md``); the script then checks
that the refine prompt holds the profiler's metrics and prints its profiler section. The replies are scripted:
this records what the prompts carry, not what a model does with it.

    python bench/nsight_refine_prompt.py OUTDIR        (needs an NVIDIA GPU, CuPy, and ncu on PATH or in CUDA)
    python bench/nsight_refine_prompt.py --respond OUTDIR < prompt.txt    (the command backend's call)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEST = HERE / "results" / "gpu-selective-scan-search-h200-20261130-best-candidate.json"
WORKLOADS = "tiny,odd,mamba370m-L512"


def _kernel(node: str) -> str:
    cand = json.loads(BEST.read_text())
    import ast
    import yaml

    sources = ast.literal_eval(cand["sources"]) if isinstance(cand["sources"], str) else cand["sources"]
    launch = ast.literal_eval(cand["launch"]) if isinstance(cand["launch"], str) else cand["launch"]
    body = f"// node {node}\n" + sources["kernel.cu"]
    return f"```cuda\n{body}\n```\n\n```yaml\n{yaml.safe_dump(launch, sort_keys=False)}```\n"


def respond(outdir: Path, text: str) -> str:
    outdir.mkdir(parents=True, exist_ok=True)
    purpose = os.environ.get("KSEARCH_LLM_PURPOSE", "unknown")
    n = len(list(outdir.glob("*.md"))) + 1
    (outdir / f"{n:02d}-{purpose.replace(':', '-')}.md").write_text(text)
    user = text.split("=== user ===", 1)[-1]
    if purpose.startswith("code:"):
        node = re.search(r"node (\S+)", user)
        return _kernel(node.group(1) if node else str(n))
    fam = lambda i: {"op": "insert", "parent_id": "root", "id": f"fam{i}", "decision": "kernel family",
                     "choice": f"warp-chunks {i}", "rating": 7 - i, "confidence": 0.5,
                     "action": {"title": f"warp per row, chunked scan ({i})", "description": "one warp per "
                                "(batch, channel) row, the scan chunked along the sequence", "difficulty": 3,
                                "expected_speedup": 20.0}}
    if purpose == "plan:initial":
        return "```json\n" + json.dumps([fam(1), fam(2)]) + "\n```\n"
    just = re.search(r"# Node just evaluated: (\S+)", user)
    parent = just.group(1) if just else "root"
    step = {"op": "insert", "parent_id": parent, "id": f"step{n}", "decision": "tuning", "choice": f"tile {n}",
            "rating": 6, "confidence": 0.5, "payload": {"improve": True},
            "action": {"title": f"tune the chunk length ({n})", "description": "try chunk lengths 64 to 256"}}
    return "```json\n" + json.dumps([step]) + "\n```\n"


def main() -> int:
    if sys.argv[1] == "--respond":
        sys.stdout.write(respond(Path(sys.argv[2]), sys.stdin.read()))
        return 0
    outdir = Path(sys.argv[1]).resolve()
    prompts = outdir / "prompts"
    cmd = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} --respond {prompts}"
    argv = [sys.executable, "-m", "ksearch", "run", "selective-scan-fp16", "--target", "cuda", "--proposer", "llm",
            "--backend", "command", "--command", cmd, "--context", "hardware", "--budget", "2", "-w", WORKLOADS,
            "--model", "scripted-stand-in"]
    print("$", " ".join(shlex.quote(a) for a in argv), flush=True)
    rc = subprocess.call(argv)
    refines = sorted(prompts.glob("*-plan-refine.md"))
    if not refines:
        print(f"no plan:refine prompt was sent (ksearch exited {rc})")
        return 1
    text = refines[0].read_text()
    section = text[text.find("Profiler and compiler evidence"):]
    section = section[:section.find("\nRefine the world model")]
    print(f"\n{refines[0].name}, its profiler section:\n{section}")
    ok = "achieved_occupancy_pct=" in section and "dram_throughput_pct=" in section
    print("\nNsight Compute metrics in the refine prompt:", "yes" if ok else "NO")
    return 0 if ok and rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
