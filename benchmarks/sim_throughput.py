"""Simulator throughput against MuJoCo (see :mod:`bcg.evaluation.sim_throughput`; same as ``bcg bench``)."""

import sys

from bcg.evaluation.sim_throughput import main

if __name__ == "__main__":
    main(sys.argv[1:])
