"""ksearch.llm.tokens: the counter KSEARCH_TOKENIZER names (a real `tokenizers` tokenizer built here, a stand-in
tiktoken, the estimate), the default, clean errors for a bad setting; the client counting the queue's and the
command's calls with it and recording by what; call records stored before usage_counted_by existed."""

import json
import sys
import types

import pytest

from ksearch.errors import ConfigError
from ksearch.llm import tokens
from ksearch.llm.backends import CommandBackend, QueueBackend
from ksearch.llm.base import LLMCall, Message, Usage
from ksearch.llm.client import LLMClient
from ksearch.llm.prices import Prices
from tests.llm.fakes import QueueResponder, ScriptedBackend, scripted_command

# 10 words and 4 marks of punctuation in the messages: 14 tokens for a word-and-punctuation tokenizer, 12 for
# the estimate (28 + 20 characters / 4)
MSGS = [Message(role="system", content="you are a planner; be terse."),
        Message(role="user", content="plan: the next step!")]
REPLY = "a b c d e f g h i j"  # 10 tokens; the estimate says 5 (19 characters)


def tiny_tokenizer(path):
    """A word-level tokenizer (words and runs of punctuation are tokens) saved as tokenizer.json at ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i for i, w in enumerate("you are a planner be terse plan the next step".split(), 1)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def client_for(backend, records):
    return LLMClient(backend, prices=Prices.load(), record=records.append, sleep=lambda s: None, timeout_s=5)


@pytest.fixture
def no_tiktoken(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken raises ImportError
    monkeypatch.setitem(sys.modules, "tiktoken.load", None)


# -- a real tokenizer counts the queue's and the command's calls ------------------------------------------------


def test_a_tokenizers_tokenizer_counts_a_queue_call(tmp_path, monkeypatch):
    path = tiny_tokenizer(tmp_path / "tokenizer.json")
    monkeypatch.setenv("KSEARCH_TOKENIZER", f"hf:{path}")
    records, q = [], tmp_path / "q"
    with QueueResponder(q, [REPLY]):
        client = client_for(QueueBackend(q, poll_s=0.01), records)
        assert client.ask("planner", "plan:initial", MSGS, model="claude-sonnet-4-5").text == REPLY
    (call,) = records
    assert (call.usage.input_tokens, call.usage.output_tokens) == (14, 10)
    assert call.usage_counted_by == f"hf:{path}" and call.usage_estimated is False
    assert call.cost_usd == pytest.approx((14 * 3.0 + 10 * 15.0) / 1e6)  # a priced model is priced by the count


def test_a_tokenizer_directory_counts_a_command_call(tmp_path, monkeypatch):
    tiny_tokenizer(tmp_path / "tokenizer.json")  # a local model directory holding tokenizer.json
    monkeypatch.setenv("KSEARCH_TOKENIZER", f"hf:{tmp_path}")
    cmd = scripted_command(tmp_path, [REPLY])
    records = []
    client_for(CommandBackend(cmd.command), records).ask("coder", "code:first", MSGS, model="agent")
    (call,) = records
    assert (call.usage.input_tokens, call.usage.output_tokens) == (14, 10)
    assert call.usage_counted_by == f"hf:{tmp_path}" and not call.usage_estimated


def test_provider_counts_are_kept_and_the_estimate_is_marked(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_TOKENIZER", f"hf:{tiny_tokenizer(tmp_path / 't.json')}")
    records = []
    client_for(ScriptedBackend(["ok"]), records).ask("planner", "p", MSGS, model="m")  # reports 11 in, 7 out
    assert (records[0].usage.input_tokens, records[0].usage_counted_by) == (11, "provider")
    monkeypatch.setenv("KSEARCH_TOKENIZER", "estimate")
    cmd = scripted_command(tmp_path, [REPLY])
    client_for(CommandBackend(cmd.command), records).ask("coder", "code:first", MSGS, model="agent")
    assert (records[1].usage.input_tokens, records[1].usage.output_tokens) == (12, 5)
    assert records[1].usage_counted_by == "estimate" and records[1].usage_estimated


# -- the setting -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,match", [
    ("sentencepiece:x.model", "is not a tokenizer"),
    ("tiktoken", "is not a tokenizer"),
    ("hf:", "is not a tokenizer"),
    ("estimate:4", "is not a tokenizer"),
    ("hf:/nonexistent/tokenizer.json", "is not a file"),
    ("tiktoken:o200k_base", "tiktoken is not installed"),
])
def test_a_bad_setting_is_a_config_error_when_the_client_is_made(value, match, monkeypatch, no_tiktoken):
    monkeypatch.setenv("KSEARCH_TOKENIZER", value)
    with pytest.raises(ConfigError, match=match) as e:
        LLMClient(ScriptedBackend([]), prices=Prices({}))
    assert "KSEARCH_TOKENIZER" in str(e.value) and value.split(":")[0] in str(e.value)


def test_a_file_that_is_not_a_tokenizer(tmp_path, monkeypatch):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps({"not": "a tokenizer"}))
    monkeypatch.setenv("KSEARCH_TOKENIZER", f"hf:{bad}")
    with pytest.raises(ConfigError, match=r"does not load as a tokenizer"):
        LLMClient(ScriptedBackend([]), prices=Prices({}))
    monkeypatch.setenv("KSEARCH_TOKENIZER", f"hf:{tmp_path / 'empty-dir'}")
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(ConfigError, match="empty-dir/tokenizer.json is not a file"):
        LLMClient(ScriptedBackend([]), prices=Prices({}))


def test_the_default_without_tiktoken_is_the_estimate(monkeypatch, no_tiktoken):
    monkeypatch.delenv("KSEARCH_TOKENIZER")
    assert tokens.counter_for(None).name == "estimate"
    assert LLMClient(ScriptedBackend([]), prices=Prices({})).tokenizer.name == "estimate"
    monkeypatch.setenv("KSEARCH_TOKENIZER", "  ")  # blank: unset
    assert LLMClient(ScriptedBackend([]), prices=Prices({})).tokenizer.name == "estimate"


def stand_in_tiktoken(monkeypatch, files: dict[str, bytes]):
    """A tiktoken whose encodings read their file through tiktoken.load.read_file, as the real one does for what
    is not in its cache: "cached" reads a local path, "uncached" a URL (which would be downloaded)."""
    load = types.ModuleType("tiktoken.load")
    fetched = []

    def read_file(blobpath):
        fetched.append(blobpath)
        if "://" in blobpath:
            raise AssertionError(f"downloaded {blobpath}")
        return files[blobpath]

    load.read_file = read_file

    class Encoding:
        def __init__(self, data):
            self.words = data.decode()

        def encode(self, text, disallowed_special="all"):
            assert disallowed_special == ()  # special-token text is counted, never refused
            return text.split()

    def get_encoding(name):
        blob = {"cached": "/cache/cached.tiktoken", "uncached": "https://example.invalid/uncached.tiktoken"}.get(name)
        if blob is None:
            raise ValueError(f"Unknown encoding {name}")
        return Encoding(load.read_file(blob))

    mod = types.ModuleType("tiktoken")
    mod.get_encoding = get_encoding
    mod.load = load
    monkeypatch.setitem(sys.modules, "tiktoken", mod)
    monkeypatch.setitem(sys.modules, "tiktoken.load", load)
    return fetched


def test_tiktoken_is_loaded_from_its_cache_only(monkeypatch):
    fetched = stand_in_tiktoken(monkeypatch, {"/cache/cached.tiktoken": b"ranks"})
    counter = tokens.counter_for("tiktoken:cached")
    assert counter.name == "tiktoken:cached" and counter.count("<|endoftext|> two three") == 3
    with pytest.raises(ConfigError, match="not in tiktoken's cache.*does not download"):
        tokens.counter_for("tiktoken:uncached")
    with pytest.raises(ConfigError, match="cannot be loaded: ValueError: Unknown encoding nope"):
        tokens.counter_for("tiktoken:nope")
    assert fetched == ["/cache/cached.tiktoken"]  # the URL never reached the real read_file
    assert sys.modules["tiktoken.load"].read_file.__name__ == "read_file"  # put back


def test_the_default_is_tiktoken_only_when_its_encoding_is_cached(monkeypatch):
    monkeypatch.delenv("KSEARCH_TOKENIZER")
    monkeypatch.setattr(tokens, "DEFAULT_TIKTOKEN", "uncached")
    stand_in_tiktoken(monkeypatch, {})
    assert tokens.counter_for(None).name == "estimate"  # would have downloaded: not taken
    monkeypatch.setattr(tokens, "DEFAULT_TIKTOKEN", "cached")
    stand_in_tiktoken(monkeypatch, {"/cache/cached.tiktoken": b"ranks"})
    assert tokens.counter_for(None).name == "tiktoken:cached"


# -- the record -----------------------------------------------------------------------------------------------


def test_calls_stored_before_usage_counted_by_load():
    base = {"role": "coder", "purpose": "code:first", "backend": "queue", "model": "m", "prompt_hash": "h",
            "messages": [{"role": "user", "content": "x"}], "usage": {"input_tokens": 3, "output_tokens": 1}}
    old_estimated = LLMCall.model_validate_json(json.dumps({**base, "usage_estimated": True}))
    assert old_estimated.usage_counted_by == "estimate" and old_estimated.usage.cache_read_tokens == 0
    old_provider = LLMCall.model_validate_json(json.dumps({**base, "usage_estimated": False}))
    assert old_provider.usage_counted_by == "provider" and not old_provider.usage_estimated
    new = LLMCall(**base, usage_counted_by="estimate")
    assert new.usage_estimated and LLMCall.model_validate_json(new.model_dump_json()) == new
    assert not LLMCall(**base, usage_counted_by="hf:tok.json").usage_estimated
    with pytest.raises(ValueError, match="contradicts"):
        LLMCall(**base, usage_counted_by="tiktoken:o200k_base", usage_estimated=True)


def test_count_usage():
    est = tokens.Estimate()
    assert tokens.count_usage(est, [Message(role="user", content="")], "") == Usage(input_tokens=1, output_tokens=1)
    assert tokens.count_usage(est, MSGS, REPLY) == Usage(input_tokens=12, output_tokens=5)
