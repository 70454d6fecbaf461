"""Training DDPG + HER on every MPI rank: the agent, its rollout workers, and train()'s loop.

Mirrors openai/baselines `her/her.py` (learn, train). Implements the training schedule of
Plappert et al. (2018), Sec. 2.2, which is Algorithm 1 of Andrychowicz et al. (2017) run on N
ranks at once: each epoch is n_cycles x (collect num_env episodes per rank, store them,
n_batches updates, a target update), then test rollouts. Every rank runs this same file;
there is no master. The settings are config.Config, one --flag each (--help); with
--demo_file, learn() puts the demonstrations of Nair et al. (2018), read at setup, into every
rank's demo buffer.
What is not learning (MPI's start, the launch check, the watchdog, the run folder, log.txt,
checkpoints and resume) is harness/run.py's: main() enters it once, and train() hands it the
stop check after each cycle and the epoch's logs to write. The loop deviates from
baselines' in three places: two calls, each marked where it is made (the stop check after
every cycle, deviations 9 and 10 of docs/deviations.md; DDPG.check_synced after every epoch, 8),
and one call left out, baselines' per-epoch check that the ranks' seeds differ (34: train()
has no line to mark for it, the list says why); its files add resumable runs (10) and
policy_latest.npz every epoch (15).

Run:
    python train.py                                                # FetchReach-v4, one process
    mpirun -np 19 python train.py --num_env 2 --env FetchPush-v4   # Plappert et al. setup
    python train.py --resume runs/<run>                            # continue after Ctrl-C
    python -m experiment.play runs/<run>/policy_best.npz           # watch the policy

Test: `python -m pytest -q test_all.py::TestTrain tests/test_train.py`.
"""
import time

from harness.run import start_run  # first: Ctrl-C while the rest imports is one line

# isort: split
import numpy as np

from ddpg import DDPG
from harness.files import set_policy_from_file
from harness.mpi_util import mpi_average
from rollout import RolloutWorker


def train(cfg, policy, rollout_worker, evaluator, run, start):
    """Algorithm 1 on this rank, as baselines' train(): from `start` (epoch 0, cycle 0, or
    where a resumed run stopped) to n_epochs; `run` (harness/run.py) writes the files and
    takes the stop check. Collective. Returns the best test success rate."""
    best_success_rate = start.best_success_rate
    for epoch in range(start.epoch, cfg.n_epochs):
        t_start = time.time()
        first_cycle = start.cycle if epoch == start.epoch else 0
        # the epoch's (critic, actor) losses; a run resumed mid-epoch has those so far back
        losses = list(start.losses) if first_cycle > 0 else []
        if first_cycle == 0:
            rollout_worker.clear_history()
        for cycle in range(first_cycle, cfg.n_cycles):
            # num_env episodes from this rank's envs
            episodes = rollout_worker.generate_rollouts()
            # into this rank's buffer; the normalisers' sums are pooled over ranks
            policy.store_episode(episodes)  # [MPI]
            for _ in range(cfg.n_batches):
                # MpiAdam sums the gradients over ranks
                losses.append(policy.train())  # [MPI]
            policy.update_target_net()
            # Not in baselines: every rank stops after the same cycle, saving, on a signal to
            # any rank, and none goes on past a non-finite loss or weight on any rank.
            run.end_cycle(epoch, cycle, losses, best_success_rate)  # [MPI] one allgather
        evaluator.clear_history()
        for _ in range(cfg.n_test_rollouts):
            evaluator.generate_rollouts()
        # Not in baselines: every rank holds rank 0's weights and normaliser sums, or the run stops
        policy.check_synced()  # [MPI]
        logs = epoch_logs(epoch, policy, rollout_worker, evaluator, losses, run.comm)  # [MPI]
        logs["time/epoch_s"] = time.time() - t_start
        # As baselines: policy_best.npz whenever the test success rate is the best so far
        is_best = logs["test/success_rate"] >= best_success_rate
        best_success_rate = max(best_success_rate, logs["test/success_rate"])
        # progress.csv and the policies (rank 0), every rank's checkpoint
        run.end_epoch(epoch, logs, is_best, best_success_rate)  # [MPI]
    return best_success_rate


def epoch_logs(epoch, policy, rollout_worker, evaluator, losses, comm):
    """Collective: the epoch's row of progress.csv, as baselines' record_tabular calls: the
    test and train figures averaged over ranks, the totals over all ranks."""
    critic_loss, actor_loss = np.mean(losses, axis=0) if losses else (np.nan, np.nan)
    n_episodes = rollout_worker.n_episodes * comm.Get_size()
    return {"epoch": epoch,
            "test/success_rate": mpi_average(evaluator.current_success_rate(), comm),  # [MPI]
            "test/mean_Q": mpi_average(evaluator.current_mean_Q(), comm),  # [MPI]
            "train/success_rate": mpi_average(rollout_worker.current_success_rate(),  # [MPI]
                                              comm),
            "train/critic_loss": mpi_average(critic_loss, comm),  # [MPI]
            "train/actor_loss": mpi_average(actor_loss, comm),  # [MPI]
            **policy.logs(),
            "total/episodes": n_episodes,
            "total/timesteps": n_episodes * policy.T}


def learn(run):
    """baselines' learn(): this rank's agent, its weights (rank 0's, --load_path's or a
    checkpoint's), the demonstrations, the two rollout workers, then train(). Collective."""
    cfg, comm, task = run.cfg, run.comm, run.task
    # each rank its own data
    rng = np.random.default_rng(cfg.seed + 1000000 * comm.Get_rank())
    policy = DDPG(cfg, task, rng, comm)  # [MPI] every rank takes rank 0's weights
    if run.inputs.init_policy is not None:  # --load_path: every rank reads the same file
        set_policy_from_file(policy, run.inputs.init_policy, run.inputs.load_path)
    # Training and test rollouts share the envs, as in baselines (eval_env = env).
    rollout_worker = RolloutWorker(run.venv, policy, rng, noise_eps=cfg.noise_eps,
                                   random_eps=cfg.random_eps, success_key=task.success_key)
    evaluator = RolloutWorker(run.venv, policy, rng, exploit=True, compute_Q=True,
                              success_key=task.success_key)
    # --resume: this rank's checkpoint (agent, buffer, counters); no MPI call
    start = run.restore(policy, (rollout_worker, evaluator))
    if run.inputs.demos is not None:
        # Nair et al. (2018): every rank's buffer holds the demos; a resumed run's normaliser
        # sums hold them already (its checkpoint has them)
        policy.init_demo_buffer(run.inputs.demos,  # [MPI]
                                update_stats=run.inputs.checkpoint is None)
    # a new run's checkpoint before any training
    run.save_start(start)  # [MPI]
    best = train(cfg, policy, rollout_worker, evaluator, run, start)  # [MPI]
    if comm.Get_rank() == 0:
        print(f"Done: best test success rate {best:.3f}; {comm.Get_size()} rank(s) in sync; "
              f"policies in {cfg.logdir}", flush=True)


def main(argv=None):
    """Collective: `python train.py` on every rank. Bad input, a wrong launch or a stop end in
    one line and SystemExit with the exit code (harness/errors.py; docs/faults.md)."""
    # MPI, the flags and rank 0's configuration, the input files, the run folder, the vec env
    with start_run(argv) as run:  # [MPI]
        learn(run)  # [MPI]


if __name__ == "__main__":
    main()  # [MPI]
