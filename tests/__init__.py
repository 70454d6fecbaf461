"""The tests of harness/ and experiment/ (the algorithm's are in ../test_all.py)."""
