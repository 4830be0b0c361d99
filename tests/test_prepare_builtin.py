"""The offline builtin corpus, ensure_data, the CLI, and bad input (one line, exit 2, nothing deleted)."""
import json
import os

import pyarrow.parquet as pq
import pytest

import prepare
from prepare import PrepareError, main


def listing(root):
    """Every file under root with its size, to show that nothing was deleted or changed."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = os.path.getsize(p)
    return out


def one_line_error(capsys, argv, *expect):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prepare.py: error: ") and "\n" not in err, err
    for text in expect:
        assert text in err, err
    return err

# ---------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------

def test_split_text_is_lossless_and_bounded():
    text = "".join(f"def f{i}():\n    return {i}\n\n" for i in range(400)) + "x" * 9000 + "\nend\n"
    pieces = prepare.split_text(text, max_chars=500)
    assert "".join(pieces) == text and len(pieces) > 10
    assert all(len(p) <= 500 for p in pieces if "xxx" not in p)  # one over-long line stays whole
    assert all(p.startswith("def ") for p in pieces[1:-2])  # cut at blank lines
    assert prepare.split_text("") == [] and prepare.split_text("a\n\nb") == ["a\n\nb"]


def test_builtin_documents_cover_the_stdlib(prepared_cache):
    docs = prepare.builtin_documents()
    paths = {p for p, _, _ in docs}
    assert "os.py" in paths and "json/decoder.py" in paths and "test/test_os.py" in paths
    assert not any("site-packages" in p for p in paths)
    assert all(0 < len(t) and t.strip() for _, _, t in docs)
    pieces = [t for p, _, t in docs if p == "os.py"]
    with open(os.path.join(os.path.dirname(os.__file__), "os.py"), encoding="utf-8") as f:
        assert "".join(pieces) == f.read()
    manifest = prepare.read_manifest("builtin", prepared_cache)
    assert manifest["documents"] == len(docs) and manifest["files"] == len(paths)


def test_layout_and_pinned_val_shard(prepared_cache):
    d = os.path.join(prepared_cache, "builtin")
    manifest = prepare.read_manifest("builtin")
    names = [prepare.shard_name(i) for i in range(prepare.DEFAULT_NUM_SHARDS + 1)]
    assert manifest["train"] == names[:-1] and manifest["val"] == names[-1]
    rows = sum(pq.ParquetFile(os.path.join(d, n)).metadata.num_rows for n in names)
    assert rows == manifest["documents"]
    assert pq.read_schema(os.path.join(d, names[0])).names == ["text"]
    with open(os.path.join(prepared_cache, "active.json")) as f:
        assert json.load(f) == {"dataset": "builtin"}
    assert prepare.active_dataset() == "builtin" and prepare.ensure_data() == "builtin"
    assert not [f for f in os.listdir(prepared_cache) if f.endswith(".tmp")]


def test_builtin_is_deterministic(tmp_path, prepared_cache, capsys):
    prepare.prepare("builtin", num_shards=4, cache=str(tmp_path / "a"), vocab_size=300)
    prepare.prepare("builtin", num_shards=4, cache=str(tmp_path / "b"), vocab_size=300)
    a, b = tmp_path / "a" / "builtin", tmp_path / "b" / "builtin"
    files = sorted(f for f in os.listdir(a) if f.endswith(".parquet"))
    assert len(files) == 5
    for f in files + ["manifest.json", "tokenizer-300/tokenizer.tiktoken", "tokenizer-300/tokenizer.json"]:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    # the same documents as the session's 11-shard build, cut differently
    texts = lambda d: [t for f in sorted(os.listdir(d)) if f.endswith(".parquet")
                       for t in pq.read_table(os.path.join(d, f)).column("text").to_pylist()]
    assert texts(a) == texts(os.path.join(prepared_cache, "builtin"))


def test_rerun_is_fast_and_says_so(prepared_cache, capsys):
    before = listing(prepared_cache)
    assert main(["--dataset", "builtin"]) == 0
    out = capsys.readouterr().out
    assert "already prepared" in out and "already trained" in out and "ready: dataset builtin" in out
    assert listing(prepared_cache) == before


def test_ensure_data_prepares_builtin_when_nothing_is_there(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    monkeypatch.setattr(prepare, "DEFAULT_NUM_SHARDS", 2)  # smaller, same code path
    monkeypatch.setattr(prepare, "VOCAB_SIZE", 300)
    assert prepare.active_dataset() is None
    assert prepare.ensure_data() == "builtin"
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert "builtin" in first and "--dataset climbmix" in first
    assert prepare.active_dataset() == "builtin"
    assert prepare.Tokenizer.from_directory().get_vocab_size() == 300
    assert prepare.ensure_data() == "builtin" and capsys.readouterr().out == ""  # quiet when ready
    # a tokenizer for another vocabulary size is trained on demand, next to the first
    monkeypatch.setattr(prepare, "VOCAB_SIZE", 280)
    assert prepare.ensure_data() == "builtin" and "tokenizer" in capsys.readouterr().out
    assert sorted(f for f in os.listdir(tmp_path / "builtin") if f.startswith("tok")) == ["tokenizer-280",
                                                                                          "tokenizer-300"]

# ---------------------------------------------------------------------------
# Bad input: a one-line error naming the fix, exit 2, nothing deleted
# ---------------------------------------------------------------------------

def test_unknown_dataset(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    one_line_error(capsys, ["--dataset", "fineweb"], "unknown dataset 'fineweb'", "--dataset builtin")
    one_line_error(capsys, [], "--dataset")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("n", ["0", "-3"])
def test_num_shards_must_be_positive(tmp_path, monkeypatch, capsys, n):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    one_line_error(capsys, ["--dataset", "builtin", "--num-shards", n], "--num-shards")
    one_line_error(capsys, ["--dataset", "climbmix", "--num-shards", n], "--num-shards")
    one_line_error(capsys, ["--dataset", "builtin", "--num-shards", "two"], "--num-shards")
    assert os.listdir(tmp_path) == []


def test_unwritable_cache(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(blocker / "cache"))  # a path under a file: even root can't
    one_line_error(capsys, ["--dataset", "builtin"], "not writable", "AUTORESEARCH_CACHE")
    assert blocker.read_text() == "mine"
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        monkeypatch.setenv("AUTORESEARCH_CACHE", str(ro))
        one_line_error(capsys, ["--dataset", "builtin"], "not writable")


@pytest.fixture
def builtin_copy(prepared_cache, tmp_path, monkeypatch):
    """A private copy of the prepared cache, safe to damage."""
    import shutil
    cache = tmp_path / "cache"
    shutil.copytree(prepared_cache, cache)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    return cache


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "missing"])
def test_broken_shard_in_the_cache(builtin_copy, capsys, damage):
    shard = builtin_copy / "builtin" / "shard_00003.parquet"
    data = shard.read_bytes()
    if damage == "truncated":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        shard.write_bytes(b"<html>rate limited</html>" * 100)
    elif damage == "empty":
        shard.write_bytes(b"")
    else:
        shard.unlink()
    before = listing(builtin_copy)
    err = one_line_error(capsys, ["--dataset", "builtin"], "shard_00003.parquet",
                         f"remove {builtin_copy / 'builtin'}", "uv run prepare.py --dataset builtin")
    assert ("missing" if damage == "missing" else "corrupt") in err
    assert listing(builtin_copy) == before
    if damage != "missing":  # reading it is a one-line PrepareError too, not a pyarrow traceback
        with pytest.raises(PrepareError, match="shard_00003.parquet is unreadable"):
            for _ in prepare.document_batches("train"):
                pass
    else:
        with pytest.raises(PrepareError, match="shard_00003.parquet is missing"):
            prepare.ensure_data()


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_broken_tokenizer_in_the_cache(builtin_copy, capsys, damage):
    ranks = builtin_copy / "builtin" / f"tokenizer-{prepare.VOCAB_SIZE}" / "tokenizer.tiktoken"
    if damage == "missing":
        ranks.unlink()
    else:
        ranks.write_bytes(ranks.read_bytes()[:-100] + b"\x00garbage")
    before = listing(builtin_copy)
    one_line_error(capsys, ["--dataset", "builtin"], "tokenizer", f"remove {ranks.parent}",
                   "uv run prepare.py --dataset builtin")
    assert listing(builtin_copy) == before
    with pytest.raises(PrepareError, match="remove"):
        prepare.Tokenizer.from_directory()


def test_foreign_directory_is_not_overwritten(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    (tmp_path / "builtin").mkdir()
    (tmp_path / "builtin" / "notes.txt").write_text("mine")
    one_line_error(capsys, ["--dataset", "builtin"], "no manifest.json", "remove")
    assert (tmp_path / "builtin" / "notes.txt").read_text() == "mine"


def test_other_shard_count_is_refused(builtin_copy, capsys):
    one_line_error(capsys, ["--dataset", "builtin", "--num-shards", "3"], "holds 10 training shards",
                   "--num-shards 10")


def test_corrupt_active_file(builtin_copy, capsys):
    (builtin_copy / "active.json").write_text("{")
    with pytest.raises(PrepareError, match="active.json is corrupt"):
        prepare.ensure_data()
    assert main(["--dataset", "builtin"]) == 0  # preparing rewrites it
    assert prepare.ensure_data() == "builtin"
