"""pytest's fixtures for the whole suite: test_all.py (the algorithm) and tests/ (the rest).

`python -m pytest -q` from here runs both (pytest.ini's testpaths); this file's place at the
repository's root also puts the root on sys.path, so that the tests import the code and
tests.helpers as train.py does.
"""
import os

import pytest

from harness import mpi_util
from tests.helpers import shm_entries


@pytest.fixture(scope="module", autouse=True)  # every test file, each on its own
def dev_shm_left_as_found():
    """Each test file leaves /dev/shm as it found it: whatever is new at its end and used by no
    live process (a segment of an MPI job running beside the suite is in use) was leaked."""
    before = shm_entries()
    yield
    in_use = {os.path.basename(path) for path in mpi_util.shm_files_in_use()}
    leaked = sorted(shm_entries() - before - in_use)
    assert not leaked, f"the tests left {leaked} in /dev/shm"
