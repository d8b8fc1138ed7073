"""Reports: tables for the terminal, JSON summaries (HTML and plots later)."""
