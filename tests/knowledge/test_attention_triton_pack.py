"""The attention triton pack (prefill, causal and non-causal). Without a GPU: every family's default path and every
single move from a family's root renders, passes the triton static rules and the target's controller-side compile;
under Triton's interpreter (TRITON_INTERPRET=1, CPU torch tensors) each of them matches the task's float64
reference within its tolerance on small shapes (odd seqlen, GQA, MQA, head_dim 80, seqlen 1, head_dim 16), fast
combinations also on head_dim 256 and large logits, and a flash variant without the running-max rescale fails.
The bfloat16 tasks: every move renders and passes the static rules; the naive module and a few paths match the
reference in the interpreter on bfloat16 tensors (whose tl.dot the worker widens to float32: see WORKER).
The interpreter checks the math (indices, masks, the online softmax), not what a GPU compile would do (layouts,
shared memory, registers, pipelining). Skipped without torch or triton."""

import importlib.util
import re

import pytest

from ksearch.eval import static_checks
from ksearch.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.targets import get_target
from ksearch.tasks import load_task

from .paths import path_id, random_paths, single_moves
from .triton_interp import SERVE, interpreter_worker

TASKS = ["attention-prefill", "attention-prefill-noncausal"]
BF16_TASKS = ["attention-prefill-bf16", "attention-prefill-noncausal-bf16"]
CAUSAL_TASKS = {"attention-prefill", "attention-prefill-bf16"}

#: (name, batch, q_heads, kv_heads, seqlen, head_dim, input std): small check-like shapes
SMALL = [("gqa-odd-d80", 1, 4, 2, 77, 80, 1.0), ("mha-b2", 2, 2, 2, 33, 64, 1.0), ("mqa-L1-d16", 1, 3, 1, 1, 16, 1.0)]
#: as SMALL, plus the shapes that need more of the interpreter's time
LARGER = SMALL + [("d256", 1, 2, 1, 40, 256, 1.0), ("large-logits", 1, 4, 2, 130, 128, 8.0)]

FAST = {"family": "flash", "exp": "exp2", "masking": "split-diagonal", "schedule": "heavy-first"}
COMBOS = [(FAST, {}), ({**FAST, "k_access": "strided"}, {"block_m": 64, "block_n": 128, "num_stages": 3}),
          (FAST, {"block_m": 64, "block_n": 32, "num_warps": 4}),
          ({"family": "naive-blocks", "exp": "exp2"}, {"block_m": 64, "block_n": 32}),
          ({**FAST, "loads": "tma"}, {"block_n": 32}),
          ({**FAST, "schedule": "persistent", "loads": "tma"}, {"block_n": 32, "programs_per_sm": 2})]


@pytest.fixture(scope="module")
def pack():
    return load_pack("attention-prefill", "triton")


MOVES = single_moves(load_pack("attention-prefill", "triton"))


def _candidate(source: str) -> Candidate:
    return Candidate(target="triton", sources={"kernel.py": source}, entry_point="run")


def test_moves_cover_both_families_and_every_decision(pack):
    fams = {c["family"] for c, _ in MOVES}
    decisions = {d for c, _ in MOVES for d in c if d != "family"}
    assert fams == {"naive-blocks", "flash"}
    assert decisions == {"exp", "k_access", "loads", "masking", "schedule"}  # tiles and launch move by their knobs


@pytest.mark.parametrize("task", TASKS + BF16_TASKS)
def test_every_move_and_sampled_path_renders_and_passes_static_rules(pack, task):
    d = load_task(task).definition
    rules = static_checks.rules_for("triton")
    for choices, knobs in MOVES + COMBOS + random_paths(pack, 30, seed=11):
        k = pack.render(d, choices, knobs)
        src = k.sources["kernel.py"]
        assert src == pack.render(d, choices, knobs).sources["kernel.py"]
        assert f"CAUSAL = {task in CAUSAL_TASKS}" in src
        assert f"head_dim]; {d.inputs['q'].dtype}." in src
        assert k.launch == {} and k.compile_flags == []
        findings = static_checks.check(_candidate(src), rules)
        assert findings == [], f"{k.choices} {k.knobs}: " + "; ".join(map(str, findings))
        assert get_target("triton").compile(_candidate(src), d).ok, (k.choices, k.knobs)


