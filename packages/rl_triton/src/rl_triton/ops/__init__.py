"""The seven ops, one module per family (the public rl-triton 0.1.x module paths)."""
