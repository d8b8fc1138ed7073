"""Reading model replies: the planner's JSON edit arrays and the coder's fenced source blocks (ksearch.proposers.llm.parse)."""

import pytest

from ksearch.errors import KnowledgeError, ReplyError
from ksearch.proposers.llm.parse import check_edits, extract_code, extract_json_array, fences
from ksearch.search.edits import Delete, Insert, Update

EDIT = '{"op": "delete", "node_id": "n3"}'


# -- JSON arrays ------------------------------------------------------------------------------------------


def test_json_in_a_fence_with_prose_around():
    text = f"I think n3 is pointless [see above].\n\n```json\n[{EDIT}]\n```\nThat's all [1]."
    assert extract_json_array(text) == [{"op": "delete", "node_id": "n3"}]


def test_json_in_a_bare_fence():
    assert extract_json_array(f"```\n[{EDIT}, {EDIT}]\n```") == [{"op": "delete", "node_id": "n3"}] * 2


def test_bare_json():
    assert extract_json_array(f"  [{EDIT}]  \n") == [{"op": "delete", "node_id": "n3"}]


def test_bare_json_with_prose_and_brackets_before_it():
    text = f"Plan [draft]: drop n3 (see [1]).\n[{EDIT}]\nDone."
    assert extract_json_array(text) == [{"op": "delete", "node_id": "n3"}]


def test_an_empty_array_is_a_valid_answer():
    assert extract_json_array("Nothing left to try.\n```json\n[]\n```") == []


def test_a_single_edit_object_or_an_edits_wrapper_is_accepted():
    assert extract_json_array(EDIT) == [{"op": "delete", "node_id": "n3"}]
    assert extract_json_array('{"edits": [' + EDIT + "]}") == [{"op": "delete", "node_id": "n3"}]


def test_truncated_json_in_an_unclosed_fence():
    text = '```json\n[{"op": "insert", "parent_id": "root", "action": {"title": "x", "desc'
    with pytest.raises(ReplyError, match="unclosed ```json block is not valid JSON.*token limit"):
        extract_json_array(text, finish_reason="length")


def test_truncated_bare_json():
    with pytest.raises(ReplyError, match="does not decode"):
        extract_json_array('Here: [{"op": "delete", "node_id": "n')


def test_garbage():
    with pytest.raises(ReplyError, match="no JSON array"):
        extract_json_array("I am not sure what to do next, sorry.")
    with pytest.raises(ReplyError):
        extract_json_array("")


def test_deep_nesting_and_bracket_floods_are_garbage_not_crashes():
    for text in ("[" * 100_000, "```json\n" + "[" * 100_000 + "\n```", "[x " * 50_000):
        with pytest.raises(ReplyError):
            extract_json_array(text)
    with pytest.raises(ReplyError):
        extract_code("```cuda\nx\n```\n```yaml\n" + "[" * 100_000 + "\n```", "cuda")


def test_invalid_json_in_a_fence_names_the_position():
    with pytest.raises(ReplyError, match="not valid JSON: .* line 1 column"):
        extract_json_array("```json\n[{'op': 'delete'}]\n```")


def test_two_fenced_arrays_are_refused():
    with pytest.raises(ReplyError, match="2 JSON arrays"):
        extract_json_array(f"```json\n[{EDIT}]\n```\nand\n```json\n[{EDIT}]\n```")


def test_check_edits_parses_every_op_and_reports_the_wrong_ones():
    items = [
        {"op": "delete", "node_id": "n1"},
        {"op": "frobnicate", "node_id": "n1"},
        {"op": "update", "node_id": "n2", "fields": {"rating": 3}},
        "not an object",
        {"op": "insert", "parent_id": "root"},
        {"op": "insert", "parent_id": "root", "action": {"title": "t", "description": "d"}},
    ]
    good, bad = check_edits(items)
    assert [i for i, _ in good] == [0, 2, 5]
    assert [type(e) for _, e in good] == [Delete, Update, Insert]
    assert [i for i, _ in bad] == [1, 3, 4]
    assert "edit 1 (frobnicate)" in bad[0][1] and "malformed edit" in bad[0][1]
    assert "not an object" in bad[1][1]
    assert "action" in bad[2][1] and "Field required" in bad[2][1]


# -- code blocks ------------------------------------------------------------------------------------------

C_BODY = "#include <stdint.h>\n  /* indented */\nfloat k = 0x1.8p+1f;\t\nvoid run(void) {}\n\n"


def test_c_block_is_taken_exactly_as_written():
    text = f"Here is the kernel:\n\n```c\n{C_BODY}```\nIt uses hex floats."
    code = extract_code(text, "cpu")
    assert code.sources == {"kernel.c": C_BODY}
    assert code.launch == {} and code.notes == []


def test_cpp_block_becomes_kernel_cpp():
    assert extract_code('```cpp\nextern "C" void run() {}\n```', "cpu").sources == {
        "kernel.cpp": 'extern "C" void run() {}\n'}


