"""Proposers: what each strategy drafts for the one decode loop to verify (engine.decode_loop)."""
