"""The HER paper's first experiment with this project's DDPG, and SB3 beside it: bit flipping
(examples/bit_flipping.py) at n = 5 to 50 bits, for docs/results.md and docs/performance.md.

  python results/bits/run.py            every run missing from results/bits/logs/ (about 100 min)
  python results/bits/run.py --only ours-none --seeds 0 1 2     some of them
  python results/bits/summarize.py      the tables and results/bits.png from the logs

Ours: train.py --env examples.bit_flipping:BitFlipping<n>-v0 with OURS_FLAGS, a budget of
10 epochs x 50 cycles x 8 envs = 4,000 episodes, with HER ('future', k = 4: `ours-her`) and
without (`--replay_strategy none`: `ours-none`), seeds 0, 1, 2. SB3: results/bits/sb3_bits.py
(its DDPG and HerReplayBuffer on its own BitFlippingEnv, continuous), the same n and episode
budget, at most SB3_SECONDS a run, seeds SB3_SEEDS. One job at a time on this machine, through
results/peers/run.py's run_job (each output line's arrival time in stdout.tsv, meta.json,
evals.csv); for each n the order of ours-her and sb3-her alternates, and ours-none comes last.
A run whose meta.json is there already is not run again, so a stopped driver goes on.
The venv: results/peers/README.md's (requirements.txt, torch 2.13.0, stable-baselines3).
"""
import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LOGS = os.path.join(HERE, "logs")
RUNS_TMP = "/work/peers/runs-tmp"  # ours' run folders while they run

N_BITS = (5, 10, 15, 20, 30, 40, 50)
SEEDS = (0, 1, 2)
SB3_SEEDS = (0,)
SB3_SECONDS = 120
EPOCHS, CYCLES, ENVS = 10, 50, 8
OURS_FLAGS = ["--num_env", str(ENVS), "--hidden", "64", "--action_l2", "0",
              "--n_epochs", str(EPOCHS), "--n_cycles", str(CYCLES)]


def peers_driver():
    spec = importlib.util.spec_from_file_location(
        "peers_run", os.path.join(os.path.dirname(HERE), "peers", "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job(peers, impl, n, seed):
    name = f"{impl}-n{n}-seed{seed}"
    logdir = os.path.join(LOGS, name)
    if os.path.exists(os.path.join(logdir, "meta.json")):
        return
    shutil.rmtree(logdir, ignore_errors=True)
    python = [sys.executable, "-u"]
    if impl == "sb3-her":
        cmd = python + [os.path.join(HERE, "sb3_bits.py"), "--n_bits", str(n), "--seed",
                        str(seed), "--episodes", str(EPOCHS * CYCLES * ENVS), "--time_budget",
                        str(SB3_SECONDS)]
        peers.run_job(name, "sb3", cmd, REPO, peers.base_env(), logdir, SB3_SECONDS + 30)
        return
    rundir = os.path.join(RUNS_TMP, name)
    shutil.rmtree(rundir, ignore_errors=True)
    os.makedirs(RUNS_TMP, exist_ok=True)
    strategy = "future" if impl == "ours-her" else "none"
    cmd = python + ["train.py", "--env", f"examples.bit_flipping:BitFlipping{n}-v0", "--seed",
                    str(seed), "--replay_strategy", strategy, "--logdir", rundir, *OURS_FLAGS]
    peers.run_job(name, "ours", cmd, REPO, peers.base_env(), logdir, 3600)
    for keep in ("progress.csv", "config.json", "log.txt"):
        shutil.copy(os.path.join(rundir, keep), logdir)
    shutil.rmtree(rundir)  # policies, checkpoints


def cpu():
    with open("/proc/cpuinfo") as f:
        return next((line.split(":")[1].strip() for line in f if line.startswith("model name")),
                    "cpu unknown")


def write_versions(path):
    """The machine, the versions and ours' commit, beside the logs."""
    code = ("from importlib.metadata import version as v; print(*(f'{p} {v(p)}' for p in ("
            "'numpy', 'torch', 'stable-baselines3', 'gymnasium', 'mpi4py')), sep=chr(10))")
    versions = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                            text=True)
    with open(path, "a") as f:
        f.write(f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n{cpu()}, "
                f"{os.cpu_count()} cores, python {sys.version.split()[0]}\n"
                f"{versions.stdout}ours at {commit.stdout}\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=["ours-her", "ours-none", "sb3-her"],
                   default=["ours-her", "ours-none", "sb3-her"])
    p.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    args = p.parse_args()
    peers = peers_driver()
    os.makedirs(LOGS, exist_ok=True)
    write_versions(os.path.join(LOGS, "versions.txt"))
    for seed in args.seeds:
        for i, n in enumerate(N_BITS):
            pair = ["ours-her"] + (["sb3-her"] if seed in SB3_SEEDS else [])
            for impl in pair[::1 if (seed + i) % 2 == 0 else -1] + ["ours-none"]:
                if impl in args.only:
                    job(peers, impl, n, seed)


if __name__ == "__main__":
    main()
