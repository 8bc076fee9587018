"""Surviving failures: process 0's checkpoints and the restore (``checkpoint``), every
process's own copies in fast local storage (``localtier``), a preemption notice turned into
one agreed step (``notice``), and all of it as the training loop uses it (``recovery``).
Importing this package is cheap (no jax)."""
