"""Static checks of the triton target (eval/static_rules/triton.yaml) and the Python views they read: every
rule fires on a hostile snippet and stays quiet on honest kernels (the naive kernels, renders of the triton
pack, and a module full of lookalikes: words in docstrings and comments, floor division, constexpr defaults,
comparisons). No torch, Triton or GPU needed."""

from __future__ import annotations

import pytest

from ksearch.eval import static_checks as sc
from ksearch.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

from ..knowledge.paths import random_paths

RULES = sc.rules_for("triton")
TASKS = ("selective-scan", "selective-scan-fp16")
SIGNATURE = "def run(u, delta, A, B, C, D, z, delta_bias, h0, out, last_state):\n"


def findings(src: str, name: str = "kernel.py") -> list[sc.Finding]:
    return sc.check(Candidate(target="triton", sources={name: src}), RULES)


def rules_hit(src: str) -> set[str]:
    return {f.rule for f in findings(src)}


def test_rules_load_and_every_rule_says_why():
    assert len(RULES) >= 15 and len({r.id for r in RULES}) == len(RULES)
    assert all(r.why and r.view in ("text", "code") for r in RULES)


@pytest.mark.parametrize("task", TASKS)
def test_naive_kernels_and_pack_renders_pass(task):
    t = load_task(task)
    assert findings(t.naive_sources["triton"]) == []
    pack = load_pack(task, "triton")
    for choices, knobs in [({}, {})] + random_paths(pack, 8, seed=11):
        kernel = pack.render(t.definition, choices, knobs)
        got = findings(kernel.sources["kernel.py"])
        assert got == [], f"{choices} {knobs}: {[str(f) for f in got]}"


HONEST_LOOKALIKES = '''"""Docstring that talks about import os, eval(), exec, torch.cumsum, __import__, .cpu() and globals,
sys._getframe and torch.cuda.synchronize = None: all of it inside a string."""
import math
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton import jit, cdiv

LOG2E = 1.4426950408889634          # os.system("rm -rf /") in a comment
TILE = (64, 4)                      # a tuple constant
MESSAGE = "import subprocess; torch.cuda.Event = None"


@triton.jit
def _kernel(x_ptr, y_ptr, n, input_stride, BLOCK: tl.constexpr = 128, EVEN: tl.constexpr = False):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    half = n // 2                   # floor division, not a C++ comment
    x = tl.load(x_ptr + offs * input_stride, mask=offs < n, other=0.0)
    y = tl.where(x > 0, x, 0.0) * (x == x)
    y = libdevice.exp(y) + tl.math.exp2(y) + tl.exp(y) + half
    s = tl.cumsum(y, axis=0)
    tl.store(y_ptr + offs, s.to(y_ptr.dtype.element_ty), mask=offs < n)


@jit
def _other(p, q):
    tl.store(q, tl.load(p))


def run(u, delta, A, B, C, D, z, delta_bias, h0, out, last_state):
    """Launch: grid (cdiv(dim, BLOCK), batch); nothing is read back with .item()."""
    batch, dim, seqlen = u.shape
    tmp = torch.empty_like(out, dtype=torch.float32)
    carry = torch.zeros((batch, dim), device=u.device, dtype=torch.float32)
    sms = torch.cuda.get_device_properties(u.device).multi_processor_count
    block = max(16, triton.next_power_of_2(min(dim, 1024)))
    grid = lambda meta: (cdiv(dim, meta["BLOCK"]), batch, sms // sms)
    assert u.is_contiguous() and out.stride(-1) == 1, f"{u.stride()} {math.pi}"
    _kernel[grid](u, tmp, dim, u.stride(2), BLOCK=block, num_warps=4, num_stages=2)
    return out, last_state
'''


def test_honest_lookalikes_pass():
    got = findings(HONEST_LOOKALIKES)
    assert got == [], [str(f) for f in got]


