"""A world of one rank: the communicator of an agent that runs in a single process, without MPI.

No baselines counterpart: baselines' algorithm files fall back on MPI.COMM_WORLD when given no
communicator. Here the algorithm files (ddpg.py, mpi_adam.py, normalizer.py) import nothing
but each other, numpy and the standard library, so whoever builds an agent passes the
communicator in: train.py and play.py pass MPI.COMM_WORLD, and the tests and benchmarks that
build an agent in one process pass ONE_RANK, which answers every call the code makes as
COMM_WORLD of a one-rank job does, without initialising MPI: a sum or a gather over one rank is
its own value, a broadcast from rank 0 leaves rank 0's data as it is.

Test: `python -m pytest -q tests/test_mpi_util.py`.
"""


class OneRankComm:
    """The collective calls of mpi4py's Comm that this project makes, over one rank."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Allreduce(self, sendbuf, recvbuf, op=None):
        """recvbuf = the sum (or any op) over one rank: sendbuf itself."""
        recvbuf[...] = sendbuf

    def Bcast(self, buf, root=0):
        """Rank 0's buffer to every rank: this one is rank 0's already."""

    def Barrier(self):
        """Every rank has arrived."""

    def allgather(self, obj):
        return [obj]

    def gather(self, obj, root=0):
        return [obj]

    def bcast(self, obj, root=0):
        return obj


ONE_RANK = OneRankComm()
