"""Backends start the planned processes and hand back ``supervise.Worker`` handles."""
