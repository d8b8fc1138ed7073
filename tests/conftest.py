import pytest


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Every test gets its own KSEARCH_HOME, shared within the session for the hardware spec cache."""
    home = tmp_path_factory.getbasetemp() / "ksearch-home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("KSEARCH_HOME", str(home))


def pytest_collection_modifyitems(config, items):
    """Skip ``cuda``-marked tests, with the reason, where CuPy or a CUDA device is missing; ``mlx_cuda``-marked
    ones where MLX's CUDA backend is."""
    mlx_marked = [item for item in items if "mlx_cuda" in item.keywords]
    if mlx_marked:
        from ksearch.targets.mlx import mlx_status

        why = mlx_status("mlx-cuda")
        for item in mlx_marked if why else []:
            item.add_marker(pytest.mark.skip(reason=f"mlx_cuda: {why}"))
    marked = [item for item in items if "cuda" in item.keywords and "mlx_cuda" not in item.keywords]
    if not marked:
        return
    from ksearch.targets.cuda import cupy_status

    reason = cupy_status()
    if reason is None:
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=f"cuda: {reason}"))
