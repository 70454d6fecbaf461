"""--trace N: every message between processes in the first N cycles of a run, measured.

No baselines counterpart (baselines logs scalars per epoch). It shows what crosses between the
ranks whose gradients are summed before every update (Plappert et al. 2018, Sec. 2.2) and
between each rank and its env processes: the Tracer observes the communicator (one of
mpi_util.ObservedComm's observers, as the watchdog is) and wraps the ends of the vec env's pipes
(TracedPipe) where train.py creates them, so the learning code is unchanged; with N = 0 it
records nothing and no pipe is wrapped. The trace holds the setup, the first N cycles and what
ran between them. Each rank writes <logdir>/trace/rank<r>.csv (COLUMNS); rank 0 gathers all
rows (the CSVs may be on other machines' disks), prints a table of call sites and writes
trace.json in the Chrome trace event format (ui.perfetto.dev, chrome://tracing).

Run:  mpirun -np 2 python train.py --num_env 2 --env FetchPush-v4 --trace 3
      python -m experiment.plot_trace runs/<run>/trace -o cycle.png        # one lane per rank
Test: `python -m pytest -q tests/test_tracing.py`.
(Named tracing.py: `trace` is a standard module.)
"""
import json
import os
import pickle
import statistics
import sys
import time
from multiprocessing.reduction import ForkingPickler

from harness.files import atomic_write_text
from harness.mpi_util import save_on_every_rank

# The columns of rank<r>.csv, each with what it holds (written above the header as # lines).
COLUMNS = (
    ("rank", "the MPI rank that recorded the row"),
    ("kind", "mpi: a call on the communicator; env: one request to an env process and its "
             "answer; cycle: one whole cycle"),
    ("call", "the comm method (Allreduce, Bcast, allgather, bcast, ...), the env command "
             "(step, reset, render, close) or 'cycle'"),
    ("site", "file:function that made the call (for env messages: the first caller outside "
             "vecenv.py)"),
    ("peer", "'all ranks' for MPI, 'env process i' for a pipe"),
    ("elements", "array elements this rank put in (empty for pickled objects)"),
    ("bytes_sent", "bytes this rank sent: the buffer, or the pickled object or command"),
    ("bytes_received", "bytes the answer held (env messages; pickled objects received)"),
    ("phase", "setup (before the first cycle), cycle, or between (after a cycle: test "
              "rollouts, the epoch's logs and checkpoints)"),
    ("epoch", "the epoch of the current or last cycle (empty in setup)"),
    ("cycle", "the cycle within its epoch (empty in setup)"),
    ("start_s", "when it started: seconds since 1970 (time.time(), one clock per machine)"),
    ("duration_s", "seconds inside the call; env: waiting for the answer; cycle: its length"),
)


def pickled_size(obj):
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def buffer_size(buf):
    """(elements, bytes) of an MPI buffer argument: an array, or [array, MPI type]."""
    array = buf[0] if isinstance(buf, (list, tuple)) else buf
    return int(getattr(array, "size", 0)), int(getattr(array, "nbytes", 0))


def caller_site(frame, skip=("tracing.py",)):
    """'file:function' of the first frame outside the files in `skip`."""
    while frame is not None and os.path.basename(frame.f_code.co_filename) in skip:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_qualname}"


