"""Warp kernels (an ``active`` mask first, inputs, then outputs): ``geometry``
(shared functions), ``loop`` (the seeded closed spline), ``tracks`` (frames and
checks), ``gates`` (placement and bar checks), ``bakes`` (checkpoints, SDF,
height field)."""
