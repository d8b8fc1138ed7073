"""Launch chosen selective-scan pack kernels (bench/gpu/selective_scan_kernels.json) once each on one shape, for
Nsight Compute to profile (bench/gpu/scan_profile.sh): batch 1, d_inner 2048, d_state 16, fp16, L from argv.

    python3 bench/gpu/scan_profile.py 4096 "warp-chunks 8i 8w 2u smem ff" ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    import torch
    from selective_scan_h200 import KERNELS_FILE, CudaCandidate
    from ss_baselines import make_inputs

    L, labels = int(sys.argv[1]), sys.argv[2:]
    specs = {k["label"]: k for k in json.loads(KERNELS_FILE.read_text())["cuda"]}
    inputs = make_inputs(1, 2048, 16, L, torch.float16, seed=0)
    out = torch.empty_like(inputs[0])
    ls = torch.empty(1, 2048, 16, device="cuda", dtype=torch.float32)
    for label in labels:
        k = CudaCandidate(specs[label])
        launch = k.bind(inputs, out, ls)
        launch()
        torch.cuda.synchronize()
        print("launched", label, flush=True)


if __name__ == "__main__":
    main()
