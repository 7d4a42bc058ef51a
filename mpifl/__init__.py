"""mpifl: MPI-native experiment runner for personalized and decentralized FL."""

__version__ = "0.1.0"
