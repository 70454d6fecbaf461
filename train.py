"""A run of DDPG + HER on every MPI rank: setup, the epoch/cycle loop, the epoch's log row.

Mirrors openai/baselines `her/her.py` (learn, train). Implements the training schedule of
Plappert et al. (2018), Sec. 2.2, which is Algorithm 1 of Andrychowicz et al. (2017) run on N
ranks at once: each epoch is n_cycles x (collect num_env episodes per rank, store them,
n_batches updates, a target update), then test rollouts; with --demo_file, the demonstrations
of Nair et al. (2018) are loaded into every rank's agent first. Every rank runs this same file;
there is no master. The settings are config.Config, one --flag each (--help).

Run:
    python train.py                                                # FetchReach-v4, one process
    mpirun -np 19 python train.py --num_env 2 --env FetchPush-v4   # Plappert et al. setup
    python train.py --resume runs/<run>                            # continue after Ctrl-C
    python play.py runs/<run>/policy_best.npz                      # watch the policy

Errors are one line and an exit code (errors.py; README "When things go wrong").

Test: `python -m pytest -q test_all.py::TestTrain`.
"""
import dataclasses
import json
import os
import sys
import time

import numpy as np

from checkpoint import (StopFlag, checkpoint_positions, common_position, read_checkpoint,
                        restore_agent, restore_epoch_so_far, save_checkpoint,
                        stop_safely_if_needed)
from config import (ArgumentParser, config_flags, given_config_args, parse_reward_range,
                    shared_config)
from ddpg import POLICY_KEYS, make_agent, policy_params, run_cycle
from errors import BadFileError, Interrupted, NonFiniteError, SaveError, UsageError
from files import atomic_write_text, load_demos, load_npz
from goal_env import GoalTask, build_venv, check_policy_fits, describe_env
from logger import CycleProgress, EpochLogger, RunLog, output_is_terminal
from mpi_util import (mpi_average, one_blas_thread, raise_if_any_rank_failed,
                      run_on_every_rank, save_on_every_rank)
from rollout import RolloutWorker
from tracing import Tracer


def train(cfg, policy, rollout_worker, evaluator, logger, progress, logdir, comm, stop, tracer,
          start_epoch=0, start_cycle=0, best_success_rate=-1., start_losses=()):
    """The epoch/cycle/batch loop; a resumed run starts at (start_epoch, start_cycle)."""
    workers = (rollout_worker, evaluator)
    for epoch in range(start_epoch, cfg.n_epochs):
        t_start = time.time()
        first_cycle = start_cycle if epoch == start_epoch else 0
        if first_cycle == 0:
            rollout_worker.clear_history()
        progress.start_epoch(epoch, first_cycle)
        losses = list(start_losses) if first_cycle > 0 else []
        for cycle in range(first_cycle, cfg.n_cycles):
            with tracer.cycle(epoch, cycle):
                losses += run_cycle(policy, rollout_worker, cfg.n_batches)
                stop_safely_if_needed(losses, stop, epoch, cycle, best_success_rate, policy,
                                      workers, logdir, comm)
            progress.cycle_done(cycle)

        progress.cycles_finished()
        evaluator.clear_history()
        for _ in range(cfg.n_test_rollouts):
            evaluator.generate_rollouts()

        policy.check_synced()
        success_rate = mpi_average(evaluator.current_success_rate(), comm)
        progress.end_epoch()
        row = epoch_logs(epoch, success_rate, losses, policy, rollout_worker, evaluator,
                         time.time() - t_start, comm)
        is_best = success_rate >= best_success_rate
        best_success_rate = max(best_success_rate, success_rate)
        save_on_every_rank(comm, save_epoch, cfg, epoch, row, is_best, best_success_rate, logger,
                           policy, workers, logdir, comm)
    return best_success_rate


def save_epoch(cfg, epoch, row, is_best, best, logger, policy, workers, logdir, comm):
    """The epoch's progress.csv row, the policies, then every rank's checkpoint: if anything
    before it fails, the run resumes at this epoch's start and logs its row again."""
    logger.dump(row)
    if comm.Get_rank() == 0:  # ranks hold identical weights, so rank 0 alone writes them
        if is_best:
            policy.save(os.path.join(logdir, "policy_best.npz"))
        policy.save(os.path.join(logdir, "policy_latest.npz"))
        if cfg.policy_save_interval > 0 and epoch % cfg.policy_save_interval == 0:
            policy.save(os.path.join(logdir, f"policy_{epoch}.npz"))
    save_checkpoint(logdir, epoch + 1, 0, best, policy, workers, comm)


def epoch_logs(epoch, success_rate, losses, policy, rollout_worker, evaluator, epoch_s, comm):
    """One progress.csv row: test figures averaged over ranks, totals over all ranks."""
    n_ranks = comm.Get_size()
    critic_loss, actor_loss = np.mean(losses, axis=0) if losses else (np.nan, np.nan)
    return {"epoch": epoch,
            "test/success_rate": success_rate,
            "test/mean_Q": mpi_average(evaluator.current_mean_Q(), comm),
            "train/success_rate": mpi_average(rollout_worker.current_success_rate(), comm),
            "train/critic_loss": mpi_average(critic_loss, comm),
            "train/actor_loss": mpi_average(actor_loss, comm),
            **policy.logs(),
            "total/episodes": rollout_worker.n_episodes * n_ranks,
            "total/timesteps": rollout_worker.n_episodes * n_ranks * policy.T,
            "time/epoch_s": epoch_s}