class Tracer:
    """One rank's trace; with n_cycles = 0 it wraps and records nothing (run.py uses it alike)."""

    def __init__(self, n_cycles, clock=time.time):
        self.n_cycles, self.clock = n_cycles, clock
        self.recording = n_cycles > 0
        self.rows = []  # tuples in COLUMNS order, without the rank
        self.phase, self.epoch, self.cycle_in_epoch = "setup", "", ""
        self.cycles_done = 0
        self.comm = self.folder = None  # comm: the communicator finish() gathers through

    @property
    def folders(self):
        """The log-dir folders a traced run writes to (run.make_logdir creates them)."""
        return ("trace",) if self.n_cycles else ()

    def wrap_venv(self, venv, folder=None):
        """The vec env, its pipes counting every message; `folder`: where finish() writes
        rank<r>.csv (<logdir>/trace)."""
        self.folder = folder
        if self.n_cycles and hasattr(venv, "remotes"):  # DummyVecEnv has no pipes
            venv.remotes = tuple(TracedPipe(remote, i, self)
                                 for i, remote in enumerate(venv.remotes))
        return venv

    def record(self, kind, call, site, peer, elements, bytes_sent, bytes_received, start,
               duration):
        if self.recording:
            self.rows.append((kind, call, site, peer, elements, bytes_sent, bytes_received,
                              self.phase, self.epoch, self.cycle_in_epoch, start, duration))

    def entering(self, call):
        """Before each collective call (mpi_util.ObservedComm)."""
        call.start = self.clock()

    def left(self, call):
        """After it: a row, if it returned while the trace records (its own calls in finish()
        come after recording stopped)."""
        if self.recording and call.done:
            elements, sent, received = call_sizes(call, self.comm.Get_rank())
            self.record("mpi", call.name, caller_site(call.frame), "all ranks", elements, sent,
                        received, call.start, self.clock() - call.start)

    def begin_cycle(self, epoch, cycle):
        """Where a cycle begins: stops the trace where cycle n_cycles would begin. Collective
        then (finish())."""
        if self.recording and self.cycles_done == self.n_cycles:
            self.finish()  # [MPI]
        self.phase, self.epoch, self.cycle_in_epoch = "cycle", epoch, cycle
        self.cycle_start = self.clock()

    def close_cycle(self):
        """Where the cycle begun last ends (after its stop check): its row."""
        self.record("cycle", "cycle", "train.py:train", "", "", "", "", self.cycle_start,
                    self.clock() - self.cycle_start)
        self.phase = "between"
        self.cycles_done += 1

    def finish(self):
        """Collective, at a cycle boundary or the end of the run: every rank writes its CSV,
        rank 0 trace.json and the table over all ranks."""
        if not self.recording:
            return
        self.recording = False
        rank = self.comm.Get_rank()
        path = os.path.join(self.folder, f"rank{rank}.csv")
        # save_on_every_rank: a full disk on one rank ends every rank, none waits in gather
        save_on_every_rank(self.comm, atomic_write_text, path, self.csv_text(rank))  # [MPI]
        gathered = self.comm.gather((summarise(self.rows), self.rows), root=0)  # [MPI] --trace
        json_path = os.path.join(self.folder, "trace.json")
        json_text = chrome_trace([rows for _, rows in gathered]) if rank == 0 else None
        save_on_every_rank(self.comm, write_if_any, json_path, json_text)  # [MPI]
        if rank == 0:
            summaries = [summary for summary, _ in gathered]
            print(f"Trace of {min(self.cycles_done, self.n_cycles)} cycle(s) on "
                  f"{len(summaries)} rank(s), one CSV per rank in {self.folder} and all ranks in "
                  f"trace.json (Perfetto, chrome://tracing; picture: "
                  f"python -m experiment.plot_trace "
                  f"{self.folder} -o cycle.png)\n{format_table(summaries)}", flush=True)

    def csv_text(self, rank):
        lines = [f"# {name}: {meaning}" for name, meaning in COLUMNS]
        lines.append(",".join(name for name, _ in COLUMNS))
        for row in self.rows:
            cells = [rank, *row[:-2], f"{row[-2]:.6f}", f"{row[-1]:.6f}"]
            lines.append(",".join(str(c) for c in cells))
        return "\n".join(lines) + "\n"


def write_if_any(path, text):
    """Rank 0 writes trace.json; the other ranks, with None, only join save_on_every_rank."""
    if text is not None:
        atomic_write_text(path, text)


