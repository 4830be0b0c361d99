"""Rehearsal: program-alt.md's commands, run literally and in order, at a tiny CPU scale; and every `uv run`
command in the documentation parsed by the real argument parsers.

One source for the commands: program-alt.md. Its fenced code blocks whose info string starts with
`bash rehearse` are the rehearsed commands, one per line, in document order; an HTML comment
`<!-- rehearse: edit train.py -->` marks where the agent edits train.py. The test runs each line with
`bash -c` in a temp copy of the repository (a git repo, on master, like a fresh clone), as the agent would,
with only these substitutions:

- `uv run train.py`, `uv run prepare.py` -> `<this python> train.py`, `<this python> prepare.py`, and
  `uv run research` -> `<this python> -m profiling` (the console script's module): the same code run by
  the test's own interpreter, so no network and no `uv sync` are needed;
- placeholders in angle brackets are filled as the agent fills them: `<dimension>` from the `choice:` line
  of the last `research next`, `<id>` from the `logged: experiment N` line of the last `research log`, the
  others from PLACEHOLDERS below;
- the edit marker: the test changes `MATRIX_LR = 0.04` to `0.05` in the copy's train.py (never the real one);
- a block tagged `unless-keep` runs only when the last `research log` status was not keep, and its command
  must be the one that log's `next:` line gives.

After the last block the agent goes around the loop: the test runs the first `research next` line again.
Scale: the conftest's cpu preset and 512-token vocabulary, AUTORESEARCH_TIME_BUDGET=2,
AUTORESEARCH_MAX_SEQ_LEN=64 (a quarter of the preset's: half the CPU time of each run, which the commands and
the checks do not depend on), AUTORESEARCH_EVAL_TOKENS=4096, no GPU (CUDA_VISIBLE_DEVICES=""): three train.py
processes; the rehearsal took 67 s on an idle 2-core machine at MAX_SEQ_LEN 256 (2026-11-26; 74 s inside the
whole suite).
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "program.md", "program-alt.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
COPIED = ["train.py", "prepare.py", "kernels.py", "profiling", "experiments.json", "pyproject.toml", ".gitignore",
          "README.md", "program.md", "program-alt.md"]
PLACEHOLDERS = {
    "tag": "rehearsal",
    "what you changed": "MATRIX_LR 0.04 -> 0.05",
    "why it should help": "a larger Muon step learns more in a short budget",
    "mechanism": "a larger Muon learning rate",
    "when to retry": "with a longer warm-down",
}
SEVEN = ["optimizer", "architecture", "attention", "normalization", "schedule", "regularization", "batching"]
STEP = re.compile(r"^[ \t]*```bash rehearse(?P<tags>[^\n]*)\n(?P<body>.*?)^[ \t]*```[ \t]*$"
                  r"|<!-- rehearse: (?P<action>[^>]*?) -->", re.M | re.S)
PLACEHOLDER = re.compile(r"<([a-z][a-z ]*)>")


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def rehearsal_steps():
    """program-alt.md's [("run", command, tags) or ("action", name, ())], in document order."""
    steps = []
    for m in STEP.finditer(read("program-alt.md")):
        if m.group("action"):
            steps.append(("action", m.group("action").strip(), ()))
            continue
        for line in textwrap.dedent(m.group("body")).splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                steps.append(("run", line.strip(), tuple(m.group("tags").split())))
    return steps


def kind(step):
    """A short name for a step, to check the order of the rehearsal."""
    what, text, _ = step
    if what == "action":
        return text
    for pattern, name in [(r"uv run train\.py --profile", "profile"), (r"uv run train\.py", "run"),
                          (r"uv run research (rescue add|\w+)", None), (r"^git (\w+)", "git {}")]:
        m = re.search(pattern, text)
        if m:
            return name.format(*m.groups()) if name else m.group(1)
    return text.split()[0]


def without_uv(command):
    py = shlex.quote(sys.executable)
    for old, new in [("uv run train.py", f"{py} train.py"), ("uv run prepare.py", f"{py} prepare.py"),
                     ("uv run research", f"{py} -m profiling")]:
        command = command.replace(old, new)
    assert "uv run" not in command, f"no substitution for {command!r}"
    return command


def fill(command, values):
    def value(m):
        assert m.group(1) in values, f"nothing to fill <{m.group(1)}> with in {command!r} at this point"
        return values[m.group(1)]
    return PLACEHOLDER.sub(value, command)


def test_program_alt_rehearses_the_whole_loop():
    """The rehearsed blocks hold the loop's steps in its order (a fast check; the slow test runs them)."""
    kinds = [kind(s) for s in rehearsal_steps()]
    expected = ["git checkout", "run", "log", "next", "profile", "edit train.py", "git commit", "run", "log",
                "git reset", "rescue add", "show"]
    it = iter(kinds)
    assert all(k in it for k in expected), f"program-alt.md's rehearsed steps {kinds} miss {expected}"


# ----------------------------------------------------------------------------
# The rehearsal

