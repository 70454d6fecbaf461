"""The run harness: everything around the algorithm that is not learning.

baselines keeps a library below its algorithm in `common/`; this folder sits above the top
level instead: it imports the algorithm (config, ddpg, replay, vecenv) and runs it. train.py
enters it once (run.start_run) and hands it the stop check and the epoch's files. README.md's
table of files says what each file here holds. The algorithm's files at the top level never
import these (train.py enters them, and conftest.py, the tests' fixtures, uses mpi_util); these
never import experiment/.
"""
