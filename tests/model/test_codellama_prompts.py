"""CodeLlama's infilling formats (PSM, SPM) against Meta's reference, orders per family, continuation decoding.

Meta's reference (facebookresearch/codellama, llama/generation.py `infilling_prompt_tokens`, llama/tokenizer.py
`encode_infilling`) runs SentencePiece directly: `encode(s)` adds the dummy-prefix space, `encode_infilling(s)`
encodes "☺" + s and drops the anchor's tokens, so the text keeps no dummy space. The test runs that algorithm
on the checkpoint's raw tokenizer.json, whose normalizer (Prepend "▁", Replace " ") is SentencePiece's, while
rest-lsp builds prompts with the tokenizer as transformers 5 loads it (Metaspace, prepend "first"): the two
must give the same ids.
"""
import pytest
from tokenizers import Tokenizer

from rest_lsp.model.prompts import FIM_FORMATS, FimFormat, build_prompt, detect_fim, stop_token_ids

CL = FIM_FORMATS["codellama"]
BOS, PRE, SUF, MID, EOT = 1, 32007, 32008, 32009, 32010


class MetaReference:
    """infilling_prompt_tokens(tokenizer, pre, suf, suffix_first) over SentencePiece semantics."""

    def __init__(self, model_dir):
        self.sp = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.anchor = len(self.encode("☺"))   # Llama's vocabulary has "☺" as one piece (Meta drops 2 ids)

    def encode(self, s: str) -> list[int]:
        return self.sp.encode(s, add_special_tokens=False).ids

    def encode_infilling(self, s: str) -> list[int]:
        return self.encode("☺" + s)[self.anchor:]

    def prompt(self, pre: str, suf: str, suffix_first: bool) -> list[int]:
        if suffix_first:   # "<PRE> <SUF>{suf} <MID> {pre}"
            return [BOS, PRE, SUF] + self.encode_infilling(suf) + [MID] + self.encode(pre)
        return [BOS, PRE] + self.encode(pre) + [SUF] + self.encode_infilling(suf) + [MID]   # "<PRE> {pre} <SUF>{suf} <MID>"


CASES = [("def f(x):\n    ", "\n    return y\n"), ("  x = 1", " y"), ("", "z"), ("\nimport os", "\n\n"),
         ("a", "  b  "), ("x ", " y"), ("", ""), (" ", " "), ("print('é', end=' ')", "  # ok\n")]


@pytest.mark.parametrize("order", ["psm", "spm"])
@pytest.mark.parametrize("prefix,suffix", CASES)
def test_codellama_prompts_match_metas_reference(tiny_codellama_dir, codellama_tokenizer, prefix, suffix, order):
    ref = MetaReference(tiny_codellama_dir)
    ours = build_prompt(codellama_tokenizer, prefix, suffix, CL, order=order)
    assert ours == ref.prompt(prefix, suffix, suffix_first=order == "spm")


@pytest.mark.parametrize("prefix,middle", [("def f(x):\n", "    ret"), ("", "imp"), ("a = 1\n", ""),
                                           ("x = [\n", "  1, "), ("\n\n", " ")])
def test_spm_with_a_middle_is_the_reference_prompt_of_prefix_plus_middle(tiny_codellama_dir, codellama_tokenizer,
                                                                       prefix, middle):
    # the latency layout cuts the prefix at a line start: SentencePiece pieces never span a newline (bytes
    # <0x0A>), so the prefix and the middle encoded apart are the reference's prefix + middle
    ref = MetaReference(tiny_codellama_dir)
    ours = build_prompt(codellama_tokenizer, prefix, "\n    return y\n", CL, middle=middle, order="spm")
    assert ours == ref.prompt(prefix + middle, "\n    return y\n", suffix_first=True)


def test_psm_middle_follows_the_middle_marker_without_a_dummy_space(tiny_codellama_dir, codellama_tokenizer):
    ref = MetaReference(tiny_codellama_dir)
    for prefix in ("def f(x):\n", ""):
        ids = build_prompt(codellama_tokenizer, prefix, "\n", CL, middle="    return", order="psm")
        assert ids == ref.prompt(prefix, "\n", suffix_first=False) + ref.encode_infilling("    return")
        assert codellama_tokenizer.convert_ids_to_tokens(ids[-2:]) == ["▁", "▁return"]  # 4 spaces, no 5th


