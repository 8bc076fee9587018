"""What runs on each host: reads its identity, joins the JAX job, trains.

In parts, one package each: ``worker.contract`` (all the launcher reads: the identity in the
environment, ``job.json``, the lines, signals and request files), ``worker.runtime`` (the
process: joining, signals, the compilation cache), ``worker.telemetry`` (the step log,
timers, records, TensorBoard, the profiler), ``worker.data`` (the input pipeline),
``worker.recovery`` (checkpoints, the local tier, notices) and ``worker.trainer`` (the loop,
its step actions, the step). Importing any of them is cheap (no jax). ``python -m worker``
runs one process of a job (``worker.trainer.main``). What user code imports stays at the top:
``worker.tasks`` (``Task`` and the built-in tasks, for a task module) and ``worker.program``
(the helper a program imports, as ``podlaunch.program``). It never imports the launcher or
fabric.
"""
