"""One run, from config to log: the round loop (:mod:`.runtime`), checkpoints and
the rules for resuming (:mod:`.checkpoint`), the run directory's lock
(:mod:`.lock`), the memory estimate made before anything is allocated
(:mod:`.memory`) and the provenance a log records (:mod:`.provenance`).
``python -m mpifl.main`` is the command.
"""