def call_sizes(call, rank):
    """(elements, bytes sent, bytes received) of one collective call on this rank: buffer calls
    (capitalised, as mpi4py names them) send the array as it is, object calls (lower case) the
    pickled object; a broadcast's root only sends, the other ranks only receive."""
    args, kwargs = call.args, call.kwargs
    if call.name == "Abort":
        return "", 0, 0
    if call.name == "Allreduce":
        elements, n_bytes = buffer_size(args[0])
        return elements, n_bytes, n_bytes
    is_root = rank == kwargs.get("root", args[1] if len(args) > 1 else 0)
    if call.name == "Bcast":
        elements, n_bytes = buffer_size(args[0])
        return elements, (n_bytes if is_root else 0), (0 if is_root else n_bytes)
    sent, received = pickled_size(args[0]), pickled_size(call.result)
    if call.name == "bcast":
        return "", (sent if is_root else 0), (0 if is_root else received)
    return "", sent, (received if call.result is not None else 0)  # allgather, gather


class TracedPipe:
    """The rank's end of one env process's pipe, counting what goes through it. It pickles as
    multiprocessing's Connection.send does (ForkingPickler), so the bytes are the pipe's own."""

    def __init__(self, conn, i, tracer):
        self._conn, self._tracer, self._peer = conn, tracer, f"env process {i}"
        self._pending = ("", 0, "?")  # the last command sent: (name, bytes, call site)
        self._wait_start = None  # when the rank began waiting for the answer

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def send(self, obj):
        data = ForkingPickler.dumps(obj)
        site = caller_site(sys._getframe(1), skip=("tracing.py", "vecenv.py"))
        self._pending = (obj[0], len(data), site)  # every command is (name, data)
        self._conn.send_bytes(data)

    def poll(self, timeout):
        """Easy to miss: with --env_timeout the rank waits here, in poll, and recv then finds
        the answer there; the wait starts at the first poll for an answer."""
        if self._wait_start is None:
            self._wait_start = self._tracer.clock()
        return self._conn.poll(timeout)

    def recv(self):
        start = self._wait_start if self._wait_start is not None else self._tracer.clock()
        data = self._conn.recv_bytes()  # without a timeout, the rank waits here
        duration = self._tracer.clock() - start
        self._wait_start = None
        name, n_sent, site = self._pending
        self._tracer.record("env", name, site, self._peer, "", n_sent, len(data), start,
                            duration)
        return ForkingPickler.loads(data)


# A call site's figures on one rank (in_cycles, outside: calls; sent, received, seconds: in cycles)
NO_CALLS = dict(in_cycles=0, outside=0, elements=frozenset(), sent=0, received=0, seconds=0.)


def summarise(rows):
    """One rank's rows per (kind, call, site), and the number and total length of its cycles."""
    cycles = [row for row in rows if row[0] == "cycle"]
    sites = {}
    for kind, call, site, _, elements, sent, received, phase, *_, duration in rows:
        if kind == "cycle":
            continue
        s = sites.setdefault((kind, call, site), dict(NO_CALLS, elements=set()))
        s["elements"].add(elements)
        if phase != "cycle":
            s["outside"] += 1
            continue
        s["in_cycles"] += 1
        s["sent"] += sent
        s["received"] += received
        s["seconds"] += duration
    return dict(n_cycles=len(cycles), cycle_s=sum(row[-1] for row in cycles), sites=sites)


def per_rank(values, fmt):
    """One figure if every rank has the same, else each rank's."""
    shown = [fmt(v) for v in values]
    return shown[0] if len(set(shown)) == 1 else " ".join(f"r{r}: {v}"
                                                          for r, v in enumerate(shown))


def per_cycle(stats, n, key, fmt):
    """One call site's figure `key` per cycle (n: each rank's cycles), as per_rank shows it."""
    return per_rank([st[key] / c for st, c in zip(stats, n, strict=True)], fmt)


