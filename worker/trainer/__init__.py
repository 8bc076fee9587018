"""The trainer: one process of a job from its identity to its last step (``main``), the
loop's step actions (``actions``), how many steps a device call runs (``calls``), the train
step under ``pmap`` (``train``) or ``jax.jit`` (``sharded``), the choice between them
(``parallelism``); the tasks it trains are ``worker.tasks``, the module a user's task
imports. Importing this package is cheap (no jax); ``python -m worker`` runs ``main``."""