HOSTILE = [
    ("non-ascii", SIGNATURE + "    \uff45\uff56\uff41\uff4c('1')\n"),
    ("imports", "import os\n" + SIGNATURE + "    pass\n"),
    ("imports", "from os import system\n"),
    ("imports", "import subprocess\n"),
    ("imports", "import ctypes\n"),
    ("imports", "import importlib\n"),
    ("imports", "import socket\n"),
    ("imports", "import threading\n"),
    ("imports", "import time\n"),
    ("imports", "import pickle\n"),
    ("imports", "import builtins\n"),
    ("imports", "import torch as T\n"),
    ("imports", "from torch import cumsum\n"),
    ("imports", "import triton.testing\n"),
    ("imports", "from triton.runtime import driver\n"),
    ("imports", "from triton import autotune\n"),
    ("imports", "import torch, os\n"),
    ("imports", "x = 1; import sys\n"),
    ("imports", SIGNATURE + "    import sys\n"),
    ("dunder", SIGNATURE + "    __import__('os').system('ls')\n"),
    ("dunder", SIGNATURE + "    ().__class__.__base__.__subclasses__()\n"),
    ("private-attribute", SIGNATURE + "    torch._C._cuda_synchronize()\n"),
    ("private-attribute", SIGNATURE + "    torch.cuda._sleep(1 << 20)\n"),
    ("reflection", SIGNATURE + "    eval('1 + 1')\n"),
    ("reflection", SIGNATURE + "    exec('x = 1')\n"),
    ("reflection", SIGNATURE + "    getattr(torch, 'cum' + 'sum')(u, -1)\n"),
    ("reflection", SIGNATURE + "    open('/proc/self/environ').read()\n"),
    ("reflection", SIGNATURE + "    globals()['x'] = 1\n"),
    ("reflection", SIGNATURE + "    g = getattr\n"),
    ("reflection", SIGNATURE + "    print('timing', u.shape)\n"),
    ("reflection", SIGNATURE + "    compile('x', 'f', 'exec')\n"),
    ("frames", SIGNATURE + "    frame = inspect.currentframe()\n"),
    ("frames", SIGNATURE + "    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        e.tb_frame\n"),
    ("stdlib-modules", SIGNATURE + "    torch.os.system('ls')\n"),
    ("stdlib-modules", SIGNATURE + "    triton.language.core.builtins.open('x')\n"),
    ("timing-api", SIGNATURE + "    s = torch.cuda.Stream()\n"),
    ("timing-api", SIGNATURE + "    torch.cuda.synchronize()\n"),
    ("timing-api", SIGNATURE + "    g = torch.cuda.CUDAGraph()\n"),
    ("attribute-assignment", "torch.cuda.synchronize = lambda: None\n"),
    ("attribute-assignment", "torch.cuda.Event.elapsed_time = lambda self, other: 1e-3\n"),
    ("attribute-assignment", "a, torch.cuda.Event = 1, 2\n"),
    ("attribute-assignment", "x = torch.cuda.Event = None\n"),
    ("attribute-assignment", "del torch.cuda.Event\n"),
    ("attribute-assignment", SIGNATURE + "    run.cache = out\n"),
    ("attribute-assignment", SIGNATURE + "    run.calls[0] += 1\n"),
    ("module-state", "CACHE = {}\n"),
    ("module-state", "SEEN: list = []\n"),
    ("module-state", "BUFFER = torch.empty(1 << 20, device='cuda')\n"),
    ("module-state", SIGNATURE + "    global CALLS\n"),
    ("module-state", "def run(u, delta, A, B, C, D, z, delta_bias, h0, out, last_state, _memo={}):\n    pass\n"),
    ("host-reads", SIGNATURE + "    key = u[0, 0, 0].item()\n"),
    ("host-reads", SIGNATURE + "    host = u.cpu()\n"),
    ("host-reads", SIGNATURE + "    rows = u.tolist()\n"),
    ("host-copy", SIGNATURE + "    host = u.to('cpu')\n"),
    ("torch-api", SIGNATURE + "    out.copy_(torch.cumsum(u, -1))\n"),
    ("torch-api", SIGNATURE + "    torch.einsum('bdl,bnl->bdn', u, B)\n"),
    ("torch-api", SIGNATURE + "    torch.ops.aten.mul(u, 2)\n"),
    ("torch-api", SIGNATURE + "    torch.load('answer.pt')\n"),
    ("torch-api", SIGNATURE + "    t = torch\n"),
    ("torch-api", SIGNATURE + "    torch.cuda.memory_allocated()\n"),
    ("triton-api", "@triton.autotune(configs=[], key=['n'])\ndef f():\n    pass\n"),
    ("triton-api", SIGNATURE + "    ms = triton.testing.do_bench(lambda: None)\n"),
    ("triton-api", SIGNATURE + "    triton.runtime.driver.active.get_current_stream()\n"),
    ("triton-internals", SIGNATURE + "    tl.core.builtins\n"),
    ("triton-internals", SIGNATURE + "    libdevice.core.tensor\n"),
    ("timer", "@triton.jit\ndef k(o):\n    tl.store(o, tl.extra.cuda.globaltimer())\n"),
    ("timer", "@triton.jit\ndef k(o):\n    tl.store(o, clock64())\n"),
    ("timer-ptx", "@triton.jit\ndef k(o):\n    t = tl.inline_asm_elementwise('mov.u64 $0, %globaltimer;', '=l', [],"
                  " dtype=tl.int64, is_pure=False, pack=1)\n"),
    ("device-print", "@triton.jit\ndef k(x):\n    tl.device_print('x', x)\n"),
    ("replaced-library", SIGNATURE + "    name = 'selective_scan_cuda'\n"),
]


