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
import csv
import fnmatch
import glob
import itertools
import os
import re
import statistics

from tests.helpers import FAULTS_TABLE, MPI_TABLE, ROOT, doc_section, table_rows


# ---------------------------------------------------------------- links, files and tests of the docs

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
    """Every .py file of the project, relative to the root: the top level, common/,
    experiment/ and tests/."""
    top = sorted(f for f in os.listdir(ROOT) if f.endswith(".py"))
    below = [os.path.join(d, f) for d in ("common", "experiment", "tests")
             for f in sorted(os.listdir(os.path.join(ROOT, d))) if f.endswith(".py")]
    return top + below


def is_test_file(name):
    return name in ("test_all.py", "conftest.py") or name.startswith("tests" + os.sep)


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
            "of HER strategies differs from `python -m experiment.plot results/FetchPush-v4-4x2-* " \
            "--scaling FetchPush-v4 --table`"
        suite = [d for d in run_dirs if fnmatch.fnmatch(os.path.basename(d), "*-8x2-seed[0-9]")]
        if "<!-- suite table" in page:  # the page shows it once the suite's runs are in results/
            assert plot.suite_table(suite) in page, "docs/results.md's suite table differs from " \
                "`python -m experiment.plot results/*-8x2-seed[0-9] --suite --table`"

    def test_the_table_of_the_ports_differences_and_its_rank_tests_match_their_csvs(self):
        """docs/results.md's FetchPush table of the port's differences: each seed's cell is row 9
        (after 10 epochs) of its run's progress.csv, the median is over the row's seeds, the first
        epochs at 0.5 are read off the same rows, and the section's "N of M pairs ahead, p = X",
        in the table's order, are the exact rank tests of each row's seeds against this code's."""
        results = os.path.join(ROOT, "results")
        differences = os.path.join(results, "port-differences")
        groups = {  # a row's first words: its run folders (the suite's seeds 0-2 are this code's)
            "this code": glob.glob(os.path.join(results, "FetchPush-v4-8x2-seed[0-9]"))
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
                with open(os.path.join(run, "progress.csv")) as f:
                    rows_of_run = list(csv.DictReader(f))
                success[int(run[-1])] = [float(r["test/success_rate"]) for r in rows_of_run]
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
        """docs/mpi.md promises that `grep "# [MPI]"` lists every line that talks to other ranks
        and that its table names every comm method the code calls: a new call must keep both
        true."""
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
            assert f"`{method}`" in table, f"comm.{method} is not in docs/mpi.md's table of MPI calls"
        # and every row names where the call is: the function around each tagged line
        for name in (f for f in python_files() if not is_test_file(f)):
            with open(os.path.join(ROOT, name)) as f:
                source = f.read()
            tagged = {n for n, line in enumerate(source.splitlines(), start=1) if "# [MPI]" in line}
            if not tagged:
                continue
            scopes = []  # (first line, last line, Class.function)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ClassDef):
                    scopes += [(m.lineno, m.end_lineno, f"{node.name}.{m.name}") for m in node.body
                               if isinstance(m, ast.FunctionDef)]
                elif isinstance(node, ast.FunctionDef) and node.col_offset == 0:
                    scopes.append((node.lineno, node.end_lineno, node.name))
            for number in sorted(tagged):
                where = [s for s in scopes if s[0] <= number <= s[1]]
                assert where, f"{name}:{number}: an [MPI] line outside any function"
                function = min(where, key=lambda s: s[1] - s[0])[2]  # the innermost
                rows = (f"`{os.path.basename(name)}: {function}`", f"`{name}: {function}`")
                assert any(row in table for row in rows), f"docs/mpi.md's table of MPI calls " \
                    f"has no row `{os.path.basename(name)}: {function}` ({name}:{number})"

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
