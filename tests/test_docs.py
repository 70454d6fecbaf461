"""The docs against the code and results/: README.md and docs/*.md hold what they say.

No baselines counterpart: docs/results.md's tables are what experiment/plot.py makes of the
committed CSVs in results/, and its table of the port's differences and the rank tests beside
it are those CSVs' numbers; docs/mpi.md's table "Every call that crosses ranks" names every comm
method the code calls and the function around every `# [MPI]` line, and every such line is
tagged; docs/faults.md's table names only tests that exist; every relative link and #anchor
of README.md and docs/*.md resolves.

Run: `python -m pytest -q tests/test_docs.py` (from the repository's root).
"""
import ast
import fnmatch
import glob
import itertools
import os
import re
import statistics
import subprocess

import numpy as np
import pytest

from harness.runfolder import read_progress
from tests.helpers import FAULTS_TABLE, MPI_TABLE, ROOT, doc_section, table_rows

# -------------------------------------------------------- links, files and tests of the docs

def markdown_links(text):
    """The targets of the [text](target) links and ![alt](target) images of a markdown page,
    outside code blocks and code spans."""
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.M | re.S)  # code blocks
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans
    return re.findall(r"\]\(([^()\s]+)\)", text)


def heading_anchors(text):
    """The anchors GitHub makes of a page's headings: lowercase; every character other than a
    letter, digit, space, hyphen or underscore dropped; spaces to hyphens."""
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.M | re.S)
    headings = re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(page):
    """'page: target (why)' for every relative link of a markdown page that does not resolve."""
    with open(page) as f:
        text = f.read()
    broken = []
    for target in markdown_links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not relative
            continue
        path, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(linked):
            broken.append(f"{page}: {target} (no file {linked})")
        elif anchor:
            if not linked.endswith(".md"):
                broken.append(f"{page}: {target} (an anchor into a file that is not markdown)")
                continue
            with open(linked) as f:
                anchors = heading_anchors(f.read())
            if anchor not in anchors:
                broken.append(f"{page}: {target} (no heading #{anchor} in {linked})")
    return broken



def python_files():
    """Every .py file of the project, relative to the root: the top level, harness/,
    experiment/ and tests/."""
    top = sorted(f for f in os.listdir(ROOT) if f.endswith(".py"))
    below = [os.path.join(d, f) for d in ("harness", "experiment", "tests")
             for f in sorted(os.listdir(os.path.join(ROOT, d))) if f.endswith(".py")]
    return top + below


# Receivers of the calls whose method name is collective in one class and not in another, or a
# container's own method: whether each is the collective one (DDPG.store_episode, MpiAdam.update)
# or not (ReplayBuffer.store_episode, Normalizer.update, tqdm's, a dict's or a set's update).
COLLECTIVE_RECEIVERS = {
    "store_episode": {"policy": True, "self.buffer": False, "self.demo_buffer": False,
                      "buf": False},
    "update": {"self.Q_adam": True, "self.pi_adam": True, "policy.Q_adam": True, "adam": True,
               "self.o_stats": False, "self.g_stats": False, "self.bar": False,
               "arrays": False, "in_use": False, "unique": False, "digest": False},
}


def collective_functions(trees):
    """({names of functions, methods and classes whose docstring says Collective}, {the same of
    the rest}); a class's own name stands for its constructor."""
    collective, local = set(), set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                says = "Collective" in (ast.get_docstring(node) or "")
                (collective if says else local).add(node.name)
    return collective, local


def is_collective_call(call, file_name, tree, collective, local):
    """Whether `call` (an ast.Call in file_name's tree) calls a collective function."""
    func = call.func
    if isinstance(func, ast.Name):
        # a bare name: this file's own function, or one it imports by that name
        own = {n.name: "Collective" in (ast.get_docstring(n) or "") for n in tree.body
               if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                    for a in n.names}
        if func.id in own:
            return own[func.id]
        return func.id in imported and func.id in collective
    if not isinstance(func, ast.Attribute) or func.attr not in collective:
        return False
    if func.attr not in COLLECTIVE_RECEIVERS and func.attr not in local:
        return True
    receiver = ast.unparse(func.value)
    kinds = COLLECTIVE_RECEIVERS.get(func.attr, {})
    assert receiver in kinds, (f"{file_name}:{call.lineno}: {receiver}.{func.attr}() is "
                               f"ambiguous: add {receiver!r} to COLLECTIVE_RECEIVERS")
    return kinds[receiver]


