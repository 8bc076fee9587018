"""The worker process's runtime: joining JAX and checking the plan (``joining``), every
process's values to process 0 over the coordination service (``gather``), the launcher's
signals as the process handles them (``interrupts``) and JAX's compilation cache
(``compilecache``). Importing this package is cheap (no jax)."""
