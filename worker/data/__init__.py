"""The input pipeline: which rows form each batch (``order``), reading them (``sources``),
prefetch and placement on the devices (``batches``). Importing this package is cheap (no
jax)."""
