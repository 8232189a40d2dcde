import pytest

from rest_lsp.model.prompts import (
    FIM_FORMATS, FimFormat, build_prompt, detect_fim, resolve_fim, stop_token_ids,
)


def test_detects_qwen_fim(tiny_tokenizer):
    f = detect_fim(tiny_tokenizer)
    assert f is not None and f.name == "qwen"
    assert resolve_fim("auto", tiny_tokenizer) == f
    assert resolve_fim("none", tiny_tokenizer) is None
    assert resolve_fim(None, tiny_tokenizer) is None
    with pytest.raises(ValueError, match="unknown FIM format"):
        resolve_fim("nope", tiny_tokenizer)
    with pytest.raises(ValueError, match="no token"):
        resolve_fim("codellama", tiny_tokenizer)


def test_plain_and_fim_prompts(tiny_tokenizer):
    tok = tiny_tokenizer
    f = detect_fim(tok)
    plain = build_prompt(tok, "def f(x):\n    return", None, f)
    assert tok.decode(plain) == "def f(x):\n    return"
    ids = build_prompt(tok, "def f(x):\n    ", "\n\nprint(f(1))\n", f)
    assert tok.decode(ids) == "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n\nprint(f(1))\n<|fim_middle|>"
    p, s, m = f.token_ids(tok)
    assert ids[0] == p and ids[-1] == m and ids.count(s) == 1
    # no FIM format: the suffix is ignored
    assert build_prompt(tok, "x = 1", "y = 2", None) == build_prompt(tok, "x = 1", None, None)


def test_empty_prompt_is_never_empty(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = build_prompt(tok, "", None, None)
    assert len(ids) == 1 and ids[0] in (tok.bos_token_id, tok.eos_token_id)
    f = detect_fim(tok)
    assert len(build_prompt(tok, "", "", f)) == 3


def test_long_prompt_drops_from_the_left_and_keeps_suffix(tiny_tokenizer):
    tok = tiny_tokenizer
    f = detect_fim(tok)
    prefix = "".join(f"line_{i} = {i}\n" for i in range(400)) + "END_OF_PREFIX = "
    suffix = "\nSTART_OF_SUFFIX = 1\n" + "".join(f"tail_{i} = {i}\n" for i in range(400))
    full = build_prompt(tok, prefix, suffix, f, max_tokens=None)
    assert len(full) > 2000
    ids = build_prompt(tok, prefix, suffix, f, max_tokens=200, suffix_share=0.25)
    assert len(ids) == 200
    text = tok.decode(ids)
    assert text.startswith("<|fim_prefix|>") and text.endswith("<|fim_middle|>")
    pre, suf = text[len("<|fim_prefix|>"):-len("<|fim_middle|>")].split("<|fim_suffix|>")
    assert pre.endswith("END_OF_PREFIX = ") and "line_0 " not in pre
    assert suf.startswith("\nSTART_OF_SUFFIX = 1\n") and "tail_399" not in suf
    n_suf = len(tok.encode(suf, add_special_tokens=False))
    assert n_suf <= int(197 * 0.25) + 1
    # a short prefix lets the suffix use the rest of the budget
    ids = build_prompt(tok, "x = ", suffix, f, max_tokens=200)
    assert len(ids) == 200 and tok.decode(ids).startswith("<|fim_prefix|>x = <|fim_suffix|>")
    # plain prompt: keep the end
    ids = build_prompt(tok, prefix, None, None, max_tokens=50)
    assert len(ids) == 50 and tok.decode(ids).endswith("END_OF_PREFIX = ")
    with pytest.raises(ValueError):
        build_prompt(tok, prefix, suffix, f, max_tokens=3)


def test_stop_ids(tiny_tokenizer):
    f = detect_fim(tiny_tokenizer)
    ids = stop_token_ids(tiny_tokenizer, f)
    assert tiny_tokenizer.eos_token_id in ids
    assert tiny_tokenizer.convert_tokens_to_ids("<|fim_pad|>") in ids


class FakeTokenizer:
    """Just enough tokenizer for format detection and id assembly (one id per character)."""

    def __init__(self, specials, bos=None, sp_space=False):
        self.vocab = {t: i for i, t in enumerate(specials)}
        self.bos_token_id = self.vocab.get(bos)
        self.eos_token_id = None
        self.sp_space = sp_space

    def get_vocab(self):
        return self.vocab

    def _id(self, piece):
        return self.vocab.setdefault(piece, len(self.vocab))

    def encode(self, text, add_special_tokens=False):
        pieces = list(text)
        if self.sp_space and pieces:
            pieces[0] = "▁" + pieces[0]
        ids = [self._id(p) for p in pieces]
        return ([self.bos_token_id] if add_special_tokens and self.bos_token_id is not None else []) + ids

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text, add_special_tokens)}

    def convert_ids_to_tokens(self, i):
        return {v: k for k, v in self.vocab.items()}[i]


@pytest.mark.parametrize("name,specials", [
    ("starcoder", ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]),
    ("deepseek", ["<｜begin▁of▁sentence｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>"]),
    ("codellama", ["<s>", "▁<PRE>", "▁<MID>", "▁<SUF>", "▁<EOT>"]),
])
def test_detects_other_families(name, specials):
    tok = FakeTokenizer(specials, bos=specials[0] if name != "starcoder" else None,
                        sp_space=name == "codellama")
    f = detect_fim(tok)
    assert f is not None and f.name == name
    ids = build_prompt(tok, "ab", "cd", f)
    p, s, m = f.token_ids(tok)
    body = ids[1:] if name != "starcoder" else ids
    if name != "starcoder":
        assert ids[0] == tok.bos_token_id
    assert body[0] == p and body[-1] == m
    inner = body[1:-1]
    cut = inner.index(s)
    pre, suf = inner[:cut], inner[cut + 1:]
    assert [tok.convert_ids_to_tokens(i) for i in pre] == (["▁a", "b"] if name == "codellama" else ["a", "b"])
    # CodeLlama's suffix carries no SentencePiece leading space (Meta's encode_infilling)
    assert [tok.convert_ids_to_tokens(i) for i in suf] == ["c", "d"]


def test_custom_format_override(tiny_tokenizer):
    custom = FimFormat("mine", "<|fim_suffix|>", "<|fim_prefix|>", "<|fim_middle|>")  # SPM-ish order
    assert resolve_fim(custom, tiny_tokenizer) is custom
    ids = build_prompt(tiny_tokenizer, "a", "b", custom)
    assert tiny_tokenizer.decode(ids) == "<|fim_suffix|>a<|fim_prefix|>b<|fim_middle|>"
    assert set(FIM_FORMATS) >= {"qwen", "starcoder", "codellama", "deepseek"}
