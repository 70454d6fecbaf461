"""Training DDPG + HER on every MPI rank: the agent, its rollout workers, and train()'s loop.

Mirrors openai/baselines `her/her.py` (learn, train). Implements the training schedule of
Plappert et al. (2018), Sec. 2.2, which is Algorithm 1 of Andrychowicz et al. (2017) run on N
ranks at once: each epoch is n_cycles x (collect num_env episodes per rank, store them,
n_batches updates, a target update), then test rollouts. Every rank runs this same file;
there is no master. The settings are config.Config, one --flag each (--help); with
--demo_file, learn() puts the demonstrations of Nair et al. (2018), read at setup, into every
rank's demo buffer.
What is not learning (checks, files, resume, logs, the stop check) is harness/bookkeeping.py's.
The loop deviates from baselines' in three places: two calls, each marked where it is made
(the stop check after every cycle, deviations 9 and 10 of docs/deviations.md; check_synced
after every epoch, 8), and one call left out, baselines' per-epoch check that the ranks' seeds
differ (34: train() has no line to mark for it, the list says why); its bookkeeping adds
resumable runs (10) and policy_latest.npz every epoch (15).

Run:
    python train.py                                                # FetchReach-v4, one process
    mpirun -np 19 python train.py --num_env 2 --env FetchPush-v4   # Plappert et al. setup
    python train.py --resume runs/<run>                            # continue after Ctrl-C
    python -m experiment.play runs/<run>/policy_best.npz           # watch the policy

Errors are one line and an exit code (harness/errors.py; docs/faults.md).

Test: `python -m pytest -q test_all.py::TestTrain`.
"""
import sys

import numpy as np

from harness.bookkeeping import Bookkeeping, prepare_run
from harness.cli import parse_train_args, shared_config
from harness.errors import EXIT_CODES
from harness.files import set_policy_from_file
from harness.goal_env import build_venv
from harness.launch import check_launch, mpi_library, start_mpi
from harness.mpi_util import ObservedComm, one_blas_thread, run_on_every_rank
from harness.tracing import Tracer
from harness.watchdog import Watchdog
from config import Config
from ddpg import DDPG
from rollout import RolloutWorker


def train(cfg, policy, rollout_worker, evaluator, books):
    """Algorithm 1 on this rank, as baselines' train(). `books` (harness/bookkeeping.py) keeps
    what is not learning: where a resumed run starts, the trace and the progress bar, the stop
    check, the epoch's logs and files. Collective. Returns the best test success rate."""
    for epoch, first_cycle in books.epochs():
        if first_cycle == 0:  # (a run resumed mid-epoch has its history back)
            rollout_worker.clear_history()
        for cycle in range(first_cycle, cfg.n_cycles):
            with books.cycle(epoch, cycle):  # [MPI] --trace: gathered after its last cycle
                episodes = rollout_worker.generate_rollouts()  # num_env episodes, this rank's envs
                policy.store_episode(episodes)  # [MPI] this rank's buffer; normalisers pooled
                for _ in range(cfg.n_batches):
                    books.losses.append(policy.train())  # [MPI] MpiAdam sums the gradients
                policy.update_target_net()
                # Not in baselines: every rank stops after the same cycle, saving, on a signal
                # to any rank, and none goes on past a non-finite loss or weight on any rank.
                books.stop_safely_if_needed(epoch, cycle)  # [MPI] one allgather
        evaluator.clear_history()
        for _ in range(cfg.n_test_rollouts):
            evaluator.generate_rollouts()
        policy.check_synced()  # [MPI] not in baselines: every rank holds rank 0's weights
        books.end_epoch(epoch)  # [MPI] the logs averaged over ranks; files; checkpoints
    return books.best_success_rate


def learn(cfg, plan, comm, tracer, watchdog):
    """baselines' learn(): this rank's agent, its weights (rank 0's, --load_path's or a
    checkpoint's), the demonstrations, the two rollout workers, then train(). Collective."""
    rng = np.random.default_rng(cfg.seed + 1000000 * comm.Get_rank())  # each rank its own data
    policy = DDPG(cfg, plan.task, rng, comm)  # [MPI] every rank takes rank 0's weights
    if plan.init_policy is not None:  # --load_path: every rank reads the same file
        set_policy_from_file(policy, plan.init_policy, plan.load_path)
    venv = tracer.wrap_venv(build_venv(cfg))  # with --trace, its pipes count every message
    books = None
    try:
        # Training and test rollouts share the envs, as in baselines (eval_env = env).
        rollout_worker = RolloutWorker(venv, policy, rng, noise_eps=cfg.noise_eps,
                                       random_eps=cfg.random_eps,
                                       success_key=plan.task.success_key)
        evaluator = RolloutWorker(venv, policy, rng, exploit=True, compute_Q=True,
                                  success_key=plan.task.success_key)
        # --resume: each rank its own checkpoint (agent, buffer, counters); no MPI call
        books = Bookkeeping(cfg, plan, policy, (rollout_worker, evaluator), comm, tracer, watchdog)
        if plan.demos is not None:  # Nair et al. (2018): every rank's buffer holds the demos;
            # a resumed run's normaliser sums hold them already (its checkpoint has them)
            policy.init_demo_buffer(plan.demos, update_stats=plan.checkpoint is None)  # [MPI]
        books.save_start()  # [MPI] a new run's checkpoint before any training
        best = train(cfg, policy, rollout_worker, evaluator, books)  # [MPI]
        tracer.finish()  # [MPI] if the run ended before its traced cycles did
    finally:
        if books is not None:
            books.close()
        venv.close()
    if comm.Get_rank() == 0:
        print(f"Done: best test success rate {best:.3f}; {comm.Get_size()} rank(s) in sync; "
              f"policies in {cfg.logdir}", flush=True)


def main(argv=None):
    """Collective: `python train.py` on every rank; returns the exit code."""
    one_blas_thread()  # before any env process starts: they inherit it
    args = parse_train_args(argv)
    MPI = start_mpi()  # here, not at the top: launch.start_mpi says why
    # N one-rank copies (a launcher whose PMI this MPI lacks) end here, writing nothing, one line
    wrong = check_launch(MPI.COMM_WORLD.Get_size(), mpi_library())
    if wrong is not None:
        return wrong
    # A time limit on every collective call, and signals that work while a rank waits in one
    # (the limit until rank 0's configuration has come: the flag's or the default).
    watchdog = Watchdog(Config.mpi_timeout if args.mpi_timeout is None else args.mpi_timeout)
    tracer = Tracer(args.trace)
    # One proxy: the watchdog times every collective call, and with --trace the tracer records
    # it; the watchdog's own Abort goes to MPI directly, the trace's own gather is timed too.
    comm = ObservedComm(MPI.COMM_WORLD, (watchdog, tracer))
    watchdog.comm, tracer.comm = MPI.COMM_WORLD, comm

    def job():
        cfg = shared_config(args, comm)  # [MPI] rank 0's, on every rank
        watchdog.limit_s, watchdog.logdir = cfg.mpi_timeout, cfg.logdir
        with prepare_run(cfg, args, comm, tracer) as plan:  # [MPI] checks, files, log dir, log.txt
            learn(cfg, plan, comm, tracer, watchdog)  # [MPI]
    watchdog.start()
    try:
        return run_on_every_rank(comm, "train.py", job, EXIT_CODES)  # [MPI] Abort if one raises
    finally:
        watchdog.close()


if __name__ == "__main__":
    sys.exit(main())
