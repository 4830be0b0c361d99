"""
Fixed data, tokenizer, dataloader and evaluation for autoresearch. The agent never edits this file.

Usage:
    uv run prepare.py --dataset builtin                  # offline: Python's standard library as a corpus
    uv run prepare.py --dataset climbmix --num-shards 8  # the benchmark data (upstream's), over HTTPS

Scale: preset "full" (upstream's constants) is the default on a CUDA machine, "cpu" elsewhere.
AUTORESEARCH_PRESET=full|cpu picks one; AUTORESEARCH_MAX_SEQ_LEN, AUTORESEARCH_TIME_BUDGET,
AUTORESEARCH_EVAL_TOKENS and AUTORESEARCH_VOCAB_SIZE override single values. settings() is what is in
effect: runs are compared only when their settings and dataset are equal.

Cache (AUTORESEARCH_CACHE, else ~/.cache/autoresearch):
    active.json                    the dataset train.py uses: the last one prepared
    <dataset>/manifest.json        train shards and the pinned validation shard
    <dataset>/shard_NNNNN.parquet  one `text` column, one document per row
    <dataset>/tokenizer-<vocab>/   tokenizer.tiktoken (base64 token, rank per line) + tokenizer.json
Nothing here is a pickle: loading a cache never runs code from it.
"""

import argparse
import base64
import bisect
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tiktoken
import torch

# ---------------------------------------------------------------------------
# Constants (fixed; pick a scale with the environment, never by editing)
# ---------------------------------------------------------------------------

PRESETS = {
    "full": {"MAX_SEQ_LEN": 2048, "TIME_BUDGET": 300, "EVAL_TOKENS": 40 * 524288, "VOCAB_SIZE": 8192},
    "cpu": {"MAX_SEQ_LEN": 256, "TIME_BUDGET": 60, "EVAL_TOKENS": 64 * 256 * 8, "VOCAB_SIZE": 8192},
}
SPECIAL_TOKENS = ["<|bos|>", "<|reserved_1|>", "<|reserved_2|>", "<|reserved_3|>"]
BOS_TOKEN = "<|bos|>"
# BPE split pattern (GPT-4 style, with \p{N}{1,2} instead of {1,3}), as upstream
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
                 r"""|\s*[\r\n]|\s+(?!\S)|\s+""")


class PrepareError(Exception):
    """Bad input or a broken cache. The message is one line that names the fix; the CLI exits 2."""


