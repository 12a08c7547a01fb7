"""System tests: real servers, crashes, workers, end to end, attacks, linkage; slow and apart."""
