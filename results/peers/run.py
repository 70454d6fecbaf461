"""Driver for the wall-clock comparison of three HER implementations
(this repository's train.py, the PyTorch port TianhongDai/hindsight-experience-replay,
Stable-Baselines3 HerReplayBuffer under DDPG and SAC). One job at a time.

Each job is launched by this driver, which records the launch time and the
arrival time (seconds since launch) of every output line in stdout.tsv, stops
the job (SIGINT to its process group, SIGKILL 5 s later) at its time limit or
once its target success is printed, and writes meta.json. Logs go to
results/peers/logs/<task>-<impl>-seed<S>/.

  python results/peers/run.py full            the whole measurement (README.md)
  python results/peers/run.py smoke --out DIR short runs of each implementation
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEERS = "/work/peers"
PORT = os.path.join(PEERS, "port")
PYTHON = sys.executable
MPIRUN = os.path.join(os.path.dirname(PYTHON), "mpirun")
SHIM = os.path.join(HERE, "gym_shim")
RUNS_TMP = os.path.join(PEERS, "runs-tmp")  # ours' run folders while they run
PORT_COMMIT = "fff9994cfcca78421136c0634c4df2e6ff9bd791"
ZOO_SOURCE = ("DLR-RM/rl-baselines3-zoo hyperparams/sac.yml FetchReach-v1 at 22e3ff2450fd92033f7f032915e1f64894a09584 (SAC); "
              "hyperparams/her.yml commented-out FetchReach-v1 DDPG entry at 26dfece (DDPG); see sb3_her.py")

OURS_EPOCH = re.compile(r"^\|\s*epoch\s*\|\s*(\d+)\s*\|")
OURS_SUCC = re.compile(r"^\|\s*test/success_rate\s*\|\s*([-\d.eE+]+)\s*\|")
OURS_STEPS = re.compile(r"^\|\s*total/timesteps\s*\|\s*([-\d.eE+]+)\s*\|")
OURS_END = re.compile(r"^\|\s*time/epoch_s\s*\|")
PORT_LINE = re.compile(r"epoch is: (\d+), eval success rate is: ([\d.]+)")
SB3_LINE = re.compile(r"eval steps=(\d+) wall_s=([\d.]+) success=([\d.]+)")


class Parser:
    """Turns a job's output lines into evaluations (epoch, steps, success)."""

    def __init__(self, impl, steps_per_epoch):
        self.impl, self.spe, self.cur = impl, steps_per_epoch, {}

    def feed(self, line):
        if self.impl == "ours":
            for key, rx in (("epoch", OURS_EPOCH), ("success", OURS_SUCC), ("steps", OURS_STEPS)):
                m = rx.match(line)
                if m:
                    self.cur[key] = float(m.group(1))
            if OURS_END.match(line) and "success" in self.cur:
                ev, self.cur = self.cur, {}
                return ev
        elif self.impl == "port":
            m = PORT_LINE.search(line)
            if m:
                e = int(m.group(1))
                return {"epoch": e, "steps": (e + 1) * self.spe, "success": float(m.group(2))}
        else:
            m = SB3_LINE.search(line)
            if m:
                return {"epoch": int(m.group(1)) // 500 - 1, "steps": int(m.group(1)), "success": float(m.group(3))}
        return None


def descendants(pid):
    """All live descendants of pid, from /proc."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def signal_all(proc, pids, sig):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def run_job(name, impl, cmd, cwd, env, logdir, limit_s, target=None, steps_per_epoch=0, max_evals=None):
    os.makedirs(logdir, exist_ok=True)
    parser = Parser(impl, steps_per_epoch)
    evals, state = [], {"stop": None}
    meta = {"name": name, "impl": impl, "cmd": cmd, "cwd": cwd, "limit_s": limit_s, "target": target,
            "steps_per_epoch": steps_per_epoch, "launch_unix": time.time(),
            "launch_local": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"[{meta['launch_local']}] start {name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, errors="replace", bufsize=1)
    out = open(os.path.join(logdir, "stdout.tsv"), "w")

    def reader():
        for line in proc.stdout:
            t = time.monotonic() - t0
            line = line.rstrip("\n")
            out.write(f"{t:.3f}\t{line}\n")
            out.flush()
            ev = parser.feed(line)
            if ev is not None:
                ev["t"] = t
                evals.append(ev)
                print(f"  {name} t={t:7.1f}s steps={ev['steps']:.0f} success={ev['success']:.3f}", flush=True)
                if target is not None and ev["success"] >= target and state["stop"] is None:
                    state["stop"] = "target_reached"
                if max_evals is not None and len(evals) >= max_evals and state["stop"] is None:
                    state["stop"] = "max_evals"

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    seen = set()
    while proc.poll() is None:
        seen.update(descendants(proc.pid))
        if time.monotonic() - t0 >= limit_s and state["stop"] is None:
            state["stop"] = "time_limit"
        if state["stop"] is not None:
            break
        time.sleep(0.25)
    if proc.poll() is None:
        meta["stop_t"] = time.monotonic() - t0
        seen.update(descendants(proc.pid))
        signal_all(proc, seen, signal.SIGINT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            seen.update(descendants(proc.pid))
            signal_all(proc, seen, signal.SIGKILL)
            proc.wait()
            meta["killed"] = True
    # Leftovers (ranks that outlived mpirun): SIGKILL those still alive.
    time.sleep(1)
    for p in seen:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    th.join(timeout=10)
    out.close()
    meta["end_t"] = time.monotonic() - t0
    meta["returncode"] = proc.returncode
    meta["end_reason"] = state["stop"] or "exited"
    meta["n_evals"] = len(evals)
    with open(os.path.join(logdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    with open(os.path.join(logdir, "evals.csv"), "w") as f:
        f.write("epoch,steps,t_driver_s,test_success\n")
        for ev in evals:
            f.write(f"{ev.get('epoch', -1):.0f},{ev['steps']:.0f},{ev['t']:.3f},{ev['success']:.3f}\n")
    print(f"  {name}: {meta['end_reason']} at {meta['end_t']:.1f}s, rc {proc.returncode}, {len(evals)} evals",
          flush=True)
    return meta


def base_env(port=False):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if port:
        env["PYTHONPATH"] = SHIM + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def job(task, impl, seed, logroot, limit_s, target=None, n_epochs=1000, max_evals=None):
    """task: reach or push. impl: ours, port, sb3-ddpg, sb3-sac."""
    env_id = {"reach": "FetchReach-v4", "push": "FetchPush-v4"}[task]
    name = f"{env_id}-{impl}-seed{seed}"
    logdir = os.path.join(logroot, name)
    if os.path.exists(logdir):
        shutil.rmtree(logdir)
    if impl == "ours":
        rundir = os.path.join(RUNS_TMP, name)
        if os.path.exists(rundir):
            shutil.rmtree(rundir)
        os.makedirs(RUNS_TMP, exist_ok=True)
        args = [PYTHON, "-u", "train.py", "--env", env_id, "--seed", str(seed), "--logdir", rundir,
                "--n_epochs", str(n_epochs)]
        if task == "push":
            cmd = [MPIRUN, "-np", "2"] + args + ["--num_env", "2"]
        else:
            cmd = args
        meta = run_job(name, impl, cmd, REPO, base_env(), logdir, limit_s, target, 0, max_evals)
        for keep in ("progress.csv", "config.json", "log.txt"):
            if os.path.exists(os.path.join(rundir, keep)):
                shutil.copy(os.path.join(rundir, keep), logdir)
        shutil.rmtree(rundir, ignore_errors=True)  # policies, checkpoints
    elif impl == "port":
        if task == "push":
            cmd = [MPIRUN, "-np", "2", PYTHON, "-u", "train.py", "--env-name", "FetchPush-v1",
                   "--seed", str(seed), "--n-epochs", str(n_epochs)]
            spe = 50 * 2 * 50 * 2  # n_cycles * rollouts per worker * T * workers
        else:
            cmd = [MPIRUN, "-np", "1", PYTHON, "-u", "train.py", "--env-name", "FetchReach-v1",
                   "--n-cycles", "10", "--seed", str(seed), "--n-epochs", str(n_epochs)]
            spe = 10 * 2 * 50 * 1
        meta = run_job(name, impl, cmd, PORT, base_env(port=True), logdir, limit_s, target, spe, max_evals)
    else:
        algo = impl.split("-")[1]
        cmd = [PYTHON, "-u", os.path.join(HERE, "sb3_her.py"), "--algo", algo, "--seed", str(seed),
               "--time_budget", str(limit_s), "--out", os.path.join(logdir, "sb3_eval.csv")]
        os.makedirs(logdir, exist_ok=True)
        # the script stops itself at limit_s; the driver's kill comes 5 s later
        meta = run_job(name, impl, cmd, REPO, base_env(), logdir, limit_s + 5, target, 0, max_evals)
    meta["task"], meta["seed"] = task, seed
    with open(os.path.join(logdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def sh(cmd, cwd=None):
    try:
        return subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True).stdout.strip()
    except OSError as e:
        return str(e)


def write_versions(path):
    code = ("import numpy, torch, stable_baselines3, sb3_contrib, mujoco, gymnasium, mpi4py;"
            "from importlib.metadata import version;"
            "print('numpy', numpy.__version__); print('torch', torch.__version__);"
            "print('stable-baselines3', stable_baselines3.__version__); print('sb3-contrib', sb3_contrib.__version__);"
            "print('mujoco', mujoco.__version__); print('gymnasium', gymnasium.__version__);"
            "print('gymnasium-robotics', version('gymnasium-robotics')); print('mpi4py', mpi4py.__version__);"
            "print('mpich (wheel)', version('mpich'))")
    lines = [
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        "cpu: " + sh("lscpu | grep 'Model name' | sed 's/Model name:\\s*//'"),
        f"cores: {os.cpu_count()}",
        "python: " + sys.version.split()[0],
        sh(f"OMP_NUM_THREADS=1 {PYTHON} -c \"{code}\""),
        f"torch threads with OMP_NUM_THREADS=1: " + sh(f"OMP_NUM_THREADS=1 {PYTHON} -c 'import torch; print(torch.get_num_threads())'"),
        f"port: TianhongDai/hindsight-experience-replay {PORT_COMMIT} (run from {PORT}, gym via results/peers/gym_shim)",
        "ours: " + sh("git rev-parse HEAD", cwd=REPO) + " (branch " + sh("git rev-parse --abbrev-ref HEAD", cwd=REPO) + ")",
        f"zoo hyperparameters: {ZOO_SOURCE}",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines), flush=True)


REACH_ORDER = ["ours", "port", "sb3-ddpg", "sb3-sac"]


def full(logroot):
    os.makedirs(logroot, exist_ok=True)
    write_versions(os.path.join(logroot, "versions.txt"))
    t_start = time.monotonic()
    # FetchReach, one process, 5 minutes each; the order rotates with the seed.
    for seed in (0, 1, 2):
        order = REACH_ORDER[seed:] + REACH_ORDER[:seed]
        for impl in order:
            job("reach", impl, seed, logroot, 300.0)
    # FetchPush, 2 ranks x 2 envs. Round 1: until 0.5 or 25 min; round 2: 5 epochs.
    job("push", "ours", 0, logroot, 1500.0, target=0.5)
    job("push", "port", 0, logroot, 1500.0, target=0.5)
    job("push", "port", 1, logroot, 1500.0, n_epochs=5)
    job("push", "ours", 1, logroot, 1500.0, n_epochs=5)
    print(f"all done in {(time.monotonic() - t_start) / 60:.1f} min", flush=True)


def smoke(logroot, seconds):
    os.makedirs(logroot, exist_ok=True)
    write_versions(os.path.join(logroot, "versions.txt"))
    for impl in REACH_ORDER:
        job("reach", impl, 0, logroot, seconds)
    job("push", "port", 0, logroot, 600.0, max_evals=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["full", "smoke"])
    p.add_argument("--out", default=os.path.join(HERE, "logs"))
    p.add_argument("--seconds", type=float, default=45.0, help="smoke: seconds per FetchReach run")
    p.add_argument("--running_flag", default=None, help="file to remove at the end")
    a = p.parse_args()
    try:
        if a.mode == "full":
            full(a.out)
        else:
            smoke(a.out, a.seconds)
    finally:
        if a.running_flag and os.path.exists(a.running_flag):
            os.remove(a.running_flag)


if __name__ == "__main__":
    main()
