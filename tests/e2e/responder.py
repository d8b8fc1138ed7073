"""A model stand-in for end-to-end runs of the llm proposer: answers by what the prompt asks.

Planner prompts get JSON edit arrays that are valid for the tree the prompt describes (new kernel families
under the root, a next step under the node just evaluated); coder prompts get the task's naive kernel marked
with the node id (so every candidate is distinct and correct). Scripted *content* faults on top: the first
initial plan is prose without JSON, the first refinement is cut-off JSON, the second names a parent that does
not exist, and the third kernel does not compile. A fix request (the conversation already holds an assistant
turn) is always answered validly. State (how many of each were asked) lives in a JSON file, so the same logic
serves in-process servers, the queue's responder thread and the command backend's one-process-per-call script:

    python -m tests.e2e.responder STATE_FILE [CHOICE_PREFIX] < prompt.txt   (the command backend's plain text)

CHOICE_PREFIX, when given, starts every choice the planner writes (e.g. text that looks like rich markup).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

NAIVE = (Path(__file__).resolve().parents[2] / "src/ksearch/tasks/builtin/selective-scan/naive.cpu.c").read_text()


class Responder:
    def __init__(self, state_file: Path):
        self.state_file = Path(state_file)

    def _bump(self, key: str) -> int:
        state = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
        state[key] = state.get(key, 0) + 1
        self.state_file.write_text(json.dumps(state))
        return state[key]

    def __call__(self, messages: list[dict]) -> str:
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = [m["content"] for m in messages if m["role"] == "user"]
        fixing = any(m["role"] == "assistant" for m in messages)
        first = user[0] if user else ""
        if "You are the coder" in system:
            k = self._bump("code")
            node = re.search(r"node (\S+)", first)
            node_id = f"{node.group(1) if node else '?'} #{k}"  # every kernel distinct
            if k == 3:
                return f"```c\n/* {node_id}: a broken attempt */\nvoid run(const float *u {{ oops }}\n```\n"
            return f"Here is the kernel.\n\n```c\n/* ksearch e2e: node {node_id} */\n{NAIVE}```\n"
        n = self._bump("plan")
        fam = lambda i: {"op": "insert", "parent_id": "root", "id": f"fam{n}-{i}", "decision": "kernel family",
                         "choice": f"family {n}.{i}", "rating": 6, "confidence": 0.5,
                         "action": {"title": f"family {n}.{i}", "description": "rows of the scan split another way"}}
        if "Build the first world model" in first:
            if not fixing and self._bump("initial") == 1:
                return "I would start with the rows in parallel, then think about SIMD."  # no JSON at all
            return "```json\n" + json.dumps([fam(1), fam(2)]) + "\n```"
        just = re.search(r"# Node just evaluated: (\S+)", first)
        if just:
            child = {"op": "insert", "parent_id": just.group(1), "id": f"step{n}", "decision": "next step",
                     "choice": f"step {n}", "rating": 6, "confidence": 0.5,
                     "action": {"title": f"step {n}", "description": "tune the kernel just measured"},
                     "payload": {"improve": True}}
            if not fixing:
                r = self._bump("refine")
                if r == 1:
                    return '```json\n[{"op": "insert", "parent_id": "' + just.group(1) + '", "id": "st'  # cut off
                if r == 2:
                    return json.dumps([{**child, "parent_id": "no-such-node"}])
            return json.dumps([child])
        # plan:failure, plan:expand, a continuation request: another family under the root
        return json.dumps([fam(1)])


def split_plain(text: str) -> list[dict]:
    """The command backend's plain text (``=== role ===`` headers) back into messages."""
    parts = re.split(r"^=== (system|user|assistant) ===\n", text, flags=re.M)
    return [{"role": parts[i], "content": parts[i + 1]} for i in range(1, len(parts) - 1, 2)]


if __name__ == "__main__":
    reply = Responder(Path(sys.argv[1]))(split_plain(sys.stdin.read()))
    if len(sys.argv) > 2:
        reply = reply.replace('"choice": "', '"choice": ' + json.dumps(sys.argv[2])[:-1])
    sys.stdout.write(reply)