def is_test_file(name):
    return name == "test_all.py" or name.startswith("tests" + os.sep)


def suite_test_names():
    """The name of every test function of test_all.py and tests/test_*.py."""
    names = set()
    for name in python_files():
        if name == "test_all.py" or os.path.basename(name).startswith("test_"):
            with open(os.path.join(ROOT, name)) as f:
                tree = ast.parse(f.read())
            names |= {node.name for node in ast.walk(tree)
                      if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    return names


def rank_test_behind(a, b):
    """The exact one-sided rank test (Mann-Whitney) of values a against values b, by enumeration:
    (U, the number of pairs, p), where U counts the pairs (x in a, y in b) with x ahead, a tie
    counting 1/2, and p is the share of all splits of a + b into groups of len(a) and len(b)
    whose first group has a U no larger: how likely a group as far behind is by chance."""
    pooled = a + b

    def u(chosen):
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        return sum((x > y) + 0.5 * (x == y) for x in (pooled[i] for i in chosen) for y in rest)
    observed = u(range(len(a)))
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    return observed, len(a) * len(b), sum(u(c) <= observed for c in splits) / len(splits)


def results_dirs(*patterns):
    """The run folders under results/ that match any of the glob patterns, sorted."""
    return sorted(d for pattern in patterns
                  for d in glob.glob(os.path.join(ROOT, "results", pattern)))


FETCH_TASKS = ("FetchPickAndPlace-v4", "FetchPush-v4", "FetchSlide-v4")


def every_run_of(task):
    """The runs docs/results.md's table of every run of `task` at 8 x 2 counts: the suite's
    seed folders, the starts that were run again, the 10-epoch controls."""
    return results_dirs(f"{task}-8x2-seed[0-9]", f"first-starts/{task}-8x2-seed[0-9]",
                        f"port-differences/control-{task}-8x2-seed[0-9]")


def git(*args, env=None):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, env=env)


# Figures docs/results.md's sentences quote, each a median of test success over epochs first to
# last of one run, printed as the page prints every figure (Python's "{:.2f}" of the stored value):
# (run folder in results/, first, last, the sentence's words with {} where the figure stands).
QUOTED_MEDIANS = [
    ("HandReach-v3-8x2-seed0", 12, 20, "(median {} over epochs 12-20,"),
    ("HandReach-v3-8x2-seed0", 21, 29, "epochs 12-20, {} over 21-29)"),
    ("HandManipulateBlockRotateZ-v1-8x2-seed0", 20, 29, "20 to 29 (median {})"),
    ("FetchSlide-v4-8x2-seed0", 20, 39, "Seed 0 does: median {} over epochs 20-39"),
    ("FetchSlide-v4-8x2-seed0", 40, 49, "epochs 20-39 and {} over 40-49, 0.62 after 50"),
]


