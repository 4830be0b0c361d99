"""climbmix against a local HTTP server on 127.0.0.1: retries, dropped connections, 404s, resuming."""
import io
import os
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prepare
from prepare import PrepareError, main

WORDS = ("the of and to in is was for on that with as by at from his her they this which were be have "
         "data model token train shard server retry download parquet python corpus byte pair merge").split()
SHARDS = [prepare.shard_name(i) for i in (0, 1, 2, prepare.VAL_SHARD)]


def make_shard(seed, docs=150):
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120))).capitalize() + "."
             for _ in range(docs)]
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buf)
    return buf.getvalue()


FILES = {name: make_shard(i) for i, name in enumerate(SHARDS)}


class Server:
    """Serves FILES; `plan(name, nth_request)` returns "ok", "drop" (half the body, then hang up with a
    Content-Length promising more), "short" (half the body, no Content-Length), or an HTTP status."""

    def __init__(self):
        self.log, self.plan, server = [], (lambda name, n: "ok"), self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                server.log.append(name)
                action = server.plan(name, server.log.count(name))
                if name not in FILES or not self.path.startswith("/data/"):
                    action = 404
                if isinstance(action, int):
                    return self.send_error(action)
                data = FILES[name]
                self.send_response(200)
                if action != "short":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data if action == "ok" else data[: len(data) // 2])
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/data"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()


@pytest.fixture
def server(monkeypatch, tmp_path):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(prepare, "RETRY_BACKOFF", 0.001)
    monkeypatch.setattr(prepare, "DOWNLOAD_ATTEMPTS", 3)
    monkeypatch.setattr(prepare, "VOCAB_SIZE", 300)
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def shard_dir(tmp_path):
    return tmp_path / "cache" / "climbmix"


def run(server, capsys, *extra, shards="2"):
    code = main(["--dataset", "climbmix", "--num-shards", shards, "--base-url", server.url, *extra])
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()[-1] if err.strip() else ""


def assert_no_partial_files(d):
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]
    for f in os.listdir(d):
        if f.endswith(".parquet"):
            assert (d / f).read_bytes() == FILES[f], f


def test_server_failing_twice_then_succeeding(server, tmp_path, capsys):
    server.plan = lambda name, n: 503 if n <= 2 else "ok"
    code, out, err = run(server, capsys, "--download-workers", "3")
    assert code == 0, err
    d = shard_dir(tmp_path)
    assert sorted(f for f in os.listdir(d) if f.endswith(".parquet")) == [SHARDS[0], SHARDS[1], SHARDS[3]]
    assert_no_partial_files(d)
    assert sorted(server.log) == sorted([SHARDS[0], SHARDS[1], SHARDS[3]] * 3)
    manifest = prepare.read_manifest("climbmix")
    assert manifest["train"] == SHARDS[:2] and manifest["val"] == "shard_06542.parquet"
    assert prepare.active_dataset() == "climbmix" and "ready: dataset climbmix" in out
    tok = prepare.Tokenizer.from_directory()
    assert tok.get_vocab_size() == 300
    x, _, _ = next(prepare.make_dataloader(tok, 2, 16, "val"))
    assert (x[:, 0] == tok.get_bos_token_id()).all()


def test_backoff_doubles(server, tmp_path):
    server.plan = lambda name, n: 503 if n <= 2 else "ok"
    waits = []
    os.makedirs(tmp_path / "out")
    assert prepare.download_shard(0, str(tmp_path / "out"), server.url, attempts=4, backoff=0.5,
                                  sleep=waits.append) is True
    assert waits == [0.5, 1.0]
    assert prepare.download_shard(0, str(tmp_path / "out"), server.url) is False  # already there: no request
    assert server.log == [SHARDS[0]] * 3


@pytest.mark.parametrize("how", ["drop", "short"])
def test_dropped_connection_leaves_no_partial_shard_and_a_rerun_resumes(server, tmp_path, capsys, how):
    server.plan = lambda name, n: how if name == SHARDS[1] else "ok"
    code, _, err = run(server, capsys)
    assert code == 2
    assert err.startswith("prepare.py: error: shard_00001.parquet: download failed 3 times")
    assert "rerun" in err
    d = shard_dir(tmp_path)
    assert sorted(os.listdir(d)) == [SHARDS[0], SHARDS[3]]  # no shard_00001 and no .tmp
    assert_no_partial_files(d)
    assert prepare.active_dataset() is None
    server.log.clear()
    server.plan = lambda name, n: "ok"
    code, out, err = run(server, capsys)
    assert code == 0, err
    assert server.log == [SHARDS[1]]  # only the missing one
    assert "1 shards (2 already here)" in out
    assert_no_partial_files(d)


def test_404_is_a_clear_error_without_retries(server, tmp_path, capsys):
    code, _, err = run(server, capsys, "--base-url", server.url.replace("/data", "/nope"), shards="1")
    assert code == 2
    assert "HTTP 404" in err and "--base-url" in err and "\n" not in err
    assert sorted(server.log) == sorted([SHARDS[0], SHARDS[3]])  # one request each
    assert os.listdir(shard_dir(tmp_path)) == []


def test_base_url_from_environment_and_fast_rerun(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_BASE_URL", server.url)
    assert main(["--dataset", "climbmix", "--num-shards", "1"]) == 0
    assert sorted(server.log) == sorted([SHARDS[0], SHARDS[3]])
    capsys.readouterr()
    assert main(["--dataset", "climbmix", "--num-shards", "1"]) == 0
    out = capsys.readouterr().out
    assert "already downloaded" in out and "already trained" in out and len(server.log) == 2


def test_corrupt_shard_in_cache_is_reported_not_replaced(server, tmp_path, capsys):
    d = shard_dir(tmp_path)
    os.makedirs(d)
    (d / SHARDS[0]).write_bytes(FILES[SHARDS[0]][:-50])  # truncated by something else
    code, _, err = run(server, capsys, shards="1")
    assert code == 2
    assert f"remove {d / SHARDS[0]}" in err and "--dataset climbmix" in err and "corrupt" in err
    assert (d / SHARDS[0]).read_bytes() == FILES[SHARDS[0]][:-50] and server.log == []


def test_too_many_shards(server, capsys):
    code, _, err = run(server, capsys, shards=str(prepare.MAX_SHARD + 1))
    assert code == 2 and "6542" in err and server.log == []


def test_library_raises_prepare_error(server, tmp_path):
    with pytest.raises(PrepareError, match="HTTP 404"):
        prepare.prepare("climbmix", num_shards=1, base_url=server.url.replace("/data", "/missing"))


def test_corpus_too_small_for_the_vocabulary(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(prepare, "VOCAB_SIZE", 5000)
    code, _, err = run(server, capsys)
    assert code == 2 and "AUTORESEARCH_VOCAB_SIZE" in err and "not 5000" in err
    assert not os.path.exists(shard_dir(tmp_path) / "tokenizer-5000") and prepare.active_dataset() is None