def test_named_block_and_tilde_fence():
    assert extract_code("```c kernel.c\nint a;\n```", "cpu").sources == {"kernel.c": "int a;\n"}
    assert extract_code("~~~c title=kernel.c\nint b;\n~~~", "cpu").sources == {"kernel.c": "int b;\n"}
    assert extract_code("```kernel.c\nint c;\n```", "cpu").sources == {"kernel.c": "int c;\n"}


def test_a_longer_fence_keeps_backticks_inside():
    body = 'def run(*a):\n    """```not a fence```"""\n    ```\n'
    text = f"````python\n{body}````\n"
    assert extract_code(text, "triton").sources == {"kernel.py": body}


def test_cuda_needs_a_source_and_a_launch_plan():
    text = ("```cuda\nextern \"C\" __global__ void k(const float *u) {}\n```\n"
            "```yaml\nlaunches:\n  - kernel: k\n    grid: [\"batch\"]\n    block: [128]\n```\n")
    code = extract_code(text, "cuda")
    assert code.sources == {"kernel.cu": 'extern "C" __global__ void k(const float *u) {}\n'}
    assert code.launch == {"launches": [{"kernel": "k", "grid": ["batch"], "block": [128]}]}
    with pytest.raises(ReplyError, match="no ```yaml launch plan"):
        extract_code("```cuda\n__global__ void k() {}\n```", "cuda")
    with pytest.raises(ReplyError, match="not valid YAML"):
        extract_code("```cuda\nx\n```\n```yaml\nlaunches: [\n```", "cuda")
    with pytest.raises(ReplyError, match="must be a mapping"):
        extract_code("```cuda\nx\n```\n```yaml\n- 1\n```", "cuda")


def test_cpp_fence_counts_as_cuda_source():
    code = extract_code("```cpp\n__global__ void k() {}\n```\n```yml\nlaunches: []\n```", "cuda")
    assert set(code.sources) == {"kernel.cu"}


def test_python_block_for_triton():
    assert extract_code("```python\nimport triton\n```", "triton").sources == {"kernel.py": "import triton\n"}
    assert extract_code("```py\nimport triton\n```", "triton").sources == {"kernel.py": "import triton\n"}


def test_missing_block_names_what_was_found():
    with pytest.raises(ReplyError, match=r"no ```c block .*found ```python"):
        extract_code("```python\nprint(1)\n```", "cpu")
    with pytest.raises(ReplyError, match="found no fenced block"):
        extract_code("void run() {}", "cpu")


def test_unclosed_fence_is_a_truncated_reply():
    with pytest.raises(ReplyError, match="truncated reply.*not closed before the end of the reply"):
        extract_code("```c\nvoid run() {\n  for (;;", "cpu")
    with pytest.raises(ReplyError, match="token limit"):
        extract_code("```c\nvoid run() {\n  for (;;", "cpu", finish_reason="length")
    with pytest.raises(KnowledgeError):  # what the controller catches
        extract_code("```cuda\nvoid k() {}\n```\n```yaml\nlaunches:\n", "cuda", finish_reason="max_tokens")


def test_cut_after_the_code_is_complete_keeps_the_code():
    code = extract_code("```c\nint a;\n```\nThis kernel improves on the parent becau", "cpu", finish_reason="length")
    assert code.sources == {"kernel.c": "int a;\n"}


def test_a_fence_opened_inside_another_block_is_its_text():
    # as in CommonMark: "```c" inside an open ```text block is content, and the next bare ``` closes ```text
    with pytest.raises(ReplyError, match="no ```c block .*found ```text"):
        extract_code("```text\nnotes\n```c\nint a;\n```", "cpu")
    with pytest.raises(ReplyError, match="```text block opened at line 1 is not closed"):
        extract_code("```text\nnotes\n```c\nint a;\n", "cpu")


def test_several_blocks_of_one_file_take_the_last_and_note_it():
    code = extract_code("draft:\n```c\nint a;\n```\nfinal:\n```c\nint b;\n```", "cpu")
    assert code.sources == {"kernel.c": "int b;\n"}
    assert "took the last" in code.notes[0]


def test_c_and_cpp_together_and_empty_blocks_are_refused():
    with pytest.raises(ReplyError, match="both"):
        extract_code("```c\nint a;\n```\n```cpp\nint b;\n```", "cpu")
    with pytest.raises(ReplyError, match="empty"):
        extract_code("```c\n\n```", "cpu")


def test_unknown_target():
    with pytest.raises(ReplyError, match="not for target 'mlx'"):
        extract_code("```c\nint a;\n```", "mlx")


def test_fences_keep_crlf_and_indentation():
    fs = fences("x\r\n```c\r\n  a\r\n```\r\n")
    assert len(fs) == 1 and fs[0].body == "  a\r\n" and fs[0].closed and fs[0].lang == "c"
