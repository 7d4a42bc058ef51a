"""``python -m mpifl.docs``: see :mod:`mpifl.docs.blocks`."""

from mpifl.docs.blocks import main

raise SystemExit(main())
