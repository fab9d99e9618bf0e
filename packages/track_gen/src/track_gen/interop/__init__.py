"""Interop with other frameworks' graph capture (imported on demand)."""
