"""The side-by-side runs against the PyTorch port of baselines HER and Stable-Baselines3
(results/peers/): docs/performance.md's "Against the peers" tables are what
results/peers/summarize.py makes of the committed logs, line for line; and the bit-flipping
tables (results/bits/) are what results/bits/summarize.py makes of theirs.

No baselines counterpart. The runs themselves take about 100 minutes on 2 cores and need torch
and stable-baselines3 (results/peers/README.md); this test only reads their logs.

Run: `python -m pytest -q tests/test_peers.py`.
"""
import os
import subprocess
import sys

from tests.helpers import ROOT

PEERS = os.path.join(ROOT, "results", "peers")


def test_the_peers_tables_are_the_logs():
    out = subprocess.run([sys.executable, os.path.join(PEERS, "summarize.py"),
                          os.path.join(PEERS, "logs")], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("|")]
    with open(os.path.join(ROOT, "docs", "performance.md")) as f:
        page = f.read()
    missing = [row for row in rows if row not in page]
    assert len(rows) > 20 and not missing, "\n".join(missing)


def test_the_bit_flipping_tables_are_the_logs():
    """docs/results.md's bit-flipping table and docs/performance.md's side-by-side with SB3 are
    what results/bits/summarize.py makes of results/bits/logs, line for line."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "results", "bits", "summarize.py")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    tables = out.stdout.split("\n\n")
    pages = []
    for page in ("results.md", "performance.md"):
        with open(os.path.join(ROOT, "docs", page)) as f:
            pages.append(f.read())
    for table, page in zip(tables, [pages[0], pages[1], pages[1]], strict=True):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        missing = [row for row in rows if row not in page]
        assert len(rows) > 4 and not missing, "\n".join(missing)
