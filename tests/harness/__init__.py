"""The suite's harness: how tests start processes and compare ranks (tests/README.md).

world.py     cached worlds of worker processes that run a test's functions (World.run)
spawned.py   worlds a test spawns itself, whose ranks run one scenario of the test's file
spawned_rank.py  one rank of such a world
procs.py     the one launcher of child processes, free_port, torchrun helpers
wire_client.py   the handshake and op header as a foreign client speaks them
"""