def _positive(var, text, allow_float):
    try:
        value = float(text) if allow_float else int(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        kind = "number" if allow_float else "integer"
        raise PrepareError(f"{var}={text!r} is not a positive {kind}; fix or unset it")
    return int(value) if allow_float and value == int(value) else value


def resolve_settings(env, cuda_available):
    """The effective constants: a preset, then env overrides. `cuda_available` is only called if needed."""
    preset = env.get("AUTORESEARCH_PRESET") or ("full" if cuda_available() else "cpu")
    if preset not in PRESETS:
        raise PrepareError(f"AUTORESEARCH_PRESET={preset!r} is not a preset; use full or cpu (or unset it)")
    values = {"preset": preset, **PRESETS[preset]}
    for key in PRESETS[preset]:
        var = f"AUTORESEARCH_{key}"
        if var in env:
            values[key] = _positive(var, env[var], allow_float=key == "TIME_BUDGET")
    if values["VOCAB_SIZE"] < 256 + len(SPECIAL_TOKENS):  # 256 byte tokens + the specials
        raise PrepareError(f"AUTORESEARCH_VOCAB_SIZE={values['VOCAB_SIZE']} is too small; use at least 260")
    return values


try:
    _SETTINGS = resolve_settings(os.environ, torch.cuda.is_available)
except PrepareError as e:
    if __name__ == "__main__":
        print(f"prepare.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    raise

PRESET = _SETTINGS["preset"]
MAX_SEQ_LEN = _SETTINGS["MAX_SEQ_LEN"]  # context length (tokens)
TIME_BUDGET = _SETTINGS["TIME_BUDGET"]  # training time budget (seconds)
EVAL_TOKENS = _SETTINGS["EVAL_TOKENS"]  # validation tokens per evaluate_bpb
VOCAB_SIZE = _SETTINGS["VOCAB_SIZE"]  # tokenizer vocabulary, special tokens included


def settings():
    """The evaluation protocol in effect. Runs are comparable only when this and the dataset are equal."""
    return {"preset": PRESET, "MAX_SEQ_LEN": MAX_SEQ_LEN, "TIME_BUDGET": TIME_BUDGET,
            "EVAL_TOKENS": EVAL_TOKENS, "VOCAB_SIZE": VOCAB_SIZE}

# ---------------------------------------------------------------------------
# Configuration: cache layout and data sources
# ---------------------------------------------------------------------------

DATASETS = ("builtin", "climbmix")
BASE_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
MAX_SHARD = 6542  # climbmix's last shard is shard_06542.parquet
VAL_SHARD = MAX_SHARD  # pinned validation shard, as upstream
DEFAULT_NUM_SHARDS = 10  # training shards; the validation shard comes on top
DOWNLOAD_ATTEMPTS = 5
RETRY_BACKOFF = 1.0  # seconds before the second attempt, doubling after
ROW_GROUP_SIZE = 1024  # builtin shards: fixed layout, so the bytes are the same every time
# Upstream's packing drops what is cropped off a document, and whole source files run to ~5k tokens (a
# few to 180k): as one document per file, 78% of the tokens were thrown away at T=2048 and 95% at T=256.
BUILTIN_DOC_CHARS = 4000  # so files are cut into pieces of ~1k tokens, near web-document sizes
TOKENIZER_MAX_CHARS = 1_000_000_000  # training text for the tokenizer, as upstream
TOKENIZER_DOC_CAP = 10_000  # characters used from each document, as upstream


def cache_dir():
    """Read at every call (not import), so tests and tools can point AUTORESEARCH_CACHE elsewhere."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "autoresearch")
    return os.environ.get("AUTORESEARCH_CACHE") or default


CACHE_DIR = cache_dir()  # as at import; functions call cache_dir()


def shard_name(index):
    return f"shard_{index:05d}.parquet"


def dataset_dir(name, cache=None):
    return os.path.join(cache or cache_dir(), name)


def read_manifest(name, cache=None):
    """The dataset's manifest ({"train": [...], "val": ...}), or None when it is not prepared."""
    path = os.path.join(dataset_dir(name, cache), "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        if isinstance(manifest["train"], list) and isinstance(manifest["val"], str):
            return manifest
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        pass
    raise PrepareError(f"{path} is corrupt; {_fix(name, dataset_dir(name, cache))}")


def active_dataset(cache=None):
    """The active prepared dataset (the last one prepared), or None when nothing is prepared."""
    path = os.path.join(cache or cache_dir(), "active.json")
    try:
        with open(path, encoding="utf-8") as f:
            name = json.load(f)["dataset"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        raise PrepareError(f"{path} is corrupt; rerun {_rerun('builtin')} (or climbmix)") from None
    return name if name in DATASETS and read_manifest(name, cache) is not None else None


def _active_or_error(cache):
    name = active_dataset(cache)
    if name is None:
        raise PrepareError(f"no dataset prepared in {cache or cache_dir()}; run {_rerun('builtin')}")
    return name


def tokenizer_dir(name=None, vocab_size=None, cache=None):
    name = name or _active_or_error(cache)
    return os.path.join(dataset_dir(name, cache), f"tokenizer-{vocab_size or VOCAB_SIZE}")


def _rerun(name):
    return f"`uv run prepare.py --dataset {name if name in DATASETS else 'builtin'}`"


def _fix(name, path):
    return f"remove {path} and rerun {_rerun(name)}"


def _shard_fix(name, path):
    # A climbmix shard can be fetched again on its own; the builtin corpus is rebuilt whole.
    return _fix(name, path if name == "climbmix" else os.path.dirname(path))


def _one_line(e):
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _check_writable(cache):
    try:
        os.makedirs(cache, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=cache, prefix=".probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise PrepareError(f"cache directory {cache} is not writable ({e.strerror or e}); "
                           "set AUTORESEARCH_CACHE to a writable directory") from None


def _lock(cache):
    # One agent per GPU, eight per node, may all start on a fresh cache at once: one prepares, the rest wait.
    import filelock
    return filelock.FileLock(os.path.join(cache, ".prepare.lock"))

# ---------------------------------------------------------------------------
# Shards: the builtin corpus, climbmix downloads, reading
# ---------------------------------------------------------------------------

def _parquet_problem(path):
    """What keeps `path` from being a complete parquet file with a text column (reads the footer), or None."""
    try:
        names = pq.read_schema(path).names
    except FileNotFoundError:
        return "missing"
    except (OSError, pa.ArrowException) as e:
        return f"truncated or corrupt ({_one_line(e)})"
    return None if "text" in names else "without a text column"


def check_shard(path, name):
    problem = _parquet_problem(path)
    if problem:
        raise PrepareError(f"{path} is {problem}; {_shard_fix(name, path)}")


def split_text(text, max_chars=BUILTIN_DOC_CHARS):
    """Cut at blank lines (else at line ends) into pieces of at most ~max_chars; "".join(pieces) == text."""
    pieces, cur = [], ""
    for para in re.split(r"(?<=\n\n)", text):
        for part in re.split(r"(?<=\n)", para) if len(para) > max_chars else [para]:
            if cur and len(cur) + len(part) > max_chars:
                pieces.append(cur)
                cur = ""
            cur += part
    return pieces + [cur] if cur else pieces


def builtin_documents(root=None):
    """The .py files of the standard library (site-packages excluded, tests included), as documents of at
    most ~BUILTIN_DOC_CHARS, in a fixed order. Returns (path, piece index, text) tuples."""
    root = root or sysconfig.get_paths()["stdlib"]
    paths = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__")]
        paths += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".py")]
    docs = []
    for rel in sorted(paths):
        with open(os.path.join(root, rel), "rb") as f:
            text = f.read().decode("utf-8", errors="replace")  # a few test fixtures are latin-1
        pieces = [p for p in split_text(text) if p.strip()]
        docs += [(rel.replace(os.sep, "/"), i, p) for i, p in enumerate(pieces)]
    # Files in a fixed pseudo-random order (a hash of the path), pieces of a file together and in order:
    # every shard, the validation shard included, is a like mix of the library, not one corner of it
    # (test/ alone is 60%), and no file is split between train and validation but at a shard boundary.
    docs.sort(key=lambda d: (hashlib.sha256(d[0].encode()).digest(), d[1]))
    return docs


def _write_shard(path, texts):
    tmp = path + ".tmp"
    table = pa.table({"text": pa.array(texts, type=pa.string())})
    pq.write_table(table, tmp, row_group_size=ROW_GROUP_SIZE, compression="zstd", compression_level=3)
    os.replace(tmp, path)


def prepare_builtin(cache, num_shards):
    """Write the builtin corpus as num_shards training shards + 1 validation shard (skip if it is there)."""
    out = dataset_dir("builtin", cache)
    manifest = read_manifest("builtin", cache)
    if manifest is not None:
        if len(manifest["train"]) != num_shards:
            raise PrepareError(f"{out} holds {len(manifest['train'])} training shards, not {num_shards}; "
                               f"use --num-shards {len(manifest['train'])}, or {_fix('builtin', out)}")
        for f in manifest["train"] + [manifest["val"]]:
            check_shard(os.path.join(out, f), "builtin")
        print(f"builtin: {num_shards + 1} shards already prepared in {out}")
        return
    if os.path.exists(out):
        raise PrepareError(f"{out} exists but has no manifest.json; {_fix('builtin', out)}")
    t0 = time.time()
    docs = builtin_documents()
    if len(docs) < num_shards + 1:
        raise PrepareError(f"--num-shards {num_shards} is more than the {len(docs)} builtin documents allow")
    nbytes, nfiles = sum(len(text.encode()) for _, _, text in docs), len({path for path, _, _ in docs})
    tmp = out + ".tmp"  # the whole dataset appears at once, by rename, or not at all
    shutil.rmtree(tmp, ignore_errors=True)  # our own leftover from an interrupted run
    os.makedirs(tmp)
    names = [shard_name(i) for i in range(num_shards + 1)]  # the last one is pinned for validation
    for i, name in enumerate(names):
        part = docs[len(docs) * i // len(names): len(docs) * (i + 1) // len(names)]
        _write_shard(os.path.join(tmp, name), [text for _, _, text in part])
    _write_json(os.path.join(tmp, "manifest.json"), {
        "dataset": "builtin", "train": names[:-1], "val": names[-1], "documents": len(docs), "files": nfiles,
        "source": f"Python {sys.version.split()[0]} standard library .py files"})
    os.replace(tmp, out)
    print(f"builtin: {nfiles} files ({nbytes / 1e6:.1f} MB) of Python {sys.version.split()[0]}'s standard "
          f"library -> {len(docs)} documents in {len(names)} shards in {out} ({time.time() - t0:.1f}s)")


def _fetch(url, tmp):
    import requests
    with requests.get(url, stream=True, timeout=30) as r:
        r.raise_for_status()
        with open(tmp, "wb") as f:
            f.writelines(r.iter_content(chunk_size=1 << 20))


def download_shard(index, out, base_url, attempts=None, backoff=None, sleep=time.sleep):
    """Fetch one shard into `out` via <name>.tmp and a rename; retries with exponential backoff.
    Returns False when the shard was already there. Never leaves a partial shard behind."""
    import requests
    name = shard_name(index)
    path, url = os.path.join(out, name), f"{base_url.rstrip('/')}/{name}"
    tmp = path + ".tmp"
    if os.path.exists(path):
        return False
    attempts, backoff = attempts or DOWNLOAD_ATTEMPTS, RETRY_BACKOFF if backoff is None else backoff
    for attempt in range(1, attempts + 1):
        try:
            _fetch(url, tmp)
            problem = _parquet_problem(tmp)  # a dropped connection can look like a clean end of body
            if problem:
                raise OSError(f"the file received is {problem}")
            os.replace(tmp, path)
            return True
        except requests.HTTPError as e:
            status = e.response.status_code
            if status < 500 and status not in (408, 429):  # the server means it: retrying won't help
                raise PrepareError(f"{url}: HTTP {status}; check --base-url / AUTORESEARCH_BASE_URL "
                                   f"(default {BASE_URL})") from None
            last = e
        except (requests.RequestException, OSError) as e:
            last = e
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        if attempt < attempts:
            sleep(backoff * 2 ** (attempt - 1))
    raise PrepareError(f"{name}: download failed {attempts} times ({_one_line(last)}); "
                       "check the network and rerun: finished shards are kept")


def download_shards(indices, out, base_url, workers=8, **kwargs):
    """Download the missing shards in parallel, with a progress bar. Raises the first failure at the end."""
    from tqdm import tqdm
    errors = []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(indices)))) as pool, \
            tqdm(total=len(indices), unit="shard", desc="climbmix") as bar:
        futures = {pool.submit(download_shard, i, out, base_url, **kwargs): i for i in indices}
        for fut in as_completed(futures):
            try:
                fut.result()
            except PrepareError as e:
                errors.append((futures[fut], e))
            bar.update(1)
    if errors:
        _, e = min(errors, key=lambda x: x[0])
        more = f" ({len(errors) - 1} more shards failed)" if len(errors) > 1 else ""
        raise PrepareError(f"{e}{more}")


