"""The llm proposer: a planner and a coder model keep the world model and write kernels (`proposer`), what a
prompt carries (`context` + `prompts/*.j2`), edits and code out of replies (`parse`), a run's proposer from its
settings and store (`factory`). Model access itself (backends, the client, keys, prices) is `ksearch.llm`."""