class TestDocs:
    """README.md and docs/*.md."""

    def test_plot_tables_in_docs_results_match_committed_csvs(self):
        """docs/results.md shows the results, scaling and strategies tables that experiment/plot.py
        makes of results/, and the suite table where the page holds one."""
        from experiment import plot
        from experiment.runs import has_epochs
        results = os.path.join(ROOT, "results")
        run_dirs = sorted(os.path.join(results, d) for d in os.listdir(results)
                          if has_epochs(os.path.join(results, d)))
        assert run_dirs, "results/ holds no runs"
        with open(os.path.join(ROOT, "docs", "results.md")) as f:
            page = f.read()
        assert plot.results_table(run_dirs) in page, \
            "docs/results.md's results table differs from " \
            "`python -m experiment.plot results/* --table`"
        push = [d for d in run_dirs if fnmatch.fnmatch(os.path.basename(d),
                                                       "FetchPush-v4-*x2-seed[0-9]")]
        assert plot.scaling_table(push, "FetchPush-v4") in page, "docs/results.md's scaling " \
            "table differs from `python -m experiment.plot results/FetchPush-v4-*x2-seed[0-9] " \
            "--scaling FetchPush-v4 --table`"
        strategies = [d for d in run_dirs if os.path.basename(d).startswith("FetchPush-v4-4x2-")]
        assert plot.scaling_table(strategies, "FetchPush-v4") in page, "docs/results.md's table " \
            "of HER strategies differs from " \
            "`python -m experiment.plot results/FetchPush-v4-4x2-* --scaling FetchPush-v4 --table`"
        suite = results_dirs("*-8x2-seed[0-9]", "FetchPush-v4-19x2-seed0")
        assert plot.suite_table(suite) in page, "docs/results.md's suite table differs from " \
            "`python -m experiment.plot results/*-8x2-seed[0-9] results/FetchPush-v4-19x2-seed0 " \
            "--suite --table`"
        for task in FETCH_TASKS:
            assert plot.runs_table(every_run_of(task)) in page, f"docs/results.md's table of " \
                f"every {task} run differs from `python -m experiment.plot " \
                f"results/{task}-8x2-seed[0-9] results/first-starts/{task}-8x2-seed[0-9] " \
                f"results/port-differences/control-{task}-8x2-seed[0-9] --runs --table`"
        assert plot.gap_table(every_run_of("FetchPush-v4")) in page, "docs/results.md's table " \
            "of the gap to the port differs from `python -m experiment.plot ... --gap --table`"

    def test_the_medians_the_sentences_quote_are_the_csvs(self):
        """The medians over epochs that docs/results.md's prose quotes (QUOTED_MEDIANS), computed
        again from the committed progress.csv files; the page says which figures this holds."""
        with open(os.path.join(ROOT, "docs", "results.md")) as f:
            page = " ".join(f.read().split())
        for run, first, last, words in QUOTED_MEDIANS:
            rows = read_progress(os.path.join(ROOT, "results", run))
            success = [float(row["test/success_rate"]) for row in rows]
            figure = f"{np.median(success[first:last + 1]):.2f}"
            assert words.format(figure) in page, f"{run}, epochs {first}-{last}: {figure}"
        assert "0.73 over 21-29" in page  # 0.725, stored as 0.7250000000000001

    def test_the_headlines_name_their_runs_and_hold_their_tables_numbers(self):
        """Each Fetch task's headline in "The paper's suite" says over how many seeds (and
        which) its median (IQR) and IQM [95% CI] after 10 epochs are, and FetchPush's over how
        many runs of this code its median is: each is the count of folders in results/ and
        each number the one the tables compute, so a seed added is a headline to rewrite."""
        from experiment import plot_tables, stats
        section = doc_section("results.md", "## The paper's suite").replace("\n", " ")
        read = {}
        for task in FETCH_TASKS:
            m = re.search(rf"\*\*{task} at 8 x 2, the suite's (\d+) seeds \(([\d, ]+)\)\.\*\* "
                          r"After 10 epochs: median (\S+) \(IQR (\S+)-(\S+)\), IQM (\S+) "
                          r"\[95% CI (\S+)-(\S+)\]", section)
            assert m, f"no headline for {task}"
            runs = results_dirs(f"{task}-8x2-seed[0-9]")
            seeds = sorted(int(d.rsplit("seed", 1)[1]) for d in runs)
            assert (int(m[1]), m[2]) == (len(runs), ", ".join(map(str, seeds))), (task, m[0])
            after_10 = [plot_tables.read_run(d)["success"][9] for d in runs]
            med, q25, q75 = stats.median_iqr(after_10)
            point, lo, hi = stats.iqm_interval(after_10, n_boot=plot_tables.N_BOOT,
                                               rng=plot_tables.BOOT_SEED)
            assert list(m.groups()[2:]) == [f"{v:.2f}" for v in (med, q25, q75, point, lo, hi)]
            read[task] = m
        every = every_run_of("FetchPush-v4")
        m = re.search(r"[Oo]ver all (\d+) runs of this code at 8 x 2 \([^)]*\), the median after "
                      r"10 epochs is (\S+) \(IQR (\S+)-(\S+)\)", section)
        assert m, "no sentence over every FetchPush run"
        after_10 = [plot_tables.read_run(d)["success"][9] for d in every]
        assert int(m[1]) == len(every)
        assert list(m.groups()[1:]) == [f"{v:.2f}" for v in stats.median_iqr(after_10)]

    def test_every_patch_applies_to_the_commit_its_header_names(self, tmp_path):
        """Each results/**/*.patch opens with "Base commit: <40 hex digits>"; `git apply --check`
        of it against that commit's tree (read into a scratch index, the work tree untouched)
        succeeds. Skipped where the clone lacks the commit (a shallow clone)."""
        patches = sorted(glob.glob(os.path.join(ROOT, "results", "**", "*.patch"), recursive=True))
        assert len(patches) >= 3, patches
        if git("rev-parse", "--git-dir").returncode != 0:
            pytest.skip("not a git clone: no commit to apply the patches to")
        for patch in patches:
            with open(patch) as f:
                base = re.match(r"Base commit: ([0-9a-f]{40})\b", f.read())
            assert base, f"{patch} does not open with 'Base commit: <sha>'"
            if git("cat-file", "-e", base[1] + "^{commit}").returncode != 0:
                pytest.skip(f"commit {base[1][:7]} is not in this clone (a shallow clone?)")
            env = dict(os.environ, GIT_INDEX_FILE=str(tmp_path / "index"))
            assert git("read-tree", base[1], env=env).returncode == 0
            applied = git("apply", "--check", "--cached", patch, env=env)
            assert applied.returncode == 0, f"{patch} does not apply to {base[1][:7]}: " \
                f"{applied.stderr}"

    def test_runs_md_table_of_the_arms_holds_each_runs_commit_start_and_epoch_times(self):
        """results/RUNS.md's table of the port-differences arms: each run's commit and start as
        its log.txt records them, its code as main or the patch that rebuilds its branch, and the
        lowest and highest time/epoch_s of its epochs 0-9, rounded to the second."""
        with open(os.path.join(ROOT, "results", "RUNS.md")) as f:
            text = f.read()
        section = text[text.index("## The port-differences experiment"):]
        section = section[:section.index("\n## ")]  # this section only, not the next one's table
        rows = [cells for cells in table_rows(section)[2:]]
        assert len(rows) == 20, len(rows)
        for arm, run, code, commit, started, seconds in rows:
            folder = os.path.join(ROOT, "results", run.strip("`"))
            times = [float(r["time/epoch_s"]) for r in read_progress(folder)][:10]
            assert seconds == f"{min(times):.0f}-{max(times):.0f}", (run, seconds)
            log = os.path.join(folder, "log.txt")
            if os.path.exists(log):
                with open(log) as f:
                    first, second = f.readline(), f.readline()
                assert started == first[2:18], (run, started)
                sha = re.search(r"commit (\w{7})", second)[1]
                assert commit.split(",")[0] == sha, (run, commit)
                assert ("uncommitted" in commit) == ("uncommitted" in second), (run, commit)
            patch = {"both differences": "port-differences.patch", "this code": None,
                     "initialisation only": "port-init.patch",
                     "normaliser only": "port-normaliser.patch"}[arm]
            assert (patch or "main") in code, (run, code)

    def test_the_table_of_the_ports_differences_and_its_rank_tests_match_their_csvs(self):
        """docs/results.md's FetchPush table of the port's differences: each seed's cell is row 9
        (after 10 epochs) of its run's progress.csv, the median is over the row's seeds, the first
        epochs at 0.5 are read off the same rows, and the section's "N of M pairs ahead, p = X",
        in the table's order, are the exact rank tests of each row's seeds against this code's."""
        results = os.path.join(ROOT, "results")
        differences = os.path.join(results, "port-differences")
        groups = {  # a row's first words: its run folders (this code's: the suite's seeds 0-2
            # and the 10-epoch controls of seeds 3 and 4, run beside the arms)
            "this code": glob.glob(os.path.join(results, "FetchPush-v4-8x2-seed[0-2]"))
            + glob.glob(os.path.join(differences, "control-FetchPush-v4-8x2-seed[0-9]")),
            "both of": glob.glob(os.path.join(differences, "FetchPush-v4-8x2-seed[0-9]")),
            "PyTorch's": glob.glob(os.path.join(differences,
                                                "init-only-FetchPush-v4-8x2-seed[0-9]")),
            "the normaliser": glob.glob(os.path.join(differences,
                                                     "normaliser-only-FetchPush-v4-8x2-seed[0-9]")),
        }
        section = doc_section("results.md", "## The paper's suite")
        rows = [cells for cells in table_rows(section) if cells[0].startswith(tuple(groups))
                or cells[0].startswith("FetchPush 8 x 2, success after 10 epochs")]
        assert rows and rows[0][1:6] == [f"seed {i}" for i in range(5)], rows
        after_10 = {}
        for cells in rows[1:]:
            key = next(k for k in groups if cells[0].startswith(k))
            success = {}  # seed: test success of every epoch
            for run in groups[key]:
                success[int(run[-1])] = [float(r["test/success_rate"])
                                         for r in read_progress(run)]
            assert all(len(s) >= 10 for s in success.values()), (key, success)
            assert cells[1:6] == [f"{success[i][9]:.2f}" if i in success else "not run"
                                  for i in range(5)], (key, cells)
            after_10[key] = [success[i][9] for i in sorted(success)]
            assert cells[6] == f"{statistics.median(after_10[key]):.2f}", (key, cells)
            firsts = [next((str(e) for e, x in enumerate(success[i][:10]) if x >= 0.5), "-")
                      for i in sorted(success)]
            assert cells[7] == ", ".join(firsts), (key, cells)

        assert [k for k in after_10] == list(groups), f"the table's rows are not {list(groups)}"
        assert rank_test_behind([0., 1.], [2., 3.]) == (0., 4, 1 / 6)  # 1 split of 6 as far behind
        # each "N of M ... p = X" of the text, in the table's order: a row against this code's
        text = section.replace("\n", " ")
        given = re.findall(r"(\d+) of (?:the )?(\d+)[^;.]*?\bp = (0\.\d\d)\b", text)
        computed = []
        for key in list(groups)[1:]:
            ahead, pairs, p = rank_test_behind(after_10[key], after_10["this code"])
            computed.append((f"{ahead:g}", str(pairs), f"{p:.2f}"))
        assert given == computed, (given, computed)

    def test_every_mpi_call_is_tagged_and_in_the_docs_table(self):
        """docs/mpi.md promises that `grep "# [MPI]"` lists every line that calls a comm method
        (its tests too) and that its table names every comm method the code calls: a new call
        must keep both true."""
        table = doc_section(*MPI_TABLE)
        local = {"Get_rank", "Get_size"}  # queries: no communication
        methods = set()
        for name in python_files():
            with open(os.path.join(ROOT, name)) as f:
                for number, line in enumerate(f, start=1):
                    called = set(re.findall(r"\bcomm\.([A-Za-z_]+)\(", line))
                    methods |= called
                    if called - local:
                        assert "# [MPI]" in line, f"{name}:{number} lacks the # [MPI] tag: {line}"
        assert {"Allreduce", "Bcast", "bcast", "allgather", "Abort"} <= methods
        for method in methods:
            assert f"`{method}`" in table, \
                f"comm.{method} is not in docs/mpi.md's table of MPI calls"
        # and every row names where the call is: the function around each tagged line
        for name in (f for f in python_files() if not is_test_file(f)):
            with open(os.path.join(ROOT, name)) as f:
                source = f.read()
            tagged = {n for n, line in enumerate(source.splitlines(), start=1)
                      if "# [MPI]" in line}
            if not tagged:
                continue
            scopes = []  # (first line, last line, Class.function)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ClassDef):
                    scopes += [(m.lineno, m.end_lineno, f"{node.name}.{m.name}") for m in node.body
                               if isinstance(m, ast.FunctionDef)]
                elif isinstance(node, ast.FunctionDef) and node.col_offset == 0:
                    scopes.append((node.lineno, node.end_lineno, node.name))
            # an entry point's `if __name__ == "__main__":` block calls its main()
            scopes += [(node.lineno, node.end_lineno, "main") for node in ast.parse(source).body
                       if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
            for number in sorted(tagged):
                where = [s for s in scopes if s[0] <= number <= s[1]]
                assert where, f"{name}:{number}: an [MPI] line outside any function"
                function = min(where, key=lambda s: s[1] - s[0])[2]  # the innermost
                assert f"`{name}:{function}`" in table, f"docs/mpi.md's table of MPI calls " \
                    f"names no `{name}:{function}` ({name}:{number})"

    def test_every_call_of_a_collective_function_is_tagged(self):
        """docs/mpi.md promises that each line calling a function whose docstring says
        "Collective" carries the tag `# [MPI]` too, so that grep finds every line that can wait
        for other ranks. A call by bare name is resolved in its file (its own functions and
        what it imports by name); a method call by its name, and where classes disagree (a
        name collective in one class and not in another, or a container's own method) by its
        receiver, which COLLECTIVE_RECEIVERS must then know."""
        files = [f for f in python_files() if not is_test_file(f)]
        trees = {f: ast.parse(open(os.path.join(ROOT, f)).read()) for f in files}
        collective, local = collective_functions(trees)
        untagged = []
        for name, tree in trees.items():
            lines = open(os.path.join(ROOT, name)).read().splitlines()
            for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
                if is_collective_call(call, name, tree, collective, local) and \
                        "# [MPI]" not in lines[call.lineno - 1]:
                    untagged.append(f"{name}:{call.lineno}: {lines[call.lineno - 1].strip()}")
        assert not untagged, "calls of collective functions without # [MPI]:\n" + \
            "\n".join(untagged)
        # the check itself: an untagged call of a collective function by name and by method
        tree = ast.parse("def f():\n    \"\"\"Collective.\"\"\"\n\n\nf()\npolicy.train()\n")
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        assert all(is_collective_call(c, "x.py", tree, {"f", "train"}, set()) for c in calls)

    def test_the_flags_usage_allows_with_resume_are_cli_resume_flags(self):
        """docs/usage.md's two sentences on what --resume takes name exactly cli.RESUME_FLAGS."""
        from harness.cli import RESUME_FLAGS
        with open(os.path.join(ROOT, "docs", "usage.md")) as f:
            text = " ".join(f.read().split())
        sentences = [s for s in re.split(r"(?<=[.;])\s", text)
                     if "may be given with `--resume`" in s or "flags other than" in s]
        assert len(sentences) == 2, sentences
        for sentence in sentences:
            named = set(re.findall(r"`--(\w+)`", sentence)) - {"resume", "load_path"}
            assert named == RESUME_FLAGS, (sentence, RESUME_FLAGS)

    def test_every_relative_link_and_anchor_in_the_docs_resolves(self, tmp_path):
        """README.md and every docs/*.md: each relative link names a file that exists, and each
        #anchor a heading of that file (GitHub's rule), so pages can move without breaking."""
        docs = os.path.join(ROOT, "docs")
        pages = [os.path.join(ROOT, "README.md")] + sorted(
            os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
        assert len(pages) >= 5, pages  # README and the four pages it links to
        links = [target for page in pages for target in markdown_links(open(page).read())]
        assert any("#" in t for t in links) and any(t.startswith("../") for t in links), links
        problems = [problem for page in pages for problem in broken_links(page)]
        assert not problems, "broken links:\n" + "\n".join(problems)
        # the check itself: a page with a missing file, a missing anchor and a good link
        page = tmp_path / "page.md"
        page.write_text("# A heading: with `code`, too\n\n[ok](#a-heading-with-code-too) "
                        "[file](missing.md) [anchor](page.md#nowhere) [web](https://example.com)\n"
                        "```\n[not a link](in-a-code-block.md)\n```\n")
        assert [p.split(": ", 1)[1].split(" (")[0] for p in broken_links(str(page))] == \
            ["missing.md", "page.md#nowhere"]

    def test_every_test_the_faults_table_names_exists(self):
        """docs/faults.md's table names, for each fault, the tests that inject it: each is a test
        of the suite (test_all.py or tests/), so a test renamed or dropped is caught here."""
        rows = table_rows(doc_section(*FAULTS_TABLE))
        assert rows[0] == ["what happens", "what the program does", "test"], rows[0]
        named = {test for cells in rows[2:] for test in re.findall(r"`(test_\w+)`", cells[-1])}
        assert len(named) > 20, named
        missing = sorted(named - suite_test_names())
        assert not missing, f"docs/faults.md names tests that do not exist: {missing}"