def prepare_climbmix(cache, num_shards, workers, base_url):
    """Download the first num_shards training shards + the pinned validation shard (resumable)."""
    out = dataset_dir("climbmix", cache)
    os.makedirs(out, exist_ok=True)
    wanted = list(range(min(num_shards, MAX_SHARD))) + [VAL_SHARD]
    have = [i for i in wanted if os.path.exists(os.path.join(out, shard_name(i)))]
    for i in have:
        check_shard(os.path.join(out, shard_name(i)), "climbmix")
    todo = sorted(set(wanted) - set(have))
    if todo:
        print(f"climbmix: downloading {len(todo)} shards ({len(have)} already here) from {base_url}")
        download_shards(todo, out, base_url, workers=workers)
    else:
        print(f"climbmix: all {len(wanted)} shards already downloaded in {out}")
    present = sorted(f for f in os.listdir(out) if f.startswith("shard_") and f.endswith(".parquet"))
    val = shard_name(VAL_SHARD)
    _write_json(os.path.join(out, "manifest.json"), {
        "dataset": "climbmix", "train": [f for f in present if f != val], "val": val, "source": base_url})


def _shard_paths(split, name, cache):
    manifest = read_manifest(name, cache)
    if manifest is None:
        raise PrepareError(f"dataset {name} is not prepared in {cache or cache_dir()}; run {_rerun(name)}")
    files = manifest["train"] if split == "train" else [manifest["val"]]
    return [os.path.join(dataset_dir(name, cache), f) for f in files]


