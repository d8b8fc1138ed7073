"""Every test here counts unreported tokens with the estimate unless it says otherwise, so a developer's
KSEARCH_TOKENIZER or an installed tiktoken does not change the counts the tests expect."""

import pytest


@pytest.fixture(autouse=True)
def _estimated_tokens(monkeypatch):
    monkeypatch.setenv("KSEARCH_TOKENIZER", "estimate")
