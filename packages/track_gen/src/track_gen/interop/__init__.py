"""Interop with other frameworks, each imported on demand: ``torch`` (recording
courses into ``torch.cuda.graph`` captures) and ``jax`` (a course's arrays as
zero-copy JAX arrays)."""