def _read_texts(path, name):
    """The documents of one shard, a row group at a time; a broken shard is a PrepareError, not a crash."""
    try:
        pf = pq.ParquetFile(path)
        for i in range(pf.num_row_groups):
            yield pf.read_row_group(i, columns=["text"]).column("text").to_pylist()
    except (OSError, pa.ArrowException, KeyError) as e:
        raise PrepareError(f"{path} is unreadable ({_one_line(e)}); {_shard_fix(name, path)}") from None


def document_batches(split, name=None, cache=None, batch_size=128):
    """Endless (documents, epoch) batches from the split's shards, in order; epoch counts from 1."""
    assert split in ("train", "val"), split
    name = name or _active_or_error(cache)
    paths = _shard_paths(split, name, cache)
    epoch = 1
    while True:
        for path in paths:
            for texts in _read_texts(path, name):
                for i in range(0, len(texts), batch_size):
                    yield texts[i:i + batch_size], epoch
        epoch += 1

# ---------------------------------------------------------------------------
# Tokenizer: trained with rustbpe, used through tiktoken, stored as plain text
# ---------------------------------------------------------------------------

ROUNDTRIP_SAMPLES = [
    "Hello world! Numbers: 123. Unicode: 你好", "", " ", "\n\n\t  \r\n", "emoji 🙂👍🏽 👩‍👩‍👧 flags 🇫🇷",
    "日本語のテキスト、中文文本，한국어", "café naïve Ελληνικά русский עברית العربية", "<|bos|> is text here",
    "def f(x):\n    return x ** 2  # tabs\t\tand    spaces   \n",
]