def test_description_says_what_ran_on_a_gpu_and_what_did_not(pack):
    assert "RAN ON THE H200" in pack.description and "NOT RUN ON A GPU" in pack.description


# -- under Triton's interpreter ---------------------------------------------------------------------------------


#: The interpreter's worker: TRITON_INTERPRET must be set before triton is first imported (triton.language's own
#: @triton.jit helpers, tl.max among them, are built at import), so the modules run in a subprocess that reads one
#: JSON request a line ({"source", "task", "shapes"}) and answers {"excess": {shape name: value}} or {"error"}:
#: the excess is max(|o - ref| - (atol + rtol |ref|)) of run() against the task's float64 reference on fresh
#: normal inputs in the task's dtype (float16 or bfloat16), null where o has a NaN or an unwritten element.
#: Triton's interpreter (3.x) holds bfloat16 as its uint16 bits and its tl.dot hands those integers to np.matmul
#: unconverted; the worker widens bfloat16 dot operands to float32 first (exact, as the tensor cores' products
#: with fp32 accumulation are). Its bfloat16 loads, stores and casts (p.to(bf16): nearest even) are its own.
WORKER = SERVE + r"""
import numpy as np, torch
from ksearch.tasks import load_task
import triton.language as tl
from triton.runtime import interpreter as interp

_dot = interp.InterpreterBuilder.create_dot

def _dot_bf16_as_f32(self, a, b, d, *args):
    widen = lambda h: (interp.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
                       if h.dtype.scalar == tl.bfloat16 else h)
    return _dot(self, widen(a), widen(b), d, *args)

interp.InterpreterBuilder.create_dot = _dot_bf16_as_f32

def excess(mod, task, shape):
    _, batch, hq, hkv, seqlen, dim, std = shape
    rng = np.random.default_rng(seqlen * 1000 + dim)
    dtype = task.definition.outputs["o"].dtype
    q, k, v = (torch.from_numpy(rng.normal(0, s, size=(batch, h, seqlen, dim))).to(getattr(torch, dtype))
               for s, h in ((std, hq), (std, hkv), (1.0, hkv)))
    o = torch.full((batch, hq, seqlen, dim), float("nan"), dtype=getattr(torch, dtype))
    mod.run(q, k, v, o)
    ns = {}
    exec(task.definition.reference, ns)
    ref = ns["run"](*(t.double().numpy() for t in (q, k, v)))
    got = o.double().numpy()
    if not np.isfinite(got).all():
        return None
    tol = task.definition.tolerance[dtype]
    return float(np.max(np.abs(got - ref) - (tol.atol + tol.rtol * np.abs(ref))))

serve(lambda mod, req: {"excess": {s[0]: excess(mod, load_task(req["task"]), s) for s in req["shapes"]}})
"""


@pytest.fixture(scope="module")
def interpreter():
    """check(source, task, shapes) -> {shape name: excess or None}, run by Triton's interpreter on CPU tensors in
    one worker process for the module. Skips without torch or triton, or where the interpreter cannot run."""
    for send in interpreter_worker(WORKER, {"source": load_task("attention-prefill").naive_sources["triton"],
                                            "task": "attention-prefill", "shapes": SMALL[2:]}):
        def check(source: str, task: str, shapes, send=send) -> dict:
            out = send({"source": source, "task": task, "shapes": shapes})
            assert "error" not in out, out["error"]
            return out["excess"]
        yield check


def _failures(excess: dict) -> dict:
    return {name: e for name, e in excess.items() if e is None or e > 0}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("path", MOVES, ids=[path_id(p) for p in MOVES])
def test_single_moves_match_reference_in_interpreter(pack, interpreter, task, path):
    choices, knobs = path
    kernel = pack.render(load_task(task).definition, choices, knobs)
    excess = interpreter(kernel.sources["kernel.py"], task, SMALL)
    assert not _failures(excess), (kernel.choices, kernel.knobs, excess)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("path", COMBOS, ids=[path_id(p) for p in COMBOS])
