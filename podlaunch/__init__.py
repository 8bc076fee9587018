"""podlaunch's own name for what a user's code imports: ``from podlaunch import program``.

The helper lives in ``worker.program``; ``worker`` is a common name for a user's own module,
and a ``worker.py`` beside a program (the script's directory comes first on ``sys.path``)
hides podlaunch's package from ``from worker import program``. ``podlaunch`` is the
project's own name (its distribution), so it cannot clash that way. Importing this package
is cheap: no jax.
"""