class Tokenizer:
    """A byte-level BPE over tiktoken: BOS plus reserved special tokens after the learned ranks."""

    def __init__(self, pattern, mergeable_ranks, special_tokens):
        self.pattern, self.ranks, self.special_tokens = pattern, mergeable_ranks, dict(special_tokens)
        self.enc = tiktoken.Encoding(name="autoresearch", pat_str=pattern, mergeable_ranks=mergeable_ranks,
                                     special_tokens=self.special_tokens)
        self.bos_token_id = self.special_tokens[BOS_TOKEN]

    @classmethod
    def from_directory(cls, path=None):
        """Load a saved tokenizer; None means the active dataset's tokenizer for VOCAB_SIZE."""
        path = path or tokenizer_dir()
        name = os.path.basename(os.path.dirname(os.path.abspath(path)))
        fix = _fix(name, path)
        if not os.path.isdir(path):
            raise PrepareError(f"no tokenizer at {path}; run {_rerun(name)}")
        try:
            with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
                meta = json.load(f)
            with open(os.path.join(path, "tokenizer.tiktoken"), "rb") as f:
                text = f.read()
            if hashlib.sha256(text).hexdigest() != meta["ranks_sha256"]:
                raise ValueError("tokenizer.tiktoken does not match its checksum")
            ranks = _parse_ranks(text)
            return cls(meta["pattern"], ranks, meta["special_tokens"])
        except FileNotFoundError as e:
            raise PrepareError(f"{path}: {os.path.basename(e.filename)} is missing; {fix}") from None
        except (ValueError, KeyError, TypeError) as e:
            raise PrepareError(f"tokenizer at {path} is corrupt ({_one_line(e)}); {fix}") from None

    def save(self, path):
        """Write tokenizer.tiktoken (tiktoken's format) and tokenizer.json; the directory appears whole."""
        tmp = path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # our own leftover from an interrupted run
        os.makedirs(tmp)
        lines = "".join(f"{base64.b64encode(tok).decode()} {rank}\n"
                        for tok, rank in sorted(self.ranks.items(), key=lambda kv: kv[1]))
        with open(os.path.join(tmp, "tokenizer.tiktoken"), "w", encoding="ascii") as f:
            f.write(lines)
        _write_json(os.path.join(tmp, "tokenizer.json"), {
            "pattern": self.pattern, "special_tokens": self.special_tokens, "bos_token": BOS_TOKEN,
            "vocab_size": self.get_vocab_size(), "ranks_sha256": hashlib.sha256(lines.encode()).hexdigest()})
        os.replace(tmp, path)

    def get_vocab_size(self):
        return self.enc.n_vocab

    def get_bos_token_id(self):
        return self.bos_token_id

    def encode(self, text, prepend=None, num_threads=8):
        """str -> list[int]; list[str] -> list[list[int]]. Special-token text is encoded as plain text."""
        if isinstance(prepend, str):
            prepend = self.enc.encode_single_token(prepend)
        if isinstance(text, str):
            ids = self.enc.encode_ordinary(text)
            return ids if prepend is None else [prepend] + ids
        if isinstance(text, list):
            rows = self.enc.encode_ordinary_batch(text, num_threads=num_threads)
            return rows if prepend is None else [[prepend] + ids for ids in rows]
        raise TypeError(f"encode takes a str or a list of str, not {type(text).__name__}")

    def decode(self, ids):
        return self.enc.decode(ids)

    def token_bytes(self, device="cpu"):
        """UTF-8 byte length of every token id; 0 for special tokens (so evaluate_bpb skips them)."""
        lengths = torch.zeros(self.get_vocab_size(), dtype=torch.int32)
        for tok, rank in self.ranks.items():
            lengths[rank] = len(tok)
        return lengths.to(device)


