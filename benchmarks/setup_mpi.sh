#!/usr/bin/env bash
# Open MPI and mpi4py for `compare.py --peer mpi`, pinned: Debian 12's Open MPI 4.1.4 and
# mpi4py 4.1.1's binary wheel, which loads that libmpi at run time (no compiling).
set -euo pipefail
if ! command -v mpirun > /dev/null || ! mpirun --version | grep -q "4.1.4"; then
  apt-get install -y -q openmpi-bin=4.1.4-3+b1 libopenmpi-dev=4.1.4-3+b1
fi
python3 -c "import mpi4py, sys; sys.exit(mpi4py.__version__ != '4.1.1')" 2>/dev/null \
  || python3 -m pip install -q --only-binary mpi4py mpi4py==4.1.1
mpirun --version | head -1
python3 -c "import mpi4py; from mpi4py import MPI; print('mpi4py', mpi4py.__version__)"
