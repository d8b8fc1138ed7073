"""Find what stops CUDA inside an evaluation worker: run a tiny CuPy program under the worker's environment and
each of its resource limits, one at a time, then the cuda target in-process. Run on the GPU machine:
    PYTHONPATH=src python3 bench/gpu/diag_cuda_worker.py
"""

import resource
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

PROG = ("import cupy, sys; a = cupy.arange(8, dtype=cupy.float32); "
        "m = cupy.RawModule(code='extern \"C\" __global__ void k(float* x){x[threadIdx.x]*=2;}'); "
        "m.get_function('k')((1,), (8,), (a,)); cupy.cuda.runtime.deviceSynchronize(); print('ok', float(a.sum()))")


def attempt(label, env=None, limits=()):
    def pre():
        for which, value in limits:
            resource.setrlimit(which, (value, value))
    p = subprocess.run([sys.executable, "-c", PROG], env=env, capture_output=True, text=True, preexec_fn=pre,
                       timeout=120)
    tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or [""]
    print(f"{label:<40} rc={p.returncode} {tail[0][:200]}")


def main():
    from ksearch.jail.sandbox import scrubbed_env

    home = Path(tempfile.mkdtemp())
    attempt("full environment")
    env = scrubbed_env(home, gpu=True)
    print("worker env keys:", sorted(env))
    attempt("worker environment", env)
    for name, which, value in (("core 0", resource.RLIMIT_CORE, 0), ("fsize 1 GiB", resource.RLIMIT_FSIZE, 1 << 30),
                               ("nproc 256", resource.RLIMIT_NPROC, 256), ("cpu 600 s", resource.RLIMIT_CPU, 600),
                               ("as 16 GiB", resource.RLIMIT_AS, 16 << 30)):
        attempt(f"worker env + {name}", env, [(which, value)])
    attempt("stdin /dev/null + worker env", env)
    try:
        from ksearch.records import Candidate
        from ksearch.targets.cuda import CudaTarget
        from ksearch.tasks import load_task

        t = load_task("selective-scan-fp16")
        c = Candidate(target="cuda", sources={"kernel.cu": t.naive_sources["cuda"]}, launch=t.naive_launch["cuda"])
        built = CudaTarget().compile(c, t.definition)
        print("compile:", built.ok, built.log[:300])
        runner = CudaTarget().load(built.artifact, c, t.definition)
        print("in-process load: ok", type(runner).__name__)
    except Exception:
        traceback.print_exc()


if __name__ == "__main__" and "--workers" not in sys.argv:
    main()


def workers():
    """The naive CUDA kernel loaded and called by real workers under each sandbox setting."""
    from ksearch.eval.evaluator import WORKER_MODULE
    from ksearch.jail.sandbox import Policy, Worker
    from ksearch.protocol import LoadRequest
    from ksearch.records import Candidate
    from ksearch.targets.cuda import CudaTarget
    from ksearch.tasks import load_task

    t = load_task("selective-scan-fp16")
    c = Candidate(target="cuda", sources={"kernel.cu": t.naive_sources["cuda"]}, launch=t.naive_launch["cuda"])
    built = CudaTarget().compile(c, t.definition)
    for ns in ("off", "auto"):
        for sec in (False, True):
            scratch = Path(tempfile.mkdtemp())
            w = Worker(scratch, Policy(namespaces=ns, seccomp=sec, gpu=True), readable=[built.artifact.parent],
                       module=WORKER_MODULE)
            try:
                r = w.request(LoadRequest(target="cuda", artifact=str(built.artifact), candidate=c,
                                          definition=t.definition.model_dump(mode="json")), 120)
                print(f"namespaces={ns} seccomp={sec}: {r.model_dump_json()[:300]}")
            except Exception as e:
                print(f"namespaces={ns} seccomp={sec}: {type(e).__name__}: {e}")
            print("   stderr:", w.stderr_tail()[-1500:].replace("\n", "\n   "))
            w.close()


if __name__ == "__main__" and "--workers" in sys.argv:
    workers()