def _parse_ranks(data):
    ranks = {}
    for line in data.decode("ascii").splitlines():
        tok, rank = line.split()
        ranks[base64.b64decode(tok, validate=True)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) < 256:
        raise ValueError("tokenizer.tiktoken ranks are not 0..n-1")
    return ranks


def get_token_bytes(device="cpu"):
    """Token byte lengths of the active tokenizer (see Tokenizer.token_bytes)."""
    return Tokenizer.from_directory().token_bytes(device)


def check_roundtrip(tokenizer, samples):
    """decode(encode(s)) == s for every sample, or PrepareError."""
    for i, (text, ids) in enumerate(zip(samples, tokenizer.encode(list(samples)))):
        if tokenizer.decode(ids) != text:
            raise PrepareError(f"tokenizer round-trip failed on sample {i} ({text[:40]!r}); "
                               "the tokenizer was not saved: report this as a bug")


def _training_texts(name, cache, max_chars, doc_cap):
    nchars = 0
    for path in _shard_paths("train", name, cache):
        for texts in _read_texts(path, name):
            for text in texts:
                yield text[:doc_cap]
                nchars += min(len(text), doc_cap)
                if nchars >= max_chars:
                    return


def train_tokenizer(name, vocab_size=None, cache=None, max_chars=TOKENIZER_MAX_CHARS):
    """Train a BPE on the training shards, check it round-trips, save it. Returns the Tokenizer."""
    try:
        import rustbpe  # only here: a machine that only trains (with a prepared cache) needs no rustbpe
    except ImportError:
        raise PrepareError("rustbpe is not installed; run `uv run prepare.py --dataset ...` where the "
                           "project is installed") from None
    vocab_size = vocab_size or VOCAB_SIZE
    t0 = time.time()
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(_training_texts(name, cache, max_chars, TOKENIZER_DOC_CAP),
                            vocab_size - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN)
    ranks = {bytes(tok): rank for tok, rank in bpe.get_mergeable_ranks()}
    if len(ranks) != vocab_size - len(SPECIAL_TOKENS):
        got = len(ranks) + len(SPECIAL_TOKENS)
        raise PrepareError(f"the {name} training text only yields {got} tokens, not {vocab_size}; "
                           "lower AUTORESEARCH_VOCAB_SIZE or prepare more shards")
    tokenizer = Tokenizer(bpe.get_pattern(), ranks, {s: len(ranks) + i for i, s in enumerate(SPECIAL_TOKENS)})
    val = next(_read_texts(_shard_paths("val", name, cache)[0], name))[:64]
    check_roundtrip(tokenizer, ROUNDTRIP_SAMPLES + val)
    tokenizer.save(tokenizer_dir(name, vocab_size, cache))
    print(f"tokenizer: {vocab_size} tokens trained on {name} in {time.time() - t0:.1f}s; round-trip ok")
    return tokenizer

# ---------------------------------------------------------------------------
# Preparation: what the CLI and train.py call
# ---------------------------------------------------------------------------

def prepare(name, num_shards=None, download_workers=8, base_url=None, cache=None, vocab_size=None):
    """Make dataset `name` and its tokenizer ready (resumable; fast when all is there) and make it active."""
    num_shards = DEFAULT_NUM_SHARDS if num_shards is None else num_shards
    if name not in DATASETS:
        raise PrepareError(f"unknown dataset {name!r}; use --dataset builtin (offline) or --dataset climbmix")
    if not isinstance(num_shards, int) or num_shards < 1:
        raise PrepareError(f"--num-shards must be a positive number of training shards, not {num_shards}")
    if name == "climbmix" and num_shards > MAX_SHARD:
        raise PrepareError(f"--num-shards {num_shards}: climbmix has {MAX_SHARD} training shards at most")
    if download_workers < 1:
        raise PrepareError(f"--download-workers must be at least 1, not {download_workers}")
    cache, vocab_size = cache or cache_dir(), vocab_size or VOCAB_SIZE
    _check_writable(cache)
    with _lock(cache):
        if name == "builtin":
            prepare_builtin(cache, num_shards)
        else:
            base_url = base_url or os.environ.get("AUTORESEARCH_BASE_URL") or BASE_URL
            prepare_climbmix(cache, num_shards, download_workers, base_url)
        path = tokenizer_dir(name, vocab_size, cache)
        if os.path.exists(path):
            Tokenizer.from_directory(path)  # raises if it is broken
            print(f"tokenizer: {vocab_size} tokens already trained in {path}")
        else:
            train_tokenizer(name, vocab_size, cache)
        _write_json(os.path.join(cache, "active.json"), {"dataset": name})
    return name


