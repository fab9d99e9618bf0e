"""Triton kernels, one module per op, built from the blocks in ``scan``."""
