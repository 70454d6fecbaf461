"""The run harness: everything around the algorithm that is not learning.

baselines keeps a library below its algorithm in `common/`; this folder sits above the top
level instead: it imports the algorithm (config, ddpg, replay, vecenv) and runs it. train.py
enters it once (run.start_run) and hands it the stop check and the epoch's files.

    run.py          start_run: a rank's start-up; Run: what train() hands over (files, stops)
    cli.py          the command line made from config.Config, and its checks
    goal_env.py     what is read off a goal task (GoalTask), building a rank's vec env
    launch.py       how the process was started, and whether MPI agrees (the launch check)
    mpi_util.py     MPI helpers: the observed communicator, averages, agreeing on errors
    watchdog.py     --mpi_timeout: a time limit on every collective call; the stop signals
    tracing.py      --trace: every collective call and pipe message of the first cycles, timed
    errors.py       the errors reported as one line and an exit code
    files.py        atomic writes, pickle-free .npz reading, policy files, the demo file
    checkpoint.py   checkpoints and resume
    logger.py       progress.csv, the epoch table, log.txt
    runlock.py      one job per run folder

The top level, train.py aside, never imports these; these never import experiment/.
"""