@pytest.fixture
def workdir(tmp_path, prepared_cache):
    """A copy of the repository's files, committed on master, and the environment of a tiny CPU run."""
    if shutil.which("git") is None or shutil.which("bash") is None:
        pytest.skip("the rehearsal runs git and bash")
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in COPIED:
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, repo / name)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AUTORESEARCH_", "GIT_")) and k != "PYTHONPATH"}
    env.update(AUTORESEARCH_CACHE=prepared_cache, AUTORESEARCH_PRESET="cpu",
               AUTORESEARCH_VOCAB_SIZE=os.environ["AUTORESEARCH_VOCAB_SIZE"], AUTORESEARCH_TIME_BUDGET="2",
               AUTORESEARCH_MAX_SEQ_LEN="64", AUTORESEARCH_EVAL_TOKENS="4096", CUDA_VISIBLE_DEVICES="",
               GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="agent", GIT_AUTHOR_EMAIL="agent@example.com",
               GIT_COMMITTER_NAME="agent", GIT_COMMITTER_EMAIL="agent@example.com")
    for command in ["git init -q", "git symbolic-ref HEAD refs/heads/master", "git add -A",
                    "git commit -q -m 'autoresearch, as cloned'"]:
        subprocess.run(["bash", "-c", command], cwd=repo, env=env, check=True, capture_output=True)
    return repo, env


