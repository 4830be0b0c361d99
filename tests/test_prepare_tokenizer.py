"""Tokenizer: round trips, special tokens, byte lengths, storage without pickle, broken files."""
import json
import os
import shutil
from pathlib import Path

import pytest
import tiktoken.load

import prepare
from prepare import BOS_TOKEN, SPECIAL_TOKENS, PrepareError, Tokenizer

EDGE_CASES = [
    "", " ", "a", "\n", "\r\n", "\t\t\t", "     many   spaces     ", "\n\n\n\n", " \u00a0\u2003 ",
    "emoji 🙂👍🏽 family 👩‍👩‍👧 flag 🇫🇷 keycap 1️⃣", "日本語のテキスト", "中文文本，标点。",
    "한국어 문장", "mixed: café naïve Ελληνικά русский עברית العربية हिन्दी", "combining: e\u0301 a\u0308",
    "\u200b zero width \ufeff bom", "\x00 nul and \x7f del", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 astral 𐍈",
    "<|bos|>", "text <|bos|> around <|reserved_1|> specials <|endoftext|>",
    "def f(x):\n\treturn x ** 2  # comment\n\n\nclass A:\n    pass\n",
    "numbers 1234567890 3.14159 1e-10 0xFF", "'s 've 're 'll 'd 'm 't CAPS'S",
]


@pytest.fixture(scope="module")
def tok(prepared_cache):
    return Tokenizer.from_directory()


def test_vocab_and_bos(tok):
    assert tok.get_vocab_size() == prepare.VOCAB_SIZE
    assert tok.get_bos_token_id() == prepare.VOCAB_SIZE - len(SPECIAL_TOKENS)
    assert tok.decode([tok.get_bos_token_id()]) == BOS_TOKEN


@pytest.mark.parametrize("text", EDGE_CASES)
def test_round_trip_edge_cases(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.get_vocab_size() for i in ids)
    assert tok.decode(ids) == text


def test_empty_string_is_no_tokens(tok):
    assert tok.encode("") == []
    assert tok.encode("", prepend=BOS_TOKEN) == [tok.get_bos_token_id()]


def test_special_token_text_is_plain_text(tok):
    specials = set(range(tok.get_vocab_size() - len(SPECIAL_TOKENS), tok.get_vocab_size()))
    for text in ("<|bos|>", "a <|reserved_3|> b"):
        ids = tok.encode(text)
        assert not specials & set(ids) and tok.decode(ids) == text


def test_prepend_by_id_or_string(tok):
    bos = tok.get_bos_token_id()
    plain = tok.encode("hello world")
    assert tok.encode("hello world", prepend=bos) == [bos] + plain
    assert tok.encode("hello world", prepend=BOS_TOKEN) == [bos] + plain
    assert tok.encode("hello world", prepend="<|reserved_2|>")[0] == bos + 2


def test_batch_equals_single(tok):
    batch = tok.encode(EDGE_CASES, prepend=tok.get_bos_token_id(), num_threads=3)
    assert batch == [[tok.get_bos_token_id()] + tok.encode(t) for t in EDGE_CASES]
    with pytest.raises(TypeError):
        tok.encode(("a tuple",))


def test_token_bytes(tok):
    tb = tok.token_bytes()
    assert tb.shape == (tok.get_vocab_size(),) and not tb.dtype.is_floating_point
    assert tb[-len(SPECIAL_TOKENS):].tolist() == [0] * len(SPECIAL_TOKENS)
    assert (tb[:-len(SPECIAL_TOKENS)] > 0).all() and tb[:256].tolist() == [1] * 256
    text = "mixed: café 🙂 日本語 and code()\n"
    ids = tok.encode(text, prepend=BOS_TOKEN)
    assert int(tb[ids].sum()) == len(text.encode("utf-8"))  # BOS counts 0
    assert prepare.get_token_bytes().tolist() == tb.tolist()


def test_stored_as_plain_text_that_tiktoken_reads(tok, prepared_cache):
    path = prepare.tokenizer_dir()
    assert sorted(os.listdir(path)) == ["tokenizer.json", "tokenizer.tiktoken"]
    for root, _, files in os.walk(prepared_cache):
        assert not [f for f in files if f.endswith((".pkl", ".pickle", ".pt"))]
    ranks = tiktoken.load.load_tiktoken_bpe(os.path.join(path, "tokenizer.tiktoken"))
    assert ranks == tok.ranks
    with open(os.path.join(path, "tokenizer.json")) as f:
        meta = json.load(f)
    assert meta["special_tokens"][BOS_TOKEN] == tok.get_bos_token_id()


def test_save_and_load_give_the_same_encoding(tok, tmp_path):
    tok.save(str(tmp_path / "tokenizer-copy"))
    again = Tokenizer.from_directory(str(tmp_path / "tokenizer-copy"))
    assert again.encode(EDGE_CASES) == tok.encode(EDGE_CASES)
    assert not os.path.exists(tmp_path / "tokenizer-copy.tmp")


def test_roundtrip_check_catches_a_lossy_tokenizer(tok):
    class Lossy:
        def encode(self, texts):
            return tok.encode(texts)

        def decode(self, ids):
            return tok.decode(ids).replace("é", "e")

    prepare.check_roundtrip(tok, ["café"])
    with pytest.raises(PrepareError, match="round-trip failed on sample 1"):
        prepare.check_roundtrip(Lossy(), ["cafe", "café"])


@pytest.fixture
def tok_copy(tok, tmp_path):
    """A saved tokenizer in a cache-like layout: <tmp>/builtin/tokenizer-V."""
    path = str(tmp_path / "builtin" / f"tokenizer-{prepare.VOCAB_SIZE}")
    os.makedirs(os.path.dirname(path))
    tok.save(path)
    return path


@pytest.mark.parametrize("damage", ["missing ranks", "missing json", "truncated ranks", "edited ranks",
                                    "bad json", "missing dir"])
def test_broken_tokenizer_is_a_one_line_error_naming_the_fix(tok_copy, damage):
    ranks, meta = Path(tok_copy, "tokenizer.tiktoken"), Path(tok_copy, "tokenizer.json")
    if damage == "missing ranks":
        ranks.unlink()
    elif damage == "missing json":
        meta.unlink()
    elif damage == "truncated ranks":
        ranks.write_bytes(ranks.read_bytes()[: ranks.stat().st_size // 2])
    elif damage == "edited ranks":  # still parses, but is not what was trained
        lines = ranks.read_text().splitlines()
        lines[300], lines[301] = lines[301].split()[0] + " 300", lines[300].split()[0] + " 301"
        ranks.write_text("\n".join(lines) + "\n")
    elif damage == "bad json":
        meta.write_text("{not json")
    else:
        shutil.rmtree(tok_copy)
    before = sorted(os.listdir(os.path.dirname(tok_copy)))
    with pytest.raises(PrepareError) as e:
        Tokenizer.from_directory(tok_copy)
    msg = str(e.value)
    assert "\n" not in msg and "uv run prepare.py --dataset builtin" in msg and tok_copy in msg
    assert sorted(os.listdir(os.path.dirname(tok_copy))) == before  # nothing deleted


def test_no_dataset_prepared_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    with pytest.raises(PrepareError, match="no dataset prepared.*uv run prepare.py --dataset builtin"):
        Tokenizer.from_directory()
