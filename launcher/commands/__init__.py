"""The commands beside ``launch SPEC``: ``launch runs`` and ``launch tensorboard``."""
