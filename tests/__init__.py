"""The tests of common/ and experiment/ (the algorithm's are in ../test_all.py)."""
