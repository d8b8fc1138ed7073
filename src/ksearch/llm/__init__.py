"""Language-model access for the ``llm`` proposer: backends behind one small interface (`base`), the client
that adds retries, prices, budgets and the call log (`client`), prompts as template files (`prompts/`)."""
