"""--trace N: every collective call and every env-process message of a start's first N cycles.

No baselines counterpart (deviation 30: an addition; docs/usage.md says what it writes, and
when). The Tracer is the communicator proxy's second observer (mpi_util.ObservedComm): a row
per call, with the line that made it and the bytes this rank put in; a TracedPipe on the rank's
end of each env process's pipe times a command until its answer is read.

Run:  mpirun -np 2 python train.py --env FetchReach-v4 --num_env 2 --n_cycles 2 --trace 1
Test: `python -m pytest -q tests/test_tracing.py`.
"""
import collections
import contextlib
import json
import os
import pickle
import time
from multiprocessing.reduction import ForkingPickler

from harness.errors import SaveError
from harness.files import atomic_write_text
from harness.mpi_util import save_on_every_rank

# call sites are named from here, as the docs name code, with the line: file:function:line
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Tracer:
    """One rank's recorder: rows (kind, name, site, bytes, start_us, end_us), none without
    --trace. Its own bcast and gather are made while it is off."""

    def __init__(self):
        self.n_cycles, self.cycles, self.on, self.zero, self.rows = 0, 0, False, 0., []

    def now(self):
        return round((time.time() - self.zero) * 1e6)  # microseconds since time 0

    def entering(self, name, frame, args):
        """Before each collective call (ObservedComm)."""
        if self.on:
            code, nbytes = frame.f_code, sent_bytes(name, args, self.comm.Get_rank())
            site = f"{os.path.relpath(code.co_filename, ROOT)}:{code.co_qualname}:{frame.f_lineno}"
            self.call = ("mpi", name, site, nbytes, self.now())

    def left(self):
        if self.on:
            self.rows.append((*self.call, self.now()))

    def begin(self, comm, folder, n_cycles, venv):
        """Collective with --trace (n_cycles > 0: a bcast): recording begins, of the collective
        calls and of the pipes of the vec env's env processes (--num_env 1 has none)."""
        if n_cycles:
            self.comm, self.folder, self.n_cycles = comm, folder, n_cycles
            if hasattr(venv, "remotes"):
                venv.remotes = [TracedPipe(pipe, i, self) for i, pipe in enumerate(venv.remotes)]
            t_root = comm.bcast(time.time(), root=0)  # [MPI] --trace: rank 0's clock
            self.zero, self.on = t_root if comm.Get_rank() == 0 else time.time(), True

    def end_cycle(self):
        """Collective after the N-th traced cycle (finish)."""
        if self.on:
            self.cycles += 1
            if self.cycles == self.n_cycles:
                self.finish()  # [MPI] --trace

    def finish(self):
        """Collective while recording (a gather, save_on_every_rank): the files, the table."""
        if not self.on:
            return
        self.on, rank = False, self.comm.Get_rank()
        span_s = self.now() / 1e6
        csv = ["kind,name,site,bytes,start_us,end_us", *(",".join(map(str, r)) for r in self.rows)]
        files = {f"rank-{rank}.csv": "\n".join(csv) + "\n"}
        ranks = self.comm.gather(self.rows, root=0)  # [MPI] --trace: every rank's rows
        if rank == 0:
            files["trace.json"] = chrome_trace(ranks)
        try:
            save_on_every_rank(self.comm, write_files, self.folder, files)  # [MPI]
        except SaveError as e:  # a checkpoint is there: Run.save_start's, or a later one's
            raise SaveError(f"{e}; once it can be written, --resume "
                            f"{os.path.dirname(self.folder)} goes on from the last checkpoint "
                            "(with --trace N, tracing its first N cycles)") from None
        if rank == 0:
            print(table(ranks, self.cycles, span_s), flush=True)


def sent_bytes(name, args, rank):
    """Of the buffer or the pickled object a rank puts in (root 0: every broadcast's)."""
    if name == "Abort" or (name.lower() == "bcast" and rank != 0):
        return 0
    if name[0].isupper():
        return args[0].nbytes
    return len(pickle.dumps(args[0], pickle.HIGHEST_PROTOCOL))


class TracedPipe:
    """The rank's end of env process i's pipe; poll and close are the pipe's own."""

    def __init__(self, pipe, i, tracer):
        self.pipe, self.i, self.tracer = pipe, i, tracer

    def __getattr__(self, name):
        return getattr(self.pipe, name)

    def send(self, command):
        data = ForkingPickler.dumps(command)
        self.sent = (command[0], len(data), self.tracer.now())  # a command is (name, data)
        self.pipe.send_bytes(data)

    def recv(self):
        data = self.pipe.recv_bytes()
        name, nbytes, start = self.sent
        if self.tracer.on:
            row = ("pipe", name, f"env process {self.i}", nbytes + len(data), start)
            self.tracer.rows.append((*row, self.tracer.now()))
        return ForkingPickler.loads(data)


def write_files(folder, files):
    """A folder that cannot be made fails in the first write, as its SaveError."""
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
    for name, text in files.items():
        atomic_write_text(os.path.join(folder, name), text)


def chrome_trace(ranks):
    """tid 0: MPI; tid 1 + i: env process i."""
    events = [dict(name=name, ph="X", ts=start, dur=end - start, pid=rank,
                   tid=0 if kind == "mpi" else 1 + int(site.split()[-1]),
                   args=dict(site=site, bytes=nbytes))
              for rank, rows in enumerate(ranks)
              for kind, name, site, nbytes, start, end in rows]
    lanes = {(e["pid"], e["tid"], e["args"]["site"] if e["tid"] else "MPI") for e in events}
    events += [dict(name="thread_name", ph="M", ts=0, pid=pid, tid=tid, args=dict(name=lane))
               for pid, tid, lane in lanes]
    events += [dict(name="process_name", ph="M", ts=0, pid=rank, tid=0,
                    args=dict(name=f"rank {rank}")) for rank in range(len(ranks))]
    return json.dumps({"traceEvents": events})


def table(ranks, n_cycles, span_s):
    """A row per call site and per env process's command: its mean a cycle over the ranks."""
    calls, sent, us = collections.Counter(), collections.Counter(), collections.Counter()
    for kind, name, site, nbytes, start, end in (row for rows in ranks for row in rows):
        calls[kind, name, site] += 1
        sent[kind, name, site] += nbytes
        us[kind, name, site] += end - start
    per, cycle_s = n_cycles * len(ranks), span_s / n_cycles
    lines = [f"--trace: {n_cycles} cycle(s), {len(ranks)} rank(s), {cycle_s:.3f} s a cycle on "
             "rank 0; per cycle and rank:", "| kind | call | site | calls | bytes | seconds | "
             "share of the cycle |", "|---" * 7 + "|"]
    for key in sorted(calls):
        seconds = us[key] / 1e6 / per
        lines.append(f"| {' | '.join(key)} | {calls[key] / per:g} | {sent[key] / per:,.0f} | "
                     f"{seconds:.4f} | {seconds / cycle_s:.1%} |")
    return "\n".join(lines)
