"""Generation strategies: one file per strategy."""