# ---------------------------------------------------------------- setting up a run

@dataclasses.dataclass
class RunPlan:
    """What a rank reads before it trains: the task, and the files the flags name."""
    task: GoalTask  # what describe_env read off the env
    checkpoints: dict = None  # --resume: {(epoch, cycle): path} of this rank's checkpoints
    checkpoint: dict = None  # --resume: the arrays of the one every rank loads
    checkpoint_path: str = ""  # --resume: where those came from
    resume_note: str = None  # --resume: common_position's note, if the ranks' newest differ
    init_policy: dict = None  # --load_path: the policy's arrays
    demos: dict = None  # --demo_file: {key: (num_demo, T or T+1, dim)}


def prepare(cfg, args, comm):
    """Local checks and file reads of a run, no MPI calls: returns what run() needs."""
    plan = RunPlan(task=describe_env(cfg.env, parse_reward_range(cfg.reward_range)))
    if args.resume:  # which of them is loaded, every rank decides together (load_checkpoint)
        plan.checkpoints = checkpoint_positions(args.resume, comm.Get_rank(), comm.Get_size())
    if args.load_path:
        plan.init_policy = load_npz(args.load_path, POLICY_KEYS, "policy")
        check_policy_fits(policy_params(plan.init_policy, args.load_path), args.load_path,
                          cfg.env, plan.task.dims)
    if cfg.demo_file:  # every rank reads the whole file, as in baselines
        plan.demos = load_demos(cfg.demo_file, cfg.env, plan.task.dims, plan.task.T,
                                cfg.num_demo)
    return plan


def make_logdir(cfg, comm, folders=()):
    """Each rank creates the folders it writes to (`checkpoint/` and `folders`), so ranks on
    machines without a shared file system save into the same path on their own disk; rank 0
    writes config.json. Every rank learns if any of them could not."""
    error = None
    try:
        for folder in ("checkpoint", *folders):
            os.makedirs(os.path.join(cfg.logdir, folder), exist_ok=True)
    except OSError as e:
        error = (f"cannot write to log dir {cfg.logdir!r} on rank {comm.Get_rank()} "
                 f"({e.strerror}); pass a --logdir that every rank can write")
    raise_if_any_rank_failed(comm, error)
    save_on_every_rank(comm, write_config, cfg, comm.Get_rank())


def write_config(cfg, rank):
    if rank == 0:
        atomic_write_text(os.path.join(cfg.logdir, "config.json"),
                          json.dumps(dataclasses.asdict(cfg), indent=1))


def load_checkpoint(plan, run_dir, comm):
    """Collective: every rank loads its checkpoint of the newest (epoch, cycle) all ranks have."""
    position, note = common_position(run_dir, plan.checkpoints, comm)
    plan.checkpoint_path = plan.checkpoints[position]
    try:
        plan.checkpoint, error = read_checkpoint(plan.checkpoint_path), None
    except BadFileError as e:
        error = str(e)
    raise_if_any_rank_failed(comm, error)
    plan.resume_note = note  # printed once log.txt is open