class Agent:
    """Runs commands as the agent does and keeps the transcript, to show when something fails."""

    def __init__(self, repo, env):
        self.repo, self.env, self.transcript = repo, env, []
        self.values, self.last_log = dict(PLACEHOLDERS), ""

    def run(self, command, tags=()):
        filled, t0 = fill(command, self.values), time.time()
        proc = subprocess.run(["bash", "-c", without_uv(filled)], cwd=self.repo, env=self.env,
                              capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        took = time.time() - t0
        self.transcript.append(f"$ {filled}\n[exit {proc.returncode}, {took:.1f} s]\n{out[-3000:]}")
        ok = (0, 3) if re.search(r"uv run train\.py(?! --profile)", command) else (0,)  # 3: early abort
        assert proc.returncode in ok, self.failure(f"{filled!r} exited {proc.returncode}")
        if "research next" in command:
            self.values["dimension"] = re.search(r"^choice: (\S+)$", out, re.M).group(1)
        if "research log" in command:
            self.values["id"] = re.search(r"^logged: experiment (\d+) ", out, re.M).group(1)
            self.last_log = out
        return proc.returncode, out

    def failure(self, what):
        return what + "\n\ntranscript:\n" + "\n".join(self.transcript[-6:])

    def git(self, *args):
        return subprocess.run(["git", *args], cwd=self.repo, env=self.env, capture_output=True, text=True,
                              check=True).stdout.strip()


def edit_matrix_lr(repo):
    """What the agent does at the edit marker: one hyperparameter, by hand."""
    path = repo / "train.py"
    text = path.read_text()
    assert len(re.findall(r"^MATRIX_LR = 0\.04\b", text, re.M)) == 1
    path.write_text(re.sub(r"^MATRIX_LR = 0\.04\b", "MATRIX_LR = 0.05", text, flags=re.M))


@pytest.mark.slow
def test_rehearse_program_alt(workdir):
    repo, env = workdir
    agent = Agent(repo, env)
    first_commit = agent.git("rev-parse", "--short", "HEAD")
    outputs = []  # (kind, exit code, output) of every command run
    for step in rehearsal_steps():
        what, text, tags = step
        if what == "action":
            assert text == "edit train.py", f"unknown rehearsal action {text!r}"
            edit_matrix_lr(repo)
            continue
        if "unless-keep" in tags:
            if re.search(r"^status: keep\b", agent.last_log, re.M):
                continue
            advice = re.search(r"^next: (.*)$", agent.last_log, re.M).group(1)
            assert f"`{text}`" in advice, f"program-alt.md says {text!r}; research log says {advice!r}"
        outputs.append((kind(step), *agent.run(text, tags)))
    next_command = next(t for w, t, _ in rehearsal_steps() if w == "run" and "research next" in t)
    outputs.append(("next", *agent.run(next_command)))  # back to the top of the loop

    by_kind = {}
    for k, rc, out in outputs:
        by_kind.setdefault(k, []).append((rc, out))
    # the runs: the baseline finished; the experiment ran with the gate on, against the baseline
    (rc0, _), (rc1, _) = by_kind["run"]
    assert rc0 == 0
    (_, grep0), (_, grep1) = by_kind["grep"]
    assert re.search(r"^val_bpb:\s+\d+\.\d{6}$", grep0, re.M) and re.search(r"^status:\s+ok$", grep0, re.M)
    assert re.search(r"^status:\s+(ok|early_abort)$", grep1, re.M)
    assert rc1 == (3 if "early_abort" in grep1 else 0)
    assert re.search(r"^Early-abort gate: on: reference #1 ", (repo / "run.log").read_text(), re.M)
    # the profile: the run's report, then the --profile run's, each read from profiles/latest
    reports = [out for k, rc, out in outputs if k == "cat"]
    assert len(reports) == 2 and all("## 1. Step budget" in r and "CPU profile" in r for r in reports)
    assert reports[0] != reports[1]
    # research next: the first choice is the first untried dimension; after one trial, the next untried one
    first_next, last_next = by_kind["next"][0][1], by_kind["next"][-1][1]
    assert "choice: optimizer" in first_next and "stagnation:" in first_next
    assert "choice: architecture" in last_next and re.search(r"^\| optimizer\s+\| 1 ", last_next, re.M)
    assert "added rescue entry 1 for optimizer" in by_kind["rescue add"][0][1]
    assert PLACEHOLDERS["mechanism"] in by_kind["rescue"][0][1]  # rescue list
    show = by_kind["show"][0][1]
    assert re.search(r"^\| 1 .*\| baseline .*\| keep ", show, re.M)
    assert re.search(r"^\| 2 .*\| optimizer ", show, re.M)

    # the memory: two records, valid statuses, the rescue entry, the seven dimensions
    mem = json.loads((repo / "experiments.json").read_text())
    assert mem["dimensions"] == SEVEN
    first, second = mem["experiments"]
    assert (first["id"], first["dimension"], first["status"]) == (1, "baseline", "keep")
    assert first["commit"] == first_commit
    assert second["dimension"] == "optimizer" and second["change"] == PLACEHOLDERS["what you changed"]
    assert second["status"] in ("keep", "discard", "early_abort") and second["baseline_id"] == 1
    assert second["settings"]["TIME_BUDGET"] == 2 and second["dataset"] == "builtin"
    assert os.path.isfile(repo / second["profile"] / "report.md")
    (entry,) = mem["rescue_pool"]
    assert (entry["from_experiment"], entry["dimension"]) == (2, "optimizer")

    # git: on the run's branch; a keep advanced it, anything else went back without losing the memory
    assert agent.git("rev-parse", "--abbrev-ref", "HEAD") == "autoresearch/rehearsal"
    assert agent.git("status", "--porcelain", "--", "train.py") == ""
    head_lr = "0.05" if second["status"] == "keep" else "0.04"
    assert re.search(rf"^MATRIX_LR = {head_lr}\b", (repo / "train.py").read_text(), re.M)
    assert (agent.git("rev-parse", "--short", "HEAD") == first_commit) == (second["status"] != "keep")
    assert second["commit"] != first_commit and agent.git("cat-file", "-t", second["commit"]) == "commit"


# ----------------------------------------------------------------------------
# Every documented command parses

def documented_commands(path):
    """(script, argv, inline) for each `uv run train.py|prepare.py|research ...` in a Markdown file's code
    blocks (inline False) and inline code (True), cut at the first shell operator or redirection.
    Placeholders become `x`; a schematic `...` command is skipped."""
    text = read(path)
    fence = r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```"
    snippets = [(line, False) for b in re.findall(fence, text, re.M | re.S) for line in b.splitlines()]
    prose = re.sub(fence, "", text, flags=re.M | re.S)
    snippets += [(" ".join(span.split()), True) for span in re.findall(r"`([^`]+)`", prose)]
    commands = []
    for snippet, inline in snippets:
        m = re.search(r"uv run (train\.py|prepare\.py|research)\b(.*)", snippet)
        if m and "..." not in m.group(2):
            words = shlex.split(PLACEHOLDER.sub(lambda p: "1" if p.group(1) == "id" else "x", m.group(2)),
                                 comments=True)
            cut = next((i for i, w in enumerate(words) if re.match(r"^(\d?>|<|\||&&|;)", w)), len(words))
            commands.append((m.group(1), words[:cut], inline))
    return commands


@pytest.mark.parametrize("path", DOCS)
def test_documented_commands_parse(path, capsys):
    import prepare
    from profiling import cli, runner

    parsers = {"train.py": runner.parse_args, "prepare.py": prepare._parser().parse_args,
               "research": lambda argv: cli.build_parser(argv).parse_args(argv)}
    for script, argv, inline in documented_commands(path):
        if "-h" in argv or "--help" in argv:
            continue
        try:
            parsers[script](argv)
        except SystemExit as e:
            err = capsys.readouterr().err.strip()
            if inline and "arguments are required" in err:
                continue  # prose may name a command without its required options
            pytest.fail(f"{path}: `uv run {script} {' '.join(argv)}` does not parse (exit {e.code}): {err}")


def test_readme_names_the_two_commands():
    """The main job and the test command, exactly as CI (.ci/run) runs the latter."""
    blocks = "\n".join(re.findall(r"```[^\n]*\n(.*?)```", read("README.md"), re.S))
    assert re.search(r"^uv run train\.py(\s|$)", blocks, re.M)
    assert re.search(r"^uv run pytest(\s|$)", blocks, re.M)
