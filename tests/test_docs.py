"""The documentation as a newcomer meets it: README.md fits a first read and its commands run as written, the
pages it links exist, and every `benchmarks/...` path the repository names (code comments, tests, results) is a
file or folder that exists, so moving a benchmark cannot leave a reference dangling. benchmarks/ is one folder
per question, each with a README."""
import glob
import os
import re
import shlex

import pytest

from profiling import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 300
BENCH_PATH = re.compile(r"(?<![\w/.:-])benchmarks/[\w./*-]*")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def tracked_text_files():
    """The repository's .py and .md files (the virtual environment and caches left out)."""
    skip = {".venv", ".git", "node_modules", ".bench", "profiles", "__pycache__"}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".")]
        for name in files:
            if name.endswith((".py", ".md")):
                yield os.path.relpath(os.path.join(folder, name), ROOT)


def doc_pages():
    return (["README.md"] + sorted(glob.glob("docs/*.md", root_dir=ROOT))
            + sorted(glob.glob("benchmarks/**/README.md", root_dir=ROOT, recursive=True)))


def test_readme_fits_a_first_read():
    assert len(read("README.md").splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("page", doc_pages())
def test_links_resolve(page):
    """Every relative link of the README, the docs pages and the benchmarks' READMEs names a file that exists."""
    base = os.path.dirname(os.path.join(ROOT, page))
    missing = [target for target in LINK.findall(read(page))
               if "://" not in target and not target.startswith("mailto:")
               and not os.path.exists(os.path.normpath(os.path.join(base, target)))]
    assert not missing, f"{page} links to missing files: {missing}"


def test_every_benchmarks_path_named_exists():
    """`benchmarks/<folder>/<file>` in any .py or .md file exists (a glob matches something). A path after a
    commit and a colon (`git show abc1234:benchmarks/old.py`) names history and is left alone."""
    dangling = set()
    for path in tracked_text_files():
        if path == os.path.join("tests", "test_docs.py") or path.startswith(os.path.join("tests", "data", "")):
            continue  # this file's own patterns; the foreign corpus's sources name other repositories' files
        for ref in BENCH_PATH.findall(read(path)):
            ref = ref.rstrip(".,:;*")
            if ref in ("benchmarks", "benchmarks/"):
                continue
            if not glob.glob(os.path.join(ROOT, ref)):
                dangling.add(f"{path}: {ref}")
    assert not dangling, "\n".join(sorted(dangling))


def test_benchmarks_is_one_folder_per_question():
    entries = sorted(os.listdir(os.path.join(ROOT, "benchmarks")))
    entries = [e for e in entries if e != "__pycache__"]
    folders = [e for e in entries if os.path.isdir(os.path.join(ROOT, "benchmarks", e))]
    assert len(entries) <= 11, entries
    assert set(entries) - set(folders) <= {"README.md", "common.py"}
    index = read("benchmarks/README.md")
    for folder in folders:
        assert os.path.isfile(os.path.join(ROOT, "benchmarks", folder, "README.md")), folder
        assert f"({folder}/" in index, f"benchmarks/README.md does not link {folder}/"
    assert not [p for p in glob.glob("benchmarks/**/*", root_dir=ROOT, recursive=True)
                if re.search(r"issue\d|round\d", os.path.basename(p))]


def readme_research_commands():
    """The `uv run research ...` lines of the README's fenced bash blocks, as argument lists."""
    blocks = re.findall(r"```bash\n(.*?)```", read("README.md"), re.S)
    return [shlex.split(line)[4:] for block in blocks for line in block.splitlines()
            if line.startswith("uv run research profile ")]


@pytest.mark.parametrize("argv", readme_research_commands(), ids=lambda a: " ".join(a))
def test_readme_profile_commands_run_as_written(argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["profile", *argv]) == 0
    assert "# Profile:" in capsys.readouterr().out  # after a failed check, which is printed first


def test_readme_sample_report_is_what_its_command_prints(capsys, monkeypatch):
    """The sample under "Reading a report" is the first profile command's output, trimmed: each of its lines
    (but `...`) is a line of that output."""
    readme = read("README.md")
    sample = readme.split("## Reading a report", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(ROOT)
    assert cli.main(["profile", *readme_research_commands()[0]]) == 0
    printed = set(capsys.readouterr().out.splitlines())
    missing = [line for line in sample.splitlines() if line and line != "..." and line not in printed]
    assert not missing, missing
