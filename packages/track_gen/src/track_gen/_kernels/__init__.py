"""Warp kernels (inputs first, outputs last), one module per course kind."""