def test_fast_combinations_match_reference_in_interpreter(pack, interpreter, task, path):
    """Every fast choice together, BLOCK_N above and below BLOCK_M, head_dim 256 (run() shrinks the tiles), logits
    of std 64 (q, k ~ normal(0, 8))."""
    choices, knobs = path
    kernel = pack.render(load_task(task).definition, choices, knobs)
    excess = interpreter(kernel.sources["kernel.py"], task, LARGER)
    assert not _failures(excess), (kernel.choices, kernel.knobs, excess)


def _module(source: str, tmp_path):
    """The rendered module imported as it is (its kernels built for a GPU, never launched)."""
    pytest.importorskip("triton", reason="triton not installed")
    path = tmp_path / f"kernel_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiles_shrink_only_for_large_head_dim(pack, tmp_path):
    d = load_task("attention-prefill").definition
    dflt = _module(pack.render(d, {"family": "flash"}, {}).sources["kernel.py"], tmp_path)
    # 8 warps, 3 stages: Q and 3 K/V stages pass 225 KB at head_dim 256 (256 KB), so BLOCK_N halves there
    assert [dflt._tiles(b) for b in (16, 64, 128, 256)] == [(128, 64)] * 3 + [(128, 32)]
    deep = _module(pack.render(d, {"family": "flash"}, {"num_stages": 3, "num_warps": 4, "block_n": 128})
                   .sources["kernel.py"], tmp_path)
    # 128 x 128 tiles with 3 stages fit at head_dim 128 (224 KB, what Triton 3.6 allocates at sm_90); at 256 the
    # accumulator halves BLOCK_M and the stages halve BLOCK_N
    assert deep._tiles(64) == (128, 128) and deep._tiles(128) == (128, 128) and deep._tiles(256) == (64, 64)


@pytest.mark.parametrize("choices, knobs", [({"family": "flash"}, {}),
                                            (FAST, {"block_m": 64, "block_n": 32})], ids=["flash", "fast"])
def test_without_the_running_max_rescale_fails(pack, interpreter, choices, knobs):
    """acc and l_i not rescaled when the running max grows: tiles weighted against different maxima. Passes on a
    single key tile (seqlen 1), fails as soon as a row sees two tiles."""
    task = "attention-prefill-noncausal"
    src = pack.render(load_task(task).definition, choices, knobs).sources["kernel.py"]
    broken, n = re.subn(r"alpha = tl\.exp2?\(m_i - m_new\)", "alpha = m_new * 0.0 + 1.0", src)
    assert n == 1
    excess = interpreter(broken, task, [SMALL[2], SMALL[0]])
    assert not _failures({SMALL[2][0]: excess[SMALL[2][0]]}), excess
    assert _failures(excess) == {SMALL[0][0]: excess[SMALL[0][0]]}, excess


# -- bfloat16 ---------------------------------------------------------------------------------------------------

#: (task, choices, knobs, shapes): the naive family, flash's default and the fast combination, on bfloat16 tensors
BF16_CASES = [("attention-prefill-noncausal-bf16", {"family": "naive-blocks"}, {}, SMALL),
              ("attention-prefill-bf16", {"family": "flash"}, {}, SMALL),
              ("attention-prefill-bf16", FAST, {"block_m": 64, "block_n": 32}, LARGER)]


@pytest.mark.parametrize("task", BF16_TASKS)
def test_the_bf16_naive_module_matches_reference_in_interpreter(interpreter, task):
    """The bf16 tasks' naive.triton.py is the float16 tasks' module (linked): it takes the dtype from the tensors."""
    excess = interpreter(load_task(task).naive_sources["triton"], task, LARGER)
    assert not _failures(excess), excess


@pytest.mark.parametrize("task, choices, knobs, shapes", BF16_CASES,
                         ids=[f"{c[0]}-{path_id(c[1:3])}" for c in BF16_CASES])
def test_bf16_paths_match_reference_in_interpreter(pack, interpreter, task, choices, knobs, shapes):
    kernel = pack.render(load_task(task).definition, choices, knobs)
    excess = interpreter(kernel.sources["kernel.py"], task, shapes)
    assert not _failures(excess), (kernel.choices, kernel.knobs, excess)