def run(cfg, args, comm, tracer):
    """Set up this rank (after every rank agreed that the input is good), then train."""
    rank = comm.Get_rank()
    if tracer.n_cycles > cfg.n_epochs * cfg.n_cycles:  # the same on every rank: all raise
        raise UsageError(f"--trace {tracer.n_cycles} is more cycles than the run has "
                         f"({cfg.n_epochs} epochs x {cfg.n_cycles} cycles); give at most "
                         f"{cfg.n_epochs * cfg.n_cycles}")
    try:
        plan, error = prepare(cfg, args, comm), None
    except (UsageError, BadFileError) as e:
        plan, error = None, str(e)
    raise_if_any_rank_failed(comm, error)
    if args.resume:
        load_checkpoint(plan, args.resume, comm)
    make_logdir(cfg, comm, tracer.folders)
    tracer.write_to(os.path.join(cfg.logdir, "trace"))
    progress = CycleProgress(sys.stdout, cfg.n_cycles, enabled=(rank == 0),
                             terminal=output_is_terminal(sys.stdout))  # not into log.txt
    resumed_at = None if plan.checkpoint is None else (int(plan.checkpoint["epoch"]),
                                                       int(plan.checkpoint["cycle"]))
    log = RunLog(cfg.logdir, enabled=(rank == 0), argv=["train.py", *args.argv],
                 resumed_at=resumed_at)
    if rank == 0:
        if plan.resume_note:
            print(plan.resume_note, flush=True)
        print_setup(cfg, plan.task, comm.Get_size())
    rng = np.random.default_rng(cfg.seed + 1000000 * rank)  # baselines: each rank its own data
    policy, start = make_policy(cfg, args, plan, rng, comm)
    venv = tracer.wrap_venv(build_venv(cfg))  # with --trace, its pipes count every message
    try:
        # Training and test rollouts share the envs, as in baselines (eval_env = env).
        task = plan.task
        rollout_worker = RolloutWorker(venv, policy, task.dims, task.T, rng,
                                       noise_eps=cfg.noise_eps, random_eps=cfg.random_eps,
                                       success_key=task.success_key)
        evaluator = RolloutWorker(venv, policy, task.dims, task.T, rng, exploit=True,
                                  compute_Q=True, success_key=task.success_key)
        if plan.checkpoint is not None:
            n_episodes = plan.checkpoint["n_episodes"]
            rollout_worker.n_episodes, evaluator.n_episodes = map(int, n_episodes)
            start["start_losses"] = restore_epoch_so_far(plan.checkpoint, rollout_worker)
        else:  # the state before any training, so a failure always has a checkpoint to go back to
            save_on_every_rank(comm, save_checkpoint, cfg.logdir, 0, 0, -1., policy,
                               (rollout_worker, evaluator), comm)
        logger = EpochLogger(cfg.logdir, enabled=(rank == 0), start_epoch=start["start_epoch"])
        best = train(cfg, policy, rollout_worker, evaluator, logger, progress, cfg.logdir, comm,
                     StopFlag(cfg.logdir, announce=(rank == 0)), tracer, **start)
        tracer.finish()  # if the run ended before its traced cycles did
        if rank == 0:
            print(f"Done: best test success rate {best:.3f}; {comm.Get_size()} rank(s) in "
                  f"sync; policies in {cfg.logdir}", flush=True)
    finally:
        progress.close()
        venv.close()
        log.close(sys.exc_info()[1])


def print_setup(cfg, task, n_ranks):
    print(f"Logging to {cfg.logdir}\n{cfg}\ndims={task.dims} T={task.T} max_u={task.max_u} "
          f"ranks={n_ranks}", flush=True)
    if n_ranks == 1:
        print("*** Warning: one MPI rank. This works (FetchReach learns), but Plappert et al. "
              "(2018) used 19 ranks x 2 envs, and the harder tasks learn far worse with one; "
              "to reproduce them run: mpirun -np 19 python train.py --num_env 2 ...",
              flush=True)


def make_policy(cfg, args, plan, rng, comm):
    """This rank's agent (collective: make_agent), from scratch, from --load_path or from its
    checkpoint; and where the loop starts."""
    policy = make_agent(cfg, plan.task, rng, comm)
    start = dict(start_epoch=0, start_cycle=0, best_success_rate=-1.)
    if plan.init_policy is not None:
        policy.set_policy_arrays(plan.init_policy, args.load_path)
    if plan.checkpoint is not None:
        ckpt = plan.checkpoint
        restore_agent(policy, ckpt, plan.checkpoint_path)
        start = dict(start_epoch=int(ckpt["epoch"]), start_cycle=int(ckpt["cycle"]),
                     best_success_rate=float(ckpt["best"]))
    if plan.demos is not None:  # after the restore: a resumed run's normaliser sums hold them
        policy.init_demo_buffer(plan.demos, update_stats=plan.checkpoint is None)
    return policy, start


# ---------------------------------------------------------------- command line

def make_parser():
    p = ArgumentParser(prog="train.py",
                       description="DDPG + HER (NumPy) on gymnasium-robotics goal tasks")
    config_flags(p)
    p.add_argument("--load_path", help="policy .npz to start training from")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    p.add_argument("--trace", type=int, default=0, metavar="N",
                   help="record every message between processes in the first N cycles into "
                        "<logdir>/trace/ and print a table of them (0: off; tracing.py)")
    return p


def parse_args(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for log.txt's header
    if args.trace < 0:
        p.error(f"--trace must be 0 (off) or a number of cycles, got {args.trace}")
    if args.resume and args.load_path:
        p.error("--resume cannot be combined with --load_path")
    if args.resume and set(given_config_args(args)) - {"n_epochs"}:
        p.error("--resume continues the saved configuration; only --n_epochs may be given")
    return args


def main(argv=None):
    one_blas_thread()  # before any env process starts: they inherit it
    args = parse_args(argv)
    # mpi4py is imported here, not at the top: importing it initialises MPI, and every env
    # process re-imports this file (`spawn` runs it as __mp_main__), where a top-level import
    # would initialise MPI as a second copy of its rank, which hangs the job.
    from mpi4py import MPI
    tracer = Tracer(args.trace)
    comm = tracer.wrap_comm(MPI.COMM_WORLD)  # with --trace, it records every MPI call
    return run_on_every_rank(comm, "train.py",
                             lambda: run(shared_config(args, comm), args, comm, tracer),
                             {UsageError: (2, "error: "), BadFileError: (2, "error: "),
                              SaveError: (1, "error: "), NonFiniteError: (1, ""),
                              Interrupted: (130, "")})


if __name__ == "__main__":
    sys.exit(main())