@pytest.mark.parametrize("rule, src", HOSTILE, ids=[f"{r}-{i}" for i, (r, _) in enumerate(HOSTILE)])
def test_hostile_snippets_are_caught(rule, src):
    assert rule in rules_hit(src), [str(f) for f in findings(src)]


def test_every_rule_has_a_snippet_that_fires():
    assert {r.id for r in RULES} == {rule for rule, _ in HOSTILE}


def test_a_finding_names_the_file_and_line():
    (f, *_) = findings('"""doc"""\nimport math\n\nimport os\n')
    assert (f.rule, f.file, f.line, f.text) == ("imports", "kernel.py", 4, "import os")
    assert "static check 'imports': kernel.py:4: import os" in str(f)


# -- the Python views ---------------------------------------------------------------------------------------


def test_strip_py_blanks_comments_and_strings_keeps_positions():
    src = 'x = "os.system"  # eval(\ny = f"{len(z)} open"\nz = """a\nb"""\nw = a // 2\n'
    code = sc.strip_py(src, keep_strings=False)
    assert len(code) == len(src) and code.count("\n") == src.count("\n")
    assert "os.system" not in code and "eval" not in code and '"a\nb"' not in code
    assert "len(z)" in code  # an f-string's expressions stay visible
    assert "a // 2" in code  # floor division is not a comment
    text = sc.strip_py(src, keep_strings=True)
    assert "os.system" in text and "eval" not in text


def test_strip_py_joins_backslash_continuations():
    code = sc.strip_py("y = torch.\\\ncumsum(u)\n", keep_strings=False)
    assert "torch. \ncumsum" in code
    assert "torch-api" in rules_hit(SIGNATURE + "    y = torch.\\\n        cumsum(u, -1)\n")


def test_strip_py_leaves_what_does_not_tokenize():
    assert sc.strip_py("s = '''never closed\n", keep_strings=False) == "s = '''never closed\n"


def test_python_definitions_are_top_level_defs():
    v = sc.views(Candidate(target="triton", sources={"kernel.py": HONEST_LOOKALIKES}))
    assert [name for _, name in v.definitions["kernel.py"]] == ["_kernel", "_other", "run"]
