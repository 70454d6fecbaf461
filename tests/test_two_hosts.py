"""tests/two-hosts.sh: two simulated machines (network namespaces, as root) running one job.

No baselines counterpart: 2 hosts x 1 rank of train.py meet over a veth pair, end in sync with
the gradients on the wire between them, each host's disk holds only its ranks' files, and
nothing (namespaces, links, mounts, /tmp folders) is left behind. Skipped where namespaces
cannot be made (not root, no iproute2).

Run: `python -m pytest -q tests/test_two_hosts.py` (from the repository's root).
"""
import contextlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, mpi_family, read_progress

# ---------------------------------------------------------------- tests/two-hosts.sh: two machines

def why_no_simulated_hosts():
    """Why tests/two-hosts.sh cannot make its hosts here (one line), or None if it can."""
    if os.geteuid() != 0:
        return "tests/two-hosts.sh needs root to make network namespaces"
    missing = [tool for tool in ("ip", "unshare", "nsenter") if not shutil.which(tool)]
    if missing:
        return f"tests/two-hosts.sh needs {', '.join(missing)} (iproute2, util-linux)"
    if mpi_family() != "MPICH":
        return f"tests/two-hosts.sh needs MPICH's mpiexec (Hydra), not {mpi_family()}"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "ip", "link", "add", "name",
                            "probe0", "type", "veth", "peer", "name", "probe1"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode:
        return f"cannot make a namespace with a veth pair here: {probe.stderr.strip()}"
    return None


def what_hosts_leave():
    """What two simulated hosts could leave behind: named namespaces, this namespace's links and
    mounts, the network namespaces that processes are in, the script's /tmp folders."""
    in_use = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            in_use.add(os.readlink(f"/proc/{pid}/ns/net"))
    with open("/proc/mounts") as f:
        mounts = set(f.read().splitlines())
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    named = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return dict(net_namespaces=in_use, mounts=mounts, named=named,
                links={line.split(":")[1].strip() for line in links.splitlines()},
                tmp={name for name in os.listdir("/tmp") if name.startswith("two-hosts.")})


class TestTwoHosts:
    """tests/two-hosts.sh: two machines."""

    @pytest.mark.slow
    def test_two_hosts_run_in_sync_over_the_wire_and_leave_nothing(self, tmp_path):
        """tests/two-hosts.sh, 2 hosts x 1 rank, one epoch of 2 cycles of 5 updates: the ranks end
        in sync, the gradients crossed the veth (each update Allreduces 1.1 MB of FetchReach
        gradients, so at least that much goes each way, where shared memory would put tens of kB
        on the wire), each host's disk held only its ranks' files, and nothing is left behind."""
        reason = why_no_simulated_hosts()
        if reason:
            pytest.skip(reason)
        before = what_hosts_leave()
        out_dir = tmp_path / "out"
        proc = subprocess.run(
            ["bash", os.path.join(ROOT, "tests", "two-hosts.sh"), "1", "1", "--out", str(out_dir),
             "--", "--n_cycles", "2", "--n_batches", "5"],
            capture_output=True, text=True, timeout=240,
            env=dict(os.environ, PYTHON=sys.executable))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        report = {line.split(":")[1].split(" ")[1]: line for line in out.splitlines()
                  if line.startswith("two-hosts: ")}
        assert "2 rank(s) in sync" in report["ended"], out[-4000:]
        sent, received = map(int, re.search(r"host0 sent (\d+) bytes to host1 and received (\d+)",
                                            report["the"]).groups())
        assert min(sent, received) > 2 * 5 * 1.0e6, report["the"]
        held = {host: report[f"{host}'s"].rsplit(": ", 1)[1].split()
                for host in ("host0", "host1")}
        assert {"progress.csv", "config.json", "checkpoint/rank0.npz"} <= set(held["host0"])
        assert "checkpoint/rank1.npz" not in held["host0"]
        assert sorted(held["host1"]) == ["checkpoint/rank1.npz", "checkpoint/rank1.prev.npz"]
        assert len(read_progress(out_dir)) == 1
        after = what_hosts_leave()
        after["net_namespaces"] -= before["net_namespaces"]  # others' processes may have ended
        before["net_namespaces"] = set()
        assert after == before

    @pytest.mark.slow
    def test_a_host_that_loses_its_wire_ends_on_both_sides_and_leaves_nothing(self, tmp_path):
        """tests/two-hosts.sh --cut_wire: host1's end of the wire goes down mid-run; the ranks of
        both hosts, each waiting in a collective call, end by their own --mpi_timeout (host1's
        cannot be reached by host0's mpiexec), and nothing is left in any namespace, without
        anyone having to SIGKILL a process."""
        reason = why_no_simulated_hosts()
        if reason:
            pytest.skip(reason)
        limit, cut = 20, 45
        before = what_hosts_leave()
        proc = subprocess.run(
            ["bash", os.path.join(ROOT, "tests", "two-hosts.sh"), "1", "100", "--out",
             str(tmp_path / "out"), "--cut_wire", str(cut), "--",
             "--n_cycles", "10", "--n_batches", "20", "--mpi_timeout", str(limit)],
            capture_output=True, text=True, timeout=600,
            env=dict(os.environ, PYTHON=sys.executable))
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-4000:]
        assert "two-hosts: host1's wire went down" in out, out[-4000:]
        report = {line.split(":")[1].split(" ")[1]: line for line in out.splitlines()
                  if line.startswith("two-hosts: ")}
        assert f"(--mpi_timeout {limit})" in report.get("ended", ""), out[-4000:]
        took = float(re.search(r"after ([\d.]+) s", report["ended"]).group(1))
        assert took < cut + limit + 30, report["ended"]
        # host1's rank prints its line too, but the cut wire cannot carry it to mpiexec: that
        # it ended by its own limit shows in how soon after the job its host was empty
        left = re.search(r"left: nothing in the hosts' namespaces \(the last process ended "
                         r"([\d.]+) s after the job\)", report["left"])
        assert left and float(left.group(1)) < 30, out[-4000:]
        assert "ignored SIGTERM" not in out, out[-4000:]
        after = what_hosts_leave()
        after["net_namespaces"] -= before["net_namespaces"]
        before["net_namespaces"] = set()
        assert after == before
