"""A run: the search loop (`controller`) and starting, resuming and finishing a run (`session`)."""
