"""The infrastructure around the algorithm (openai/baselines keeps its own in `common/`).

    cli.py          the command line made from config.Config, and its checks
    goal_env.py     what is read off a goal task (GoalTask), building a rank's vec env
    mpi_util.py     MPI helpers: averages for the logs, agreeing on errors, ending a job
    errors.py       the errors reported as one line and an exit code
    files.py        atomic writes, pickle-free .npz reading, policy files, the demo file
    checkpoint.py   checkpoints and resume
    logger.py       progress.csv, the epoch table, log.txt
    bookkeeping.py  a rank's setup, and the bookkeeping around train()'s loop
    tracing.py      --trace: every message between processes, measured
    watchdog.py     --mpi_timeout: a time limit on every collective call; SIGINT, SIGTERM, SIGUSR1

These import the top level (the algorithm); the top level, train.py aside, never imports these.
"""
