"""Train the built-in tiny target + DFlash drafter pair (see scripts/train_tiny_pair.py)."""