def ensure_data(cache=None):
    """The active dataset's name, preparing the offline builtin corpus first when nothing is prepared."""
    cache = cache or cache_dir()
    name = active_dataset(cache)
    if name is None:
        print(f"prepare: no dataset in {cache}; preparing the offline builtin corpus "
              "(for the benchmark data run `uv run prepare.py --dataset climbmix`)")
        return prepare("builtin", cache=cache)
    for path in _shard_paths("train", name, cache) + _shard_paths("val", name, cache):
        if not os.path.exists(path):
            raise PrepareError(f"{path} is missing; {_shard_fix(name, path)}")
    if not os.path.exists(tokenizer_dir(name, cache=cache)):
        with _lock(cache):
            if not os.path.exists(tokenizer_dir(name, cache=cache)):  # another process may have done it
                print(f"prepare: training a {VOCAB_SIZE}-token tokenizer for {name}")
                train_tokenizer(name, VOCAB_SIZE, cache)
    return name

# ---------------------------------------------------------------------------
# Runtime: dataloader and evaluation (imported by train.py)
# ---------------------------------------------------------------------------

def best_fit_rows(token_batches, B, row_len, buffer_size=1000):
    """Endless ([B, row_len] int64 array, epoch) from endless (token lists, epoch) batches.

    Best-fit packing as upstream: each row is filled with the longest buffered document that fits the
    space left; when none fits, the shortest is cropped to fill the row exactly. Ties go to the document
    buffered first. The buffer is kept sorted by (length, arrival), so a choice is a bisect, not a scan."""
    keys, docs, serial, epoch = [], {}, 0, 1
    while True:
        flat = []
        for _ in range(B):
            pos = 0
            while pos < row_len:
                while len(keys) < buffer_size:
                    token_lists, epoch = next(token_batches)
                    for ids in token_lists:
                        bisect.insort(keys, (len(ids), serial))
                        docs[serial] = ids
                        serial += 1
                remaining = row_len - pos
                i = bisect.bisect_right(keys, (remaining, math.inf))
                if i > 0:  # longest that fits; the first buffered among equals
                    _, s = keys.pop(bisect.bisect_left(keys, (keys[i - 1][0], -1)))
                else:  # nothing fits: crop the shortest
                    _, s = keys.pop(0)
                ids = docs.pop(s)[:remaining]
                flat.extend(ids)
                pos += len(ids)
        yield np.array(flat, dtype=np.int64).reshape(B, row_len), epoch


def packed_batches(tokenizer, B, T, split, dataset=None, cache=None, buffer_size=1000, shard=(0, 1)):
    """Endless (pair, epoch): pair is a [2, B, T] int64 array, inputs then targets (shifted by one within a
    row of T + 1 tokens). The loader's whole host work: read shards, tokenize, pack. Runs in its worker.

    shard (k, N), for rank k of N: training reads documents k, k+N, ... of the split (disjoint shares,
    each rank tokenizing only its own); validation yields batches k, k+N, ... of the one validation stream,
    so the ranks' batches together are exactly one process's (evaluate_bpb's metric does not change)."""
    k, n = shard
    bos = tokenizer.get_bos_token_id()
    batches = document_batches(split, dataset, cache)
    if split == "train" and n > 1:
        batches = ((texts[k::n], epoch) for texts, epoch in batches)
    token_batches = ((tokenizer.encode(texts, prepend=bos), epoch) for texts, epoch in batches)
    packed = best_fit_rows(token_batches, B, T + 1, buffer_size)
    if split == "val" and n > 1:
        packed = itertools.islice(packed, k, None, n)
    for rows, epoch in packed:
        yield np.stack((rows[:, :-1], rows[:, 1:])), epoch


def this_rank():
    """(rank, world size) of this process under torch.distributed (torchrun); (0, 1) otherwise."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class _Packed(torch.utils.data.IterableDataset):
    """packed_batches for a DataLoader worker. A PrepareError becomes an item, so the main process raises it
    with its own one-line message instead of the worker's traceback."""

    def __init__(self, *args):
        super().__init__()
        self.args = args

    def __iter__(self):
        try:
            yield from packed_batches(*self.args)
        except PrepareError as e:
            yield str(e), None


LOADER_DEPTH = 4  # batches made ahead: the worker makes one in ~120-190 ms at B=128, T=2048 on 2 cores
                  # (benchmarks/input_pipeline/dataloader_results.md), a step consumes two in ~300 ms on an
                  # H100


