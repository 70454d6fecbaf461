"""The text true to the code: every name it gives exists, every numbered deviation is listed,
and the README's count of the calls per cycle is docs/mpi.md's.

No baselines counterpart. The docstrings of every Python file, README.md and docs/*.md point
at code by name (`rollout.RolloutWorker.generate_rollouts`, `DDPG.check_synced`,
mpi_util.mpi_average) and at docs/deviations.md by number ("deviation 13", "(1, 2 and 12 in
docs/deviations.md)"); a name that moved or a number that shifted would send a reader nowhere.
The pages name code one way, `folder/file.py:Class.method` (`harness/mpi_util.py:mpi_average`),
and `DDPG.train` always with "(one update)" after it, so it is not read as train.py's loop.
So: every dotted name whose first part is one of the project's modules or classes resolves
(import it, getattr each part; a class's attribute may also be one its methods set on self);
every project path named (harness/files.py) exists or is a file of baselines'; every deviation
number is an entry of docs/deviations.md, whose entries run 1, 2, ... without a gap; and the
README's sentence on what a rank sends per cycle states what docs/mpi.md's table of every
call says, what Config's defaults give, and the gradients' sizes that the default networks
have on FetchPush and FetchReach.

Run: `python -m pytest -q tests/test_docs_refs.py` (from the repository's root).
"""
import ast
import functools
import glob
import importlib
import inspect
import os
import re

import numpy as np

from actor_critic import ActorCritic
from config import Config
from tests.helpers import MPI_TABLE, ROOT, doc_section, table_rows

# Files of openai/baselines that docstrings cite where they name the counterpart of ours.
BASELINES_FILES = {"common/cmd_util.py", "common/mpi_moments.py", "common/mpi_adam.py",
                   "common/mpi_adam_optimizer.py"}
FILE_ENDINGS = ("py", "md", "npz", "npy", "csv", "json", "txt", "png", "gif", "sh", "ini", "lock")


# ---------------------------------------------------------------- the texts and what they name

def python_files():
    """The project's Python files, relative to ROOT."""
    return sorted(os.path.relpath(path, ROOT) for folder in ("", "harness", "experiment", "tests")
                  for path in glob.glob(os.path.join(ROOT, folder, "*.py")))


