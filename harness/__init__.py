"""The run harness: everything around the algorithm that is not learning.

baselines keeps a library below its algorithm in `common/`; this folder sits above the top
level instead: it imports the algorithm (config, ddpg, replay, vecenv) and runs it. train.py
enters it once (run.start_run) and hands it the stop check and the epoch's files. README.md's
table of files says what each file here holds. The top level, train.py aside, never imports
these; these never import experiment/.
"""
