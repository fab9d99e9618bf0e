"""Warp kernels: ``geometry`` (shared functions), ``loop`` (the seeded closed
spline), ``tracks`` (frames and checks), ``gates`` (placement and bar checks),
``bakes`` (checkpoints, SDF, height field), ``step`` (the runtime step,
progress resets, the flag a conditional regeneration reads).

Every kernel takes an ``active`` ``[E]`` int32 array and leaves the envs whose
entry is 0 untouched, so a masked regeneration rebuilds only the masked envs
and every other env keeps its arrays bit for bit. Inputs come first, outputs
last. Lengths are metres, angles radians.
"""
