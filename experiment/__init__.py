"""What a user runs beside training (openai/baselines keeps its own in `her/experiment/`).

    play.py        python -m experiment.play POLICY.npz [--render | --save_video PATH.gif]
    demos.py       python -m experiment.demos --env FetchPickAndPlace-v4 --num_demo 100 --out D.npz
    plot.py        python -m experiment.plot results/<run> ... [--table] [--scaling ENV | --suite]
    runs.py        the run folders plot.py reads, grouped over seeds
    plot_tables.py plot.py's markdown tables (--table, --runs, --gap) and the published marks
    stats.py       median and IQR, the IQM and its bootstrap interval, for the tables
    bench.py       python -m experiment.bench [--quick] [--only SECTION] (one process)
"""
