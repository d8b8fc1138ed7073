"""The judge's case cache: what a later evaluation reuses, what a cycle larger than the budget keeps, and the
bitwise check of input files."""

import os

import numpy as np

from ksearch.eval.casedata import CaseData, same_bytes
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Status
from ksearch.tasks import load_task

QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=3, min_time_s=0.0, max_time_s=1.0, flush_bytes=1 << 16)


def test_a_second_evaluation_makes_no_inputs_files_or_references():
    ev = Evaluator(load_task("selective-scan"), config=EvalConfig(seeds=[1, 2], timing=QUICK))
    try:
        first = ev.evaluate(ev.naive_candidate(), ["tiny", "odd"])
        made = dict(ev.data.counts)
        arrays = sum(spec.shape is not None for spec in ev.definition.inputs.values())
        rounds = [r.repeats for r in first.workloads]
        assert rounds == [QUICK.min_repeats] * 2  # QUICK: min_time_s 0, so every evaluation times exactly that
        cases = 2 * 2 + sum(rounds)  # 2 workloads x 2 seeds, and an input set per timing round
        assert made["inputs"] == cases and made["input_files"] == cases * arrays
        verified = sum(r.verified_rounds for r in first.workloads)
        assert 2 * 2 + 2 <= made["references"] == 2 * 2 + verified <= cases  # at least one round each compared
        second = ev.evaluate(ev.naive_candidate(), ["tiny", "odd"])
        assert first.status is second.status is Status.PASSED, (first.message, second.message)
        assert ev.data.counts["inputs"] == made["inputs"] and ev.data.counts["input_files"] == made["input_files"]
        assert ev.data.counts["references"] <= cases  # only rounds no earlier evaluation compared: never twice
    finally:
        ev.close()


def _cycle(data: CaseData, task, names: list[str]) -> None:
    data.begin()
    for name in names:
        wl = task.workload(name)
        inputs, folder = data.inputs(wl, 7)
        for key, value in inputs.items():  # the files of the case just served are there and intact
            if isinstance(value, np.ndarray):
                assert same_bytes(folder / f"in.{key}", value)
        data.reference(wl, 7, inputs)
    data.end()


def test_a_cycle_over_more_cases_than_fit_keeps_what_fits():
    """Plain LRU would miss every case of a cycle larger than the budget; here the cases that fit stay."""
    task = load_task("selective-scan")
    sizes = {}
    probe = CaseData(task.definition, 1 << 30, 1 << 30)
    for name in ("tiny", "small-b2", "odd"):
        sizes[name] = sum(v.nbytes for v in probe.inputs(task.workload(name), 7)[0].values()
                          if isinstance(v, np.ndarray))
    probe.close()
    budget = sizes["tiny"] + sizes["small-b2"]  # the first two fit, "odd" does not with them
    data = CaseData(task.definition, 1 << 30, budget)
    try:
        _cycle(data, task, ["tiny", "small-b2", "odd"])
        assert data.counts["inputs"] == 3
        assert len(list(data._input_root.iterdir())) == 2  # the uncached case's files went with its evaluation
        for _ in range(2):
            _cycle(data, task, ["tiny", "small-b2", "odd"])
        assert data.counts["inputs"] == 5  # only "odd" again, each time
        assert data.counts["references"] == 3  # references fit: computed once each
        assert data.tampered() is None
        _cycle(data, task, ["odd", "tiny"])  # another evaluation's cases may evict what it does not use
        assert data.counts["inputs"] == 7     # "odd" evicts tiny and small-b2 (unused here), so tiny is redrawn
        assert {k[0] for k in data._inputs} == {task.workload(n).uuid for n in ("odd", "tiny")}
        assert data.tampered() is None
    finally:
        data.close()