def docstrings(path):
    """Every module, class and function docstring of a Python file."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    return [ast.get_docstring(node, clean=False) or "" for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))]


def pages():
    """README.md and docs/*.md, relative to ROOT."""
    return ["README.md"] + sorted(os.path.relpath(p, ROOT)
                                  for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def texts():
    """(where, text) of every docstring and every page."""
    for path in python_files():
        for text in docstrings(path):
            yield path, text
    for page in pages():
        with open(os.path.join(ROOT, page)) as f:
            yield page, f.read()


@functools.lru_cache(maxsize=None)
def namespace():
    """{name: module or class} a reference may start with: every project module by its short
    and its dotted name, the packages, and every class the modules define."""
    names = {}
    for path in python_files():
        dotted = path[:-3].replace(os.sep, ".")
        if dotted.endswith("__init__"):
            continue
        module = importlib.import_module(dotted)
        names[dotted] = module
        names.setdefault(dotted.rsplit(".", 1)[-1], module)
    for package in ("harness", "experiment", "tests"):
        names[package] = importlib.import_module(package)
    for module in list(names.values()):
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module.__name__:
                names.setdefault(name, value)
    return names


def set_on_self(cls):
    """The attributes a class's methods assign to self (instance attributes)."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return set()
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store) and getattr(node.value, "id", "") == "self"}


# A dotted name not inside a path or a longer name, and not a file name.
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-])")


def unresolved(text, names):
    """The dotted names in text that start with a project module or class but do not exist."""
    bad = []
    for ref in DOTTED.findall(text):
        parts = ref.split(".")
        if parts[-1] in FILE_ENDINGS:
            continue
        start = next((i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in names), 0)
        if not start:
            continue
        obj = names[".".join(parts[:start])]
        for part in parts[start:]:
            if hasattr(obj, part):
                obj = getattr(obj, part)
            elif inspect.isclass(obj) and part in set_on_self(obj):
                obj = None  # an instance attribute: its value is not known here
                break
            else:
                bad.append(ref)
                break
    return bad


# ---------------------------------------------------------------- one way of naming code

# `folder/file.py:Class.method` (the pages' one form); a module's dotted name outside a command.
FILE_NAME = re.compile(r"(?<![\w/.-])((?:\w+/)*\w+\.py):([A-Za-z_][\w.]*)")
SPACED = re.compile(r"`(?:\w+/)*\w+\.py: [A-Za-z_][\w.]*`")


def misnamed(text, names):
    """What a page names otherwise than `folder/file.py:Class.method`: a file without its folder
    or with a name it does not define, `file.py: name` with a space, `module.name` (outside a
    `python -m` or `python -c` command), and `DDPG.train` without '(one update)' after it."""
    bad = SPACED.findall(text)
    for path, qualname in FILE_NAME.findall(text):
        if not os.path.exists(os.path.join(ROOT, path)):
            bad.append(f"{path}:{qualname} (no file {path})")
        elif unresolved(path[:-3].replace("/", ".").removesuffix(".__init__") + "." + qualname,
                        names):  # a package's __init__.py: the package's names
            bad.append(f"{path}:{qualname} (not defined there)")
    for match in DOTTED.finditer(text):
        parts = match[1].split(".")
        line = text[text.rfind("\n", 0, match.start()) + 1:match.start()]
        if parts[-1] in FILE_ENDINGS or "python -c" in line or re.search(
                r"-m\s+$", text[max(0, match.start() - 8):match.start()]):
            continue
        if any(inspect.ismodule(names.get(".".join(parts[:i]))) for i in range(1, len(parts))):
            bad.append(match[1])
    bad += [m[0] for m in re.finditer(r"DDPG\.train\b(?:\(\))?`(?! \(one update)", text)]
    return bad


# ---------------------------------------------------------------- deviations by number

def deviation_entries():
    """The numbers of docs/deviations.md's entries, in their order."""
    with open(os.path.join(ROOT, "docs", "deviations.md")) as f:
        return [int(n) for n in re.findall(r"^(\d+)\. \*\*", f.read(), flags=re.M)]


def deviation_numbers(text):
    """Every number a text gives to a deviation: 'deviation 13', 'Deviation 26', '(1, 2 and 12
    in docs/deviations.md)', 'by their number in docs/deviations.md: 4, ...; 13, ...'."""
    numbers = [int(n) for n in re.findall(r"\b[Dd]eviations? (\d+)\b", text)]
    for listed in re.findall(r"\b(\d+(?:, \d+)*(?:,? and \d+)?) (?:in|of) docs/deviations\.md",
                             text):
        numbers += [int(n) for n in re.findall(r"\d+", listed)]
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        if "by their number in docs/deviations.md:" in flat:
            rest = flat.split("by their number in docs/deviations.md:", 1)[1]
            numbers += [int(n) for n in re.findall(r"(?:^ |; )(\d+), ", rest)]
    return numbers


# ---------------------------------------------------------------- the README's calls per cycle

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4}

TRAFFIC = re.compile(
    r"Per cycle a rank sends (\d+) gradients of ([\d.]+) MB into `Allreduce` \(([\d.]+) MB: "
    r"FetchPush's networks; FetchReach's ([\d.]+) MB, ([\d.]+) MB\), "
    r"(\w+) normaliser sums and (\w+) `allgather`; every (\d+) updates \(([\d.]+) cycles\) "
    r"`DDPG.check_synced` adds its (\d+) calls; the rest comes once an epoch or a run")

# The dimensions (o, g, u) of the two tasks whose gradient sizes the README gives.
TASK_DIMS = {"FetchPush": {"o": 25, "g": 3, "u": 4}, "FetchReach": {"o": 10, "g": 3, "u": 4}}


def gradient_megabytes(dims):
    """(MB of the larger of one update's two gradients, MB of a cycle's 2 x n_batches) of the
    default networks (Config's hidden and layers) on a task of these dims: MpiAdam.update sends
    each network's flat gradient as float32."""
    ac = ActorCritic(dims, Config.hidden, Config.layers, 1.0, np.random.default_rng(0))
    sizes = [net.theta.size * np.dtype(np.float32).itemsize for net in (ac.Q, ac.pi)]
    return max(sizes) / 1e6, Config.n_batches * sum(sizes) / 1e6


def per_cycle_calls():
    """{'file.py:function': (calls per cycle, comm method)} of the rows of docs/mpi.md's table
    whose 'how often' says 'N per cycle'; and that table's check_synced row."""
    rows, check = {}, None
    for cells in table_rows(doc_section(*MPI_TABLE)):
        site = re.match(r"`(?:[\w/]+/)?(\w+\.py:[\w.]+)`", cells[0])
        if not site or len(cells) < 4:
            continue
        count = re.search(r"(\d+) per cycle", cells[2])
        if count:
            rows[site[1]] = (int(count[1]), re.match(r"`(\w+)`", cells[3])[1])
        if site[1] == "mpi_adam.py:check_same_bits":
            check = cells[2]
    return rows, check


# ---------------------------------------------------------------- the tests


class TestDocsRefs:
    """README.md, docs/*.md and every docstring: names, numbers and the README's traffic."""

    def test_every_dotted_name_of_the_code_resolves(self):
        names = namespace()
        bad = [f"{where}: {ref}" for where, text in texts() for ref in unresolved(text, names)]
        assert not bad, "names that do not exist:\n" + "\n".join(sorted(set(bad)))
        # the check itself: a missing function, a missing method, an instance attribute, a file
        made_up = ("`train.no_such_loop` and DDPG.no_such_method, but `DDPG.T`, ddpg.DDPG.train, "
                   "np.zeros, config.py and `rollout.RolloutWorker.generate_rollouts` are fine")
        assert unresolved(made_up, names) == ["train.no_such_loop", "DDPG.no_such_method"]

    def test_the_pages_name_code_one_way(self):
        names = namespace()
        bad = [f"{page}: {ref}" for page in pages()
               for ref in misnamed(open(os.path.join(ROOT, page)).read(), names)]
        assert not bad, "name code as `folder/file.py:Class.method`:\n" + "\n".join(bad)
        # the check itself, on each form
        made_up = ("`harness/mpi_util.py:mpi_average`, `ddpg.py:DDPG.train` (one update), "
                   "`mpi_util.py:mpi_average`, `cli.py: shared_config`, run.Run.end_epoch, "
                   "`ddpg.py:DDPG.no_such`, `DDPG.train`, python -m experiment.plot")
        assert misnamed(made_up, names) == [
            "`cli.py: shared_config`", "mpi_util.py:mpi_average (no file mpi_util.py)",
            "ddpg.py:DDPG.no_such (not defined there)", "run.Run.end_epoch", "DDPG.train`"]

    def test_every_project_path_named_exists(self):
        pattern = re.compile(r"(?<![\w/.-])((?:harness|experiment|tests)/\w+\.py)\b")
        bad = [f"{where}: {path}" for where, text in texts() for path in pattern.findall(text)
               if not os.path.exists(os.path.join(ROOT, path)) and path not in BASELINES_FILES]
        assert not bad, "files that do not exist (here or in baselines):\n" + "\n".join(bad)

    def test_every_numbered_deviation_is_an_entry_of_deviations_md(self):
        entries = deviation_entries()
        assert entries == list(range(1, len(entries) + 1)), entries  # numbered without a gap
        cited = {}
        for path in python_files():
            with open(os.path.join(ROOT, path)) as f:
                text = f.read()
            for n in deviation_numbers(text):
                cited.setdefault(n, []).append(path)
        for page in pages():
            with open(os.path.join(ROOT, page)) as f:
                for n in deviation_numbers(f.read()):
                    cited.setdefault(n, []).append(page)
        missing = {n: where for n, where in cited.items() if n not in entries}
        assert not missing, f"deviations named but not in docs/deviations.md: {missing}"
        assert len(cited) >= 10, cited  # the patterns still find the pointers
        # the check itself, on each form
        made_up = ("deviation 13; Deviation 26: (1, 2 and 12 in docs/deviations.md), 10 of "
                   "docs/deviations.md\n\nby their number in docs/deviations.md: 4, the sums;\n"
                   "13, they are; 5 standard deviations")
        assert sorted(deviation_numbers(made_up)) == [1, 2, 4, 10, 12, 13, 13, 26]

    def test_the_readme_counts_the_calls_per_cycle_of_the_mpi_table(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = " ".join(f.read().split())
        match = TRAFFIC.search(readme)
        assert match, "README.md's sentence 'Per cycle a rank sends ...' is not found"
        gradients, push_mb, push_cycle_mb, reach_mb, reach_cycle_mb, sums, allgathers, every, \
            cycles, check_calls = match.groups()
        # the sizes, as the README rounds them, of the default networks on each task
        for task, one, cycle in (("FetchPush", push_mb, push_cycle_mb),
                                 ("FetchReach", reach_mb, reach_cycle_mb)):
            got_one, got_cycle = gradient_megabytes(TASK_DIMS[task])
            assert (f"{got_one:.2f}", f"{got_cycle:.0f}") == (one, cycle), (task, got_one,
                                                                             got_cycle)
        rows, check = per_cycle_calls()
        allgather_rows = [site for site, (_, method) in rows.items() if method == "allgather"]
        assert set(rows) == {"mpi_adam.py:MpiAdam.update",
                             "normalizer.py:Normalizer.recompute_stats", *allgather_rows}, \
            f"calls per cycle the README's sentence does not count: {sorted(rows)}"
        assert int(gradients) == rows["mpi_adam.py:MpiAdam.update"][0] == 2 * Config.n_batches
        assert WORDS[sums] == rows["normalizer.py:Normalizer.recompute_stats"][0]
        assert WORDS[allgathers] == sum(rows[site][0] for site in allgather_rows)
        assert int(every) == Config.sync_check_interval
        assert float(cycles) == Config.sync_check_interval / Config.n_batches
        assert check and f"{check_calls} calls every {every} updates" in check, check
