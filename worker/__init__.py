"""What runs on each host: reads its identity, joins the JAX job, trains.

Importing this package is cheap (no jax): the launcher imports
``worker.contract`` for the typed contract (``Identity`` in the environment,
``WorkerJob`` in job.json) and the progress lines. ``python -m worker`` runs one
process of a job (see ``worker.trainer.main``). It never imports the launcher or fabric.
"""
