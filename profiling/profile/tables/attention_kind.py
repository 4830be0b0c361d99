"""Pure: whether the model's attention is causal, bidirectional or unknown, from what the trace shows. Stdlib only.

    kind = of(tl)   # Kind(kind, evidence, builder); memoized on the Timeline

A finding's fix never changes what the model computes: `is_causal=True` is named only for a causal model, a
bidirectional one (BERT, a ViT) keeps its full attention, and an unknown one gets both branches, each with its
condition. Its pricing uses the attention the model does (no causal halving for a bidirectional model).

The evidence, strongest first:
1. The attention calls themselves: SDPA's `is_causal` input where recorded (Concrete Inputs), a window
   operator (causal over a band). A call that is not causal and has no [T, T] mask (none, or a padding mask
   [B, 1, 1, T]) attends both ways: the model computes exactly that. A [T, T] mask with is_causal=False says
   nothing by itself (it may hide the future, or only padding).
2. This repository's train.py (a causal GPT).
3. Names: the model's module classes (`nn.Module: BertSelfAttention_0`), its parameter names, the source frames
   of its compiled code and host samples (transformers' `create_causal_mask`, `modeling_vit.py`). A family
   known to be causal (GPT, Llama, ...) or bidirectional (BERT, ViT, ...), or a mask builder's name.
4. `aten::tril` / `aten::triu` in the step: a causal mask built at run time.
Causal and bidirectional evidence of the same strength both present (an encoder-decoder, or a coincidence of
names) leave the kind unknown, with both named.

`builder`: where a library builds the attention mask (its frame, and the model line calling it), from the
compiled code's source frames, e.g. ("transformers", "create_causal_mask (transformers/masking_utils.py), called
at transformers/models/llama/modeling_llama.py:391"); None when no such frame is recorded.
"""
import re
from collections import Counter, namedtuple

from profiling.profile.tables.roofline import ATTENTION_OP, causal_flag
from profiling.profile.trace.traceio import MODULE_PREFIX

CAUSAL, BIDIRECTIONAL, UNKNOWN = "causal", "bidirectional", "unknown"
Kind = namedtuple("Kind", "kind evidence builder")

# families by the words of their names (module classes, files, parameters), after camelCase is split
CAUSAL_WORDS = re.compile(r"^(causal|gpt\w*|nanogpt|llama\d*|mistral|mixtral|qwen\d*|gemma\d*|falcon|olmo\d*|"
                          r"deepseek\w*|phi\d*|starcoder\d*|bloom|gptneox)$")  # not "opt": /opt/ in paths
BIDIRECTIONAL_WORDS = re.compile(r"^(bidirectional|bert|roberta|distilbert|albert|deberta\w*|electra|xlm|vit|"
                                 r"deit|beit|swin\w*|dinov2|siglip|hubert|wav2vec2|visiontransformer|"
                                 r"patch_embed|cls_token|pos_embed)$")
PHRASES = (("vision_transformer", BIDIRECTIONAL), ("patch_embed", BIDIRECTIONAL), ("cls_token", BIDIRECTIONAL),
           ("causal_mask", CAUSAL), ("bidirectional_mask", BIDIRECTIONAL))
CAUSAL_MASK_OPS = ("aten::tril", "aten::triu", "aten::tril_", "aten::triu_")
MASK_FUNC = re.compile(r"mask", re.IGNORECASE)   # a library function that builds a mask (create_causal_mask, sdpa_mask)
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SPLIT = re.compile(r"[^a-z0-9]+")


def of(tl):
    """The model's Kind (module docstring), computed once per Timeline."""
    kind = getattr(tl, "_attention_kind", None)
    if kind is None:
        kind = decide(_calls(tl), tl.meta, _names(tl), _mask_ops(tl))
        kind = tl._attention_kind = kind._replace(builder=builder((tl.meta.get("provenance") or {}).get("frames")))
    return kind


def decide(calls, meta, names, mask_ops):
    """The Kind from the counted evidence: calls {CAUSAL: n, BIDIRECTIONAL: n}, names {kind: [names]}, the
    number of causal-mask operators."""
    c, b = calls.get(CAUSAL, 0), calls.get(BIDIRECTIONAL, 0)
    said = {CAUSAL: f"{c} attention calls are causal, by is_causal=True or a window",
            BIDIRECTIONAL: f"{b} attention calls attend to every key, is_causal=False with no [T, T] mask"}
    if c and b:
        return Kind(UNKNOWN, said[CAUSAL] + " and " + said[BIDIRECTIONAL] + " : an encoder-decoder?", None)
    if c or b:
        return Kind(CAUSAL if c else BIDIRECTIONAL, said[CAUSAL if c else BIDIRECTIONAL], None)
    if meta.get("trainer") == "train.py" or (meta.get("trainer") is None and "micro_batches" in meta):
        return Kind(CAUSAL, "train.py's GPT, causal", None)
    shown = {k: ", ".join(f"`{n}`" for n in v[:2]) for k, v in names.items() if v}
    if len(shown) == 2:
        return Kind(UNKNOWN, f"names of both kinds: causal {shown[CAUSAL]}, bidirectional {shown[BIDIRECTIONAL]}",
                    None)
    if shown:
        (k, text), = shown.items()
        return Kind(k, f"the model's names say so: {text}", None)
    if mask_ops:
        return Kind(CAUSAL, f"{mask_ops} tril/triu operators build a causal mask in the step", None)
    return Kind(UNKNOWN, "nothing in the trace says whether the attention is causal: no is_causal recorded, no "
                "model name known", None)


