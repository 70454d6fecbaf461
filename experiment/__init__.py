"""What a user runs beside training (openai/baselines keeps its own in `her/experiment/`).

    python -m experiment.play POLICY.npz [--render | --save_video PATH.gif]
    python -m experiment.plot results/<run> ... [--table | --suite | --scaling ENV]
    python -m experiment.plot_trace runs/<run>/trace -o cycle.png
    python -m experiment.demos --env FetchPickAndPlace-v4 --num_demo 100 --out demos.npz
    python -m experiment.bench [--quick] [--only SECTION]
    mpirun -np R python -m experiment.bench_mpi; python -m experiment.bench_mpi --trace_cost

plot.py reads run folders through runs.py; bench.py and bench_mpi.py time through timing.py.
"""
