"""Procedural race courses in NVIDIA Warp: generation, validity checks, bakes,
masked per-env regeneration and the runtime step.

Importing ``track_gen`` never imports torch: the torch interop lives in
``track_gen.interop.torch`` and is imported only by those who use it.
"""

__version__ = "0.1.0"
