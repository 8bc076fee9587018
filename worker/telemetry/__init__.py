"""What a worker measures and writes: the step log (``metrics``), the step times
(``steptimer``), the scalars written whole and in step order (``records``), TensorBoard and
metrics.jsonl (``tracker``), and ``jax.profiler`` traces of chosen steps (``profiling``).
Importing this package is cheap (no jax)."""
