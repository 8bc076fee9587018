"""The run stage: supervision of one attempt, restarts, the launcher's own pauses."""