def format_table(summaries):
    """The markdown table rank 0 prints: one row per call site, ranks side by side."""
    keys = sorted({key for s in summaries for key in s["sites"]},
                  key=lambda k: (k[0] != "mpi", k[2], k[1]))
    lines = ["| where (file:function) | call | calls per cycle | calls outside cycles | "
             "elements per call | bytes sent per cycle | bytes received per cycle | "
             "share of the cycle in it (median over ranks) |", "|---" * 8 + "|"]
    for kind, call, site in keys:
        stats = [s["sites"].get((kind, call, site), NO_CALLS) for s in summaries]
        n = [max(s["n_cycles"], 1) for s in summaries]
        elements = ", ".join(sorted(str(e) for e in stats[0]["elements"] if e != "")) or "-"
        cells = [f"`{site}`", f"{call} ({'pipe' if kind == 'env' else 'MPI'})",
                 per_cycle(stats, n, "in_cycles", "{:g}".format),
                 per_rank([st["outside"] for st in stats], str), elements]
        if any(st["in_cycles"] for st in stats):
            shares = [st["seconds"] / max(s["cycle_s"], 1e-12)
                      for st, s in zip(stats, summaries, strict=True)]
            cells += [per_cycle(stats, n, "sent", "{:,.0f}".format),
                      per_cycle(stats, n, "received", "{:,.0f}".format),
                      f"{statistics.median(shares):.1%}"]
        else:
            # made in setup or at an epoch's end only: nothing in cycles to measure
            cells += ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    cycle_s = [s["cycle_s"] / max(s["n_cycles"], 1) for s in summaries]
    lines.append(f"| whole cycle | - | - | - | - | - | - | {statistics.median(cycle_s):.3f} s "
                 "(median over ranks) |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the Chrome trace event format

LANES = {"cycle": (0, "cycles"), "mpi": (1, "MPI calls")}  # env process i: lane 2 + i


def lane(kind, peer):
    """(tid, lane name) of a row."""
    if kind in LANES:
        return LANES[kind]
    i = int(peer.rsplit(" ", 1)[-1])  # 'env process i'
    return 2 + i, peer


def chrome_trace(rows_by_rank):
    """The JSON text of every rank's rows as complete ("X") events, with metadata ("M") events
    naming each rank's process and lanes. ts counts microseconds from the earliest start of any
    rank's row (otherData.origin_unix_s); each rank's starts are time.time() of its machine, so
    on several machines the ranks' lanes are offset by the difference of their clocks."""
    starts = [row[-2] for rows in rows_by_rank for row in rows]
    origin = min(starts, default=0.)
    events = []
    for rank, rows in enumerate(rows_by_rank):
        events.append(dict(name="process_name", ph="M", pid=rank, tid=0,
                           args=dict(name=f"rank {rank}")))
        events.append(dict(name="process_sort_index", ph="M", pid=rank, tid=0,
                           args=dict(sort_index=rank)))
        lanes = {}
        for kind, call, site, peer, elements, sent, received, phase, epoch, cycle, start, \
                duration in rows:
            tid, lane_name = lane(kind, peer)
            lanes[tid] = lane_name
            args = dict(site=site, peer=peer, elements=elements, bytes_sent=sent,
                        bytes_received=received, phase=phase, epoch=epoch, cycle=cycle)
            events.append(dict(name=call, cat=kind, ph="X", pid=rank, tid=tid,
                               ts=round((start - origin) * 1e6, 3),
                               dur=round(duration * 1e6, 3),
                               args={k: v for k, v in args.items() if v != ""}))
        for tid, name in sorted(lanes.items()):
            events.append(dict(name="thread_name", ph="M", pid=rank, tid=tid,
                               args=dict(name=name)))
            events.append(dict(name="thread_sort_index", ph="M", pid=rank, tid=tid,
                               args=dict(sort_index=tid)))
    return json.dumps(dict(traceEvents=events, displayTimeUnit="ms",
                           otherData=dict(origin_unix_s=origin)), separators=(",", ":"))
