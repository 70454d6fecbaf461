"""What a run needs of its host's memory and of its process's limits on memory and file size,
against what they allow: one line before anything is made, rather than a MemoryError or a
killed rank later.

No baselines counterpart: baselines allocates its replay buffer and learns of a lack of memory
from the MemoryError or the OOM killer. The estimate (replay and demo buffers of the replay.py
layout, one batch, the networks, the processes) is docs/faults.md's; cli.config_for_task calls
it once the task's dimensions and T are known. Where a cgroup bounds the process (a Slurm job's
--mem, a container's limit), its room counts as well as the host's (cgroup_room, which
cli.check_limits asks for the pids a run starts too).

Test: `python -m pytest -q tests/test_bad_input.py tests/test_start_ends.py`.
"""
import contextlib
import os
import resource
import sys

from harness.errors import UsageError
from replay import episode_shapes

# MB of one process beside its arrays (Python, NumPy, MuJoCo, one env), rounded up: docs/usage.md
PROCESS_MB = 150


def check_memory(cfg, task, ranks_here, warn):
    """UsageError where the run needs (an estimate, named in the line) more memory than this
    host has free for `ranks_here` ranks (replay and demo buffers, one batch, the networks, the
    env processes), or more than this process's own limit (ulimit -v) leaves it; a warning at 80%;
    or a checkpoint larger than the files this process may write (ulimit -f)."""
    episode = sum(steps * dim for steps, dim in episode_shapes(task.dims, task.T).values())
    buffer = 4 * episode * (cfg.buffer_size // task.T + (cfg.num_demo if cfg.demo_file else 0))
    d = task.dims
    # the actor's and the critic's weights and biases: inputs o+g and o+g+u, `layers` hidden
    # layers of h units, outputs u and 1
    h = cfg.hidden
    params = ((2 * (d["o"] + d["g"] + 1) + d["u"]) * h + 2 * (cfg.layers - 1) * (h + 1) * h
              + (h + 1) * (d["u"] + 1))
    # float32: the buffers; per update the batch's arrays (o, o_2, g, ag, ag_2, u, r) and each
    # layer's activations and gradients, actor and critic, main and target; weights 6 times
    batch = 4 * cfg.batch_size * (2 * d["o"] + 3 * d["g"] + d["u"] + 16 * cfg.layers * cfg.hidden)
    processes = PROCESS_MB * 2**20 * (1 + (cfg.num_env if cfg.num_env > 1 else 0))
    arrays, room = buffer + batch + 24 * params, None
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status") as f:
        if limit != resource.RLIM_INFINITY:  # what ulimit -v leaves: the limit less its size now
            room = limit - 1024 * int(next(ln for ln in f if ln.startswith("VmSize:")).split()[1])
    if room is not None and arrays + PROCESS_MB * 2**20 > room:  # a margin: threads, buffers
        raise UsageError(f"the replay buffer, one batch and the networks need about "
                         f"{arrays / 2**30:.2f} GiB in this process, and its address-space limit "
                         f"(ulimit -v) leaves it {room / 2**30:.2f} GiB: raise the limit (ulimit "
                         "-v unlimited), or lower --buffer_size, --batch_size or --hidden")
    # the largest file: a checkpoint, of the episodes stored (a full buffer at most) and the
    # weights, targets and Adam moments (4 float32 copies)
    stored = min(cfg.buffer_size // task.T, cfg.n_epochs * cfg.n_cycles * cfg.num_env)
    largest = 4 * episode * stored + 16 * params
    fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if fsize != resource.RLIM_INFINITY and fsize < largest:
        raise UsageError(f"the run's checkpoints grow to about {largest / 2**20:.0f} MB ({stored} "
                         "episode(s) and the networks), and this process may write files of "
                         f"{fsize / 2**20:.0f} MB (ulimit -f): raise the limit (ulimit -f "
                         "unlimited), or lower --buffer_size or --hidden")
    # what this process may still take: Linux's MemAvailable, or less under a cgroup limit
    sizes = []
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/meminfo") as f:
        sizes.append(1024 * int(next(ln for ln in f if ln.startswith("MemAvailable:")).split()[1]))
    room = cgroup_room("memory", ("memory.max", "memory.current"),
                       ("memory.limit_in_bytes", "memory.usage_in_bytes"))
    sizes += [] if room is None else [room]
    need, have = ranks_here * (arrays + processes), min(sizes, default=None)
    if have is not None and need > 0.8 * have:
        line = (f"the run needs about {need / 2**30:.1f} GiB on this host ({ranks_here} rank(s) x "
                f"{buffer / 2**30:.2f} GiB of replay buffer, {batch / 2**30:.2f} GiB for one "
                f"batch, {24 * params / 2**30:.2f} GiB of networks, {processes / 2**30:.2f} GiB "
                f"of processes), against {have / 2**30:.1f} GiB free")
        if need > have:
            raise UsageError(f"{line}: lower --buffer_size, --batch_size, --hidden, --layers or "
                             "--num_env, or run fewer ranks on this host")
        if warn:
            print(f"warning: {line}; it may run out of memory", file=sys.stderr, flush=True)


def cgroup_room(controller, v2, v1):
    """The least room (a limit less its use: the names of their files under cgroup v2, and under
    v1's `controller` hierarchy) that this process's cgroup and every one above it leave: a
    Slurm job's, a container's. None where none sets a limit that can be read."""
    rooms = []
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:  # hierarchy-ID:controllers:path; v2's has no controllers
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers and controller not in controllers.split(","):
                continue
            root, names = ("/sys/fs/cgroup", v2) if not controllers else \
                (f"/sys/fs/cgroup/{controller}", v1)
            parts = [part for part in path.split("/") if part]
            for depth in range(len(parts), -1, -1):  # its own, then each above it
                folder = os.path.join(root, *parts[:depth])
                with contextlib.suppress(OSError, ValueError), \
                        open(os.path.join(folder, names[0])) as limit, \
                        open(os.path.join(folder, names[1])) as used:
                    rooms.append(int(limit.read()) - int(used.read()))  # v2's "max": no limit
    return min(rooms, default=None)