def test_the_usage_record_holds_only_cached_keys():
    """Ten seeds in ten evaluations through caches that hold one case each: evicted keys leave the record of which
    evaluation used what (it grew by one key per case before, for the life of the run)."""
    task = load_task("selective-scan")
    wl = task.workload("tiny")
    probe = CaseData(task.definition, 1 << 30, 1 << 30)
    inputs, _ = probe.inputs(wl, 0)
    in_size = sum(v.nbytes for v in inputs.values() if isinstance(v, np.ndarray))
    ref_size = sum(v.nbytes for v in probe.reference(wl, 0, inputs).values())
    probe.close()
    data = CaseData(task.definition, ref_size + ref_size // 2, in_size + in_size // 2)
    try:
        for seed in range(10):
            data.begin()
            data.reference(wl, seed, data.inputs(wl, seed)[0])
            data.end()
        assert len(data._inputs) == len(data._refs) == 1
        assert set(data._used) == set(data._inputs) | set(data._refs)
    finally:
        data.close()


def test_a_file_planted_in_an_uncached_case_dropped_mid_evaluation_is_still_reported():
    """With nothing cached, a case's folder goes once two newer ones are served, before the evaluation's end-of-run
    tamper check walks the input directory: the file a kernel planted there must not go with it unreported."""
    task = load_task("selective-scan")
    data = CaseData(task.definition, 1 << 30, 0)   # no input cache: every case is uncached
    try:
        data.begin()
        _, first = data.inputs(task.workload("tiny"), 7)
        (first / "planted").write_bytes(b"x")
        for name in ("small-b2", "odd", "tiny"):       # three newer cases: the first folder is dropped
            data.inputs(task.workload(name), 8)
        assert not first.exists()
        data.end()
        assert data.tampered() == str(first / "planted")
        assert data.tampered() is None                 # reported once; the cache was dropped with it
    finally:
        data.close()


def test_same_bytes_sees_one_flipped_bit_a_size_change_and_a_link(tmp_path):
    value = np.random.default_rng(0).standard_normal(300_001).astype(np.float16)  # not a multiple of 8 bytes
    path = tmp_path / "in.x"
    value.tofile(path)
    assert same_bytes(path, value)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    assert not same_bytes(path, value)
    path.write_bytes(value.tobytes() + b"\0")
    assert not same_bytes(path, value)
    other = tmp_path / "copy"
    value.tofile(other)
    os.unlink(path)
    os.symlink(other, path)
    assert not same_bytes(path, value)  # a link in place of the input is not the input
    assert same_bytes(other, value)


def test_inputs_drawn_in_steps_and_threads_are_the_one_shot_draw(monkeypatch):
    """make_inputs draws and converts in steps, arrays in parallel threads: the values must be what one draw
    over the whole shape gives (references and recorded runs depend on it)."""
    from ksearch.tasks import inputs as inp
    from ksearch.tasks.definition import Definition, Distribution, Workload

    monkeypatch.setattr(inp, "_CHUNK", 1000)  # many steps, and every array big enough for the threads
    dists = {"a": Distribution(kind="normal", mean=0.5, std=3.0), "b": Distribution(kind="uniform", low=-2, high=5),
             "c": Distribution(kind="neg_uniform", low=1, high=4), "d": Distribution(kind="normal")}
    dtypes = {"a": "float16", "b": "bfloat16", "c": "float32", "d": "bfloat16"}
    d = Definition.model_validate({
        "name": "t", "axes": {"n": {"type": "var"}},
        "inputs": {k: {"shape": ["n"], "dtype": dtypes[k], "distribution": dists[k].model_dump()} for k in dists},
        "outputs": {"o": {"shape": ["n"], "dtype": "float32"}}, "reference": "def run(a, b, c, d):\n    return a\n"})
    got = inp.make_inputs(d, Workload(name="w", axes={"n": 12_345}), 77)
    for index, name in enumerate(dists):
        once = inp._draw(np.random.default_rng([77, index]), dists[name], (12_345,))
        want = inp.bf16_from_f32(once) if dtypes[name] == "bfloat16" else once.astype(inp.numpy_dtype(dtypes[name]))
        assert got[name].dtype == want.dtype and got[name].tobytes() == want.tobytes(), name


def test_a_torch_reference_that_is_not_deterministic_is_refused_and_a_deterministic_one_runs_once():
    """A dropout in training mode (KernelBench problems keep the module training): every kernel would fail
    INCORRECT_NUMERICAL with no hint why; the first case is run twice and the reference refused by name."""
    import pytest

    pytest.importorskip("torch")
    from ksearch.errors import TaskError
    from ksearch.tasks.definition import Definition, Workload

    def definition(body: str) -> Definition:
        return Definition.model_validate({
            "name": "drop", "axes": {"n": {"type": "const", "value": 64}},
            "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
            "outputs": {"y": {"shape": ["n"], "dtype": "float32"}}, "reference_backend": "torch",
            "reference": f"import torch\ndef run(x):\n    return {body}\n"})

    wl = Workload(axes={})
    x = {"x": np.linspace(1, 2, 64, dtype=np.float32)}
    data = CaseData(definition("torch.nn.functional.dropout(x, 0.5, training=True)"), 1 << 20, 1 << 20)
    try:
        with pytest.raises(TaskError, match="'drop' is not deterministic: run twice on the same inputs .* 'y' "
                                            "differs in .* of 64 elements"):
            data.reference(wl, 1, x)
    finally:
        data.close()
    data = CaseData(definition("x * 2"), 1 << 20, 1 << 20)
    try:
        assert np.allclose(data.reference(wl, 1, x)["y"], 2 * x["x"]) and data.counts["references"] == 1
        data.reference(Workload(axes={}), 2, x)  # checked once per judge, not per case
    finally:
        data.close()
