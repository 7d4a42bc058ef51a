"""From run logs to tables and figures: one run's log summarised (:mod:`.summary`),
paired statistics over seeds (:mod:`.stats`), curves against a swept key
(:mod:`.curves`), tables in a paper's layout (:mod:`.paper_table`), per-seed
records (:mod:`.record`) and matplotlib on demand (:mod:`.figure`).
``python -m mpifl.analyze`` and ``python -m mpifl.results`` are the commands.
"""
