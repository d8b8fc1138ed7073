"""The attention-decode triton pack. Without a GPU: every single move from a family's root (and sampled full paths)
renders, passes the triton static rules and the target's controller-side compile; under Triton's interpreter
(TRITON_INTERPRET=1, CPU torch tensors) every single move matches the task's float64 reference within its tolerance
on small shapes (GQA groups 1, 4 and 8, odd kv_len, kv_len 1, head_dim 80 and 16, logits of std 64), and variants
without the running-max rescale (in a chunk) or without the log-sum-exp rescale (across chunks) fail. The
interpreter checks the math (indices, masks, the split and its combine), not what a GPU compile would do (layouts,
shared memory, registers, pipelining). The interpreter tests skip without torch or triton."""

import re

import pytest

from ksearch.eval import static_checks
from ksearch.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.targets import get_target
from ksearch.tasks import load_task

from .paths import path_id, random_paths, single_moves
from .triton_interp import SERVE, interpreter_worker

TASK = "attention-decode"

#: (name, batch, q_heads, kv_heads, kv_len, head_dim, q and k std): small check-like shapes. Under the interpreter
#: run() sees 132 SMs, so the occupancy split cuts these caches into chunks of one key tile: g8-d64 and
#: large-logits go through the combine; fixed-chunk and no-split put several tiles in a chunk.
SMALL = [("g4-odd-d80", 2, 8, 2, 77, 80, 1.0), ("g1-L1-d16", 1, 2, 2, 1, 16, 1.0),
         ("g8-d64", 1, 8, 1, 300, 64, 1.0), ("g4-large-logits", 1, 4, 1, 200, 128, 8.0)]


@pytest.fixture(scope="module")
def pack():
    return load_pack(TASK, "triton")


MOVES = single_moves(load_pack(TASK, "triton"))


def _candidate(source: str) -> Candidate:
    return Candidate(target="triton", sources={"kernel.py": source}, entry_point="run")


def test_moves_cover_both_families_and_every_decision():
    assert {c["family"] for c, _ in MOVES} == {"naive-heads", "split-kv"}
    # tiles and launch move by their knobs
    assert {d for c, _ in MOVES for d in c if d != "family"} == {"split", "group_math", "exp", "kv_loads", "masking"}


def test_description_says_what_ran_on_a_gpu_and_what_did_not(pack):
    assert "RAN ON THE H200" in pack.description and "NOT RUN ON A GPU" in pack.description


def test_every_move_and_sampled_path_renders_and_passes_static_rules(pack):
    d = load_task(TASK).definition
    rules = static_checks.rules_for("triton")
    for choices, knobs in MOVES + random_paths(pack, 30, seed=5):
        k = pack.render(d, choices, knobs)
        src = k.sources["kernel.py"]
        assert src == pack.render(d, choices, knobs).sources["kernel.py"]
        assert k.launch == {} and k.compile_flags == []
        findings = static_checks.check(_candidate(src), rules)
        assert findings == [], f"{k.choices} {k.knobs}: " + "; ".join(map(str, findings))
        assert get_target("triton").compile(_candidate(src), d).ok, (k.choices, k.knobs)


# -- under Triton's interpreter ---------------------------------------------------------------------------------


#: The interpreter's worker (as tests/knowledge/test_attention_triton_pack.py's): TRITON_INTERPRET must be set
#: before triton is first imported, so the modules run in a subprocess that reads one JSON request a line
#: ({"source", "shapes"}) and answers {"excess": {shape name: value}, "splits": {...}} or {"error"}: the excess is
#: max(|o - ref| - (atol + rtol |ref|)) of run() against the task's float64 reference on fresh fp16 inputs (v of
#: std 1), null where o has a NaN or an unwritten element.
WORKER = SERVE + r"""
import numpy as np, torch
from ksearch.tasks import load_task

task = load_task("attention-decode")
ns = {}
exec(task.definition.reference, ns)
tol = task.definition.tolerance["float16"]

def excess(mod, shape):
    _, batch, hq, hkv, kv_len, dim, std = shape
    rng = np.random.default_rng(kv_len * 1000 + dim)
    q = rng.normal(0, std, size=(batch, hq, dim)).astype(np.float16)
    k = rng.normal(0, std, size=(batch, hkv, kv_len, dim)).astype(np.float16)
    v = rng.normal(0, 1.0, size=(batch, hkv, kv_len, dim)).astype(np.float16)
    o = torch.full((batch, hq, dim), float("nan"), dtype=torch.float16)
    mod.run(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), o)
    ref = ns["run"](q, k, v)
    got = o.double().numpy()
    if not np.isfinite(got).all():
        return None
    return float(np.max(np.abs(got - ref) - (tol.atol + tol.rtol * np.abs(ref))))

serve(lambda mod, req: {"excess": {s[0]: excess(mod, s) for s in req["shapes"]}})
"""


@pytest.fixture(scope="module")
def interpreter():
    """check(source, shapes) -> {shape name: excess or None}, run by Triton's interpreter on CPU tensors in one
    worker process for the module. Skips without torch or triton, or where the interpreter cannot run."""
    for send in interpreter_worker(WORKER, {"source": load_task(TASK).naive_sources["triton"],
                                            "shapes": SMALL[1:2]}):
        def check(source: str, shapes, send=send) -> dict:
            out = send({"source": source, "shapes": shapes})
            assert "error" not in out, out["error"]
            return out["excess"]
        yield check


def _failures(excess: dict) -> dict:
    return {name: e for name, e in excess.items() if e is None or e > 0}


@pytest.mark.parametrize("path", MOVES, ids=[path_id(p) for p in MOVES])
def test_single_moves_match_reference_in_interpreter(pack, interpreter, path):
    choices, knobs = path
    kernel = pack.render(load_task(TASK).definition, choices, knobs)
    excess = interpreter(kernel.sources["kernel.py"], SMALL)
    assert not _failures(excess), (kernel.choices, kernel.knobs, excess)


def test_without_the_running_max_rescale_fails(pack, interpreter):
    """acc and l_i not rescaled when a chunk's running max grows (no split: the whole cache is one chunk): tiles
    weighted against different maxima. Passes on a single key (kv_len 1), fails where a chunk has several tiles."""
    src = pack.render(load_task(TASK).definition, {"family": "split-kv", "split": "no-split"}, {}).sources["kernel.py"]
    broken, n = re.subn(r"alpha = tl\.exp2\(m_i - m_new\)", "alpha = m_new * 0.0 + 1.0", src)
    assert n == 1
    excess = interpreter(broken, [SMALL[1], SMALL[2]])
    assert _failures(excess) == {SMALL[2][0]: excess[SMALL[2][0]]}, excess


def test_without_the_log_sum_exp_rescale_fails(pack, interpreter):
    """The combine weighting every chunk by 1 instead of e^(lse_c - M) (each chunk's o_c averaged): fails as soon
    as a row has several chunks (g8-d64: 5 chunks under the occupancy split), passes with one (kv_len 1)."""
    src = pack.render(load_task(TASK).definition, {"family": "split-kv", "split": "occupancy"}, {}).sources["kernel.py"]
    broken, n = re.subn(r"w = tl\.exp2\(tl\.load\(mid_lse (.*)\) - lse_max\)", r"w = tl.load(mid_lse \1) * 0.0 + 1.0",
                        src)
    assert n == 1
    excess = interpreter(broken, [SMALL[1], SMALL[2]])
    assert _failures(excess) == {SMALL[2][0]: excess[SMALL[2][0]]}, excess