def test_truncation_keeps_the_markers_in_both_orders(codellama_tokenizer):
    prefix = "".join(f"line_{i} = {i}\n" for i in range(300)) + "END = "
    suffix = "\nSTART = 1\n" + "".join(f"tail_{i} = {i}\n" for i in range(300))
    for order in ("psm", "spm"):
        ids = build_prompt(codellama_tokenizer, prefix, suffix, CL, middle="mid", order=order, max_tokens=120)
        assert len(ids) == 120 and ids[0] == BOS and ids.count(MID) == 1
        text = codellama_tokenizer.decode(ids)
        assert "END = " in text and "START = 1" in text and "line_0 " not in text and "tail_299" not in text
    spm = build_prompt(codellama_tokenizer, prefix, suffix, CL, middle="mid", order="spm", max_tokens=120)
    assert spm[1:3] == [PRE, SUF] and codellama_tokenizer.decode(spm).endswith("END = mid")


def test_orders_each_family_declares(tiny_tokenizer, codellama_tokenizer):
    assert CL.orders == ("psm", "spm") and FIM_FORMATS["starcoder"].orders == ("psm", "spm")
    assert FIM_FORMATS["qwen"].orders == ("psm",) and FIM_FORMATS["deepseek"].orders == ("psm",)
    qwen = detect_fim(tiny_tokenizer)
    with pytest.raises(ValueError, match="'qwen' was trained in the order"):
        build_prompt(tiny_tokenizer, "a", "b", qwen, order="spm")
    with pytest.raises(ValueError, match="unknown FIM order 'mps'"):
        build_prompt(codellama_tokenizer, "a", "b", CL, order="mps")
    # a plain prompt (no suffix, or no format) has no order to honour
    assert build_prompt(tiny_tokenizer, "a", None, qwen, order="spm") == build_prompt(tiny_tokenizer, "a", None, None)
    # a custom format says what it supports
    mine = FimFormat("mine", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", orders=("spm",))
    ids = build_prompt(tiny_tokenizer, "a", "b", mine, middle="c", order="spm")
    assert tiny_tokenizer.decode(ids) == "<|fim_prefix|><|fim_suffix|>b<|fim_middle|>ac"
    with pytest.raises(ValueError, match="'mine'"):
        build_prompt(tiny_tokenizer, "a", "b", mine)


def test_starcoder_spm_is_bigcodes_layout():
    from test_prompts import FakeTokenizer

    tok = FakeTokenizer(["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"])
    f = detect_fim(tok)
    p, s, m = f.token_ids(tok)
    ids = build_prompt(tok, "ab", "cd", f, middle="e", order="spm")
    # [prefix_tok, suffix_tok] suffix [middle_tok] prefix middle
    assert [tok.convert_ids_to_tokens(i) for i in ids] == ["<fim_prefix>", "<fim_suffix>", "c", "d", "<fim_middle>",
                                                            "a", "b", "e"]


def test_codellama_detection_stops_and_continuation_decoding(tiny_codellama_dir, codellama_tokenizer):
    from rest_lsp.model.host import load_model

    assert detect_fim(codellama_tokenizer) == CL
    assert set(stop_token_ids(codellama_tokenizer, CL)) == {2, EOT}
    lm = load_model(tiny_codellama_dir, device="cpu")
    assert lm.fim == CL and lm.vocab_size == 32016 and len(lm.tokenizer) == 32017   # <FILL_ME> is 32016
    assert set(lm.stop_ids) == {2, EOT}
    ids = lm.tokenizer.encode("x = return  y", add_special_tokens=False)
    cut = lm.tokenizer.convert_ids_to_tokens(ids).index("▁return")
    # transformers' decoder drops the first space (it undoes a document's dummy prefix): a completion's is real
    assert codellama_tokenizer.decode(ids[cut:]) == "return  y"
    assert lm.tokenizer.decode(ids[cut:]) == " return  y"
    spm = lm.build_prompt("def f(x):\n", "\n", middle="    ret", order="spm", max_new_tokens=16)
    assert spm[:3] == [BOS, PRE, SUF] and lm.tokenizer.decode(spm).endswith("<MID> def f(x):\n    ret")
    with pytest.raises(ValueError, match="unknown FIM order"):
        lm.build_prompt("a", "b", order="x")
