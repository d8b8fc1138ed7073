"""Language-model access: backends behind one small interface (`base`, `backends`), the client that adds
retries, prices, budgets and the call log (`client`), API keys (`keys`), prices (`prices`) and the settings saved
with a run (`settings`). What the search asks the models is the llm proposer's (`ksearch.proposers.llm`)."""
