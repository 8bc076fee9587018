"""The run directory: the source of truth of a run that outlives its terminal, one module per
file of it, each with its writer, its reader and the doc of its keys.

==================  ==========================================  =============================
file                what it holds                               module
==================  ==========================================  =============================
``run.json``        the run's state, steps, loss, goodput,      ``record`` (``Record`` writes,
                    failures (what ``launch runs`` lists)       ``read`` reads)
``ledger.json``     every attempt's seconds by cause (goodput)  ``ledger``
``supervisor.json`` a detached run's journal, sealed: what a    ``journal``
                    supervisor needs to take the run back
``launcher.lock``   one launcher per run directory              ``runlock``
``spec.yaml``       the resolved spec, secrets masked, and      ``specdiff``
                    what a ``--resume`` may change in it
(none)              run names: a directory, ``JOB/STAMP``,      ``names``; ``index`` (the
                    a job's newest; the user's runs anywhere    user's runs, in the state dir)
==================  ==========================================  =============================

Every file is read and written through ``worker.contract.runfiles`` (never through a link;
another user's file is refused) and every directory is checked by ``launcher.owned``.
Commands import these modules, never each other.
"""