def make_dataloader(tokenizer, B, T, split, device="cpu", buffer_size=1000, dataset=None, cache=None,
                    shard=None):
    """Endless (inputs, targets, epoch): LongTensors [B, T] on `device`, every row starting with BOS,
    targets shifted by one within a row of T + 1 tokens. No padding. split is "train" or "val". Under
    torchrun each rank gets its own share (packed_batches' shard; default: this process's rank).

    The batches are made ahead in one worker process (torch's DataLoader: reading, tokenizing and packing
    hold the GIL in part, so a thread would compete with the training loop's kernel launches), LOADER_DEPTH
    deep, and pinned in the background on CUDA; next() takes a ready batch and starts its copy. One worker,
    so the order is packed_batches' exactly. The worker ends with the loader (or within seconds of its
    parent's death)."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    device = torch.device(device)
    context = "fork" if sys.platform == "linux" else None  # no re-import of train.py in the worker
    loader = torch.utils.data.DataLoader(
        _Packed(tokenizer, B, T, split, dataset, cache, buffer_size, shard or this_rank()), batch_size=None, num_workers=1,
        prefetch_factor=LOADER_DEPTH, pin_memory=device.type == "cuda", multiprocessing_context=context)
    for pair, epoch in loader:
        if epoch is None:
            raise PrepareError(pair)
        # pinned memory from torch's caching host allocator is not reused before the copy reading it is done
        pair = pair.to(device, non_blocking=True)
        yield pair[0], pair[1], epoch

# ---------------------------------------------------------------------------
# Evaluation (DO NOT CHANGE: this is the fixed metric)
# ---------------------------------------------------------------------------

@torch.no_grad()
def evaluate_bpb(model, tokenizer, batch_size):
    """Bits per byte on the validation shard: summed per-token cross-entropy (nats) over the summed UTF-8
    bytes of the target tokens, over ln 2. Targets that are special tokens (0 bytes) count in neither sum.
    Independent of the vocabulary size; uses MAX_SEQ_LEN and EVAL_TOKENS so runs stay comparable. Under
    torchrun the ranks split the same batches between them and add up their sums: the same metric."""
    device = next(model.parameters()).device
    token_bytes = tokenizer.token_bytes(device)
    rank, world = this_rank()
    val_loader = make_dataloader(tokenizer, batch_size, MAX_SEQ_LEN, "val", device=device, shard=(rank, world))
    steps = max(1, EVAL_TOKENS // (batch_size * MAX_SEQ_LEN))
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # nats, bytes
    for _ in range(rank, steps, world):  # this rank's batches: rank, rank + world, ...
        x, y, _ = next(val_loader)
        loss = model(x, y, reduction="none").reshape(-1).float()
        nbytes = token_bytes[y.reshape(-1)]
        sums[0] += (loss * (nbytes > 0)).sum(dtype=torch.float64)
        sums[1] += nbytes.sum(dtype=torch.float64)
    if world > 1:
        torch.distributed.all_reduce(sums)
    total_nats, total_bytes = sums.tolist()
    return total_nats / (math.log(2) * total_bytes)

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, instead of usage + error
        self.exit(2, f"prepare.py: error: {message} (see --help)\n")


def _parser():
    p = _Parser(prog="prepare.py", description="Prepare a dataset and its tokenizer for autoresearch, and "
                "make it the active one. Cache: AUTORESEARCH_CACHE or ~/.cache/autoresearch.")
    p.add_argument("--dataset", required=True, metavar="{builtin,climbmix}",
                   help="builtin: offline, the running Python's standard library; "
                   "climbmix: the benchmark data, downloaded")
    p.add_argument("--num-shards", type=int, default=None, metavar="N",
                   help=f"training shards (default {DEFAULT_NUM_SHARDS}); the validation shard comes on top")
    p.add_argument("--download-workers", type=int, default=8, metavar="N",
                   help="parallel downloads (climbmix; default 8)")
    p.add_argument("--base-url", default=None, metavar="URL",
                   help=f"climbmix mirror (default AUTORESEARCH_BASE_URL or {BASE_URL})")
    return p


def main(argv=None):
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed
        return e.code
    t0 = time.time()
    try:
        print(f"cache: {cache_dir()}")
        name = prepare(args.dataset, args.num_shards, args.download_workers, args.base_url)
    except PrepareError as e:
        print(f"prepare.py: error: {e}", file=sys.stderr)
        return 2
    print(f"ready: dataset {name} is active ({time.time() - t0:.1f}s); settings {json.dumps(settings())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