def call_kind(op):
    """CAUSAL, BIDIRECTIONAL or None (a [T, T] mask, or nothing recorded) of one attention operator call."""
    name, args = str(op.get("name", "")), op.get("args") or {}
    if "window" in name:
        return CAUSAL
    flag = causal_flag(args.get("Concrete Inputs"))
    if flag is None:
        return None
    if flag:
        return CAUSAL
    return None if square_masks(args.get("Input Dims")) else BIDIRECTIONAL


def square_masks(dims):
    """The [.., T, T] masks among an attention call's inputs (after q, k, v): a [T, T] tensor, or a batched one
    whose last two sizes are equal and above 1 (a [B, 1, 1, T] padding mask is not one)."""
    out = []
    for d in (dims or [])[3:]:
        if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d) and d[-1] == d[-2] > 1:
            out.append(d)
    return out


def bias_masks(args):
    """([per-head float masks], [other batched float masks]) among an attention call's [.., T, T] masks. A mask
    that is not boolean is added to the scores; one that varies by head ([B, H, T, T], H > 1) is a bias the model
    adds (T5's relative position bias, ALiBi; shared/DESIGN.md pitfall 19), never a padding or causal mask, which
    are the same for every head. A batched float mask the same for every head ([B, 1, T, T]: how some libraries
    pass padding and causality) may be either. A [T, T] one is read as a mask."""
    dims, types = (args or {}).get("Input Dims") or [], (args or {}).get("Input type") or []
    floats = [d for d, t in zip(dims[3:], types[3:])
              if isinstance(d, list) and len(d) >= 3 and square_masks([None] * 3 + [d]) and t not in ("bool", "")]
    per_head = [d for d in floats if len(d) == 4 and d[1] > 1]
    return per_head, [d for d in floats if d not in per_head]


def _calls(tl):
    """{kind: number of outermost forward attention calls of that kind}."""
    counts = Counter()
    for op in tl.ix.cpu_ops:
        name = str(op.get("name", ""))
        if not ATTENTION_OP.match(name) or "backward" in name:
            continue
        up = tl.parent.get(id(op))
        if up is not None and ATTENTION_OP.match(str(up.get("name", ""))):
            continue  # the call's inner operator (SDPA's backend): counted at its outermost
        kind = call_kind(op)
        if kind:
            counts[kind] += 1
    return counts


def words(text):
    """The lowercase words of a name (camelCase split; `_`, `.`, `/` and digits' neighbours kept apart)."""
    return [w for w in _SPLIT.split(_CAMEL.sub(r"\1_\2", text).lower()) if w]


def name_kind(text):
    """CAUSAL, BIDIRECTIONAL or None for one name (a module class, a file path, a function, a parameter)."""
    low = _CAMEL.sub(r"\1_\2", text).lower()
    for phrase, kind in PHRASES:
        if phrase in low:
            return kind
    ws = words(text)
    if any(BIDIRECTIONAL_WORDS.match(w) for w in ws):
        return BIDIRECTIONAL
    if any(CAUSAL_WORDS.match(w) for w in ws):
        return CAUSAL
    return None


def _names(tl):
    """{kind: [names saying it]}: module classes, source frames' files and functions (never their code text:
    `is_causal=is_causal` is in every model's SDPA call), parameter names."""
    meta, seen = tl.meta, {}
    texts = [str(e.get("name", ""))[len(MODULE_PREFIX):].rsplit("_", 1)[0] for e in tl.ix.modules]
    for frame in (meta.get("provenance") or {}).get("frames") or ():
        if isinstance(frame, list) and len(frame) >= 3:
            texts += [str(frame[0]), str(frame[2])]
    for stack in ((meta.get("host_samples") or {}).get("stacks") or ())[:200]:
        texts += [str(f).split(":", 1)[0] for f in stack if isinstance(f, str)]
    texts += list(meta.get("parameters") or {})[:50]
    out = {CAUSAL: [], BIDIRECTIONAL: []}
    for text in dict.fromkeys(texts):
        kind = name_kind(text)
        if kind and text not in seen:
            seen[text] = True
            out[kind].append(text)
    return out


def _mask_ops(tl):
    return sum(1 for op in tl.ix.cpu_ops if str(op.get("name", "")) in CAUSAL_MASK_OPS)


def builder(frames):
    """(library, "function (file), called at own_file:line") of the library frame that builds the attention
    mask, from the compiled code's source frames ([file, line, function, text, own]); None when none does."""
    frames = [f for f in frames or () if isinstance(f, list) and len(f) >= 5]
    found = []
    for file, _, func, _, own in (f[:5] for f in frames):
        if not own and MASK_FUNC.search(str(func)):
            caller = next((g for g in frames if g[4] and f"{func}(" in str(g[3])), None)
            found.append((caller is None, str(file), str(func), caller))
    if not found:
        return None
    _, file, func, caller = min(found, key=lambda x: x[0])  # the one the model's own code calls, else the first
    where = f", called at {caller[0]}:{caller[1]}" if caller else ""
    return file.split("/", 1)[0], f"{func} ({file}){where}"
