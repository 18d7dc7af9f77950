"""The README's library examples, unchanged, in a script written the way a Hugging Face user writes
one: the names the examples use but do not define (a device, ids, a prompt, positions, HF's
full-width cos/sin, a weight table, an HF tokenizer, a GloVe file) come first, as such a script
has them, then the README's Python blocks run in order, as copied."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).parents[1] / "README.md"

#: what an HF-style script holds before the README's lines: the first block's q/k are
#: [1, 8, 16, 64], which the second block's "bshd" module reads as s = 8, so positions are [8]
PRELUDE = """
import torch, tokenizers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

device = "cuda" if torch.cuda.is_available() else "cpu"
ids = torch.randint(0, 256, (2, 16))
prompt = ids[:, :4]
pos = torch.arange(8) + 100
x_hf = torch.randn(1, 8, 64)
hf_cos, hf_sin = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=1))(x_hf, pos[None])
weights = torch.randn(100, 16)
tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[PAD]": 0, "[UNK]": 1, "the": 2, "cat": 3},
                                                       unk_token="[UNK]"))
with open("glove.6B.100d.txt", "w", encoding="utf-8") as f:
    f.write("the " + " ".join(["0.1"] * 100) + "\\ncat " + " ".join(["-0.2"] * 100) + "\\n")
"""


def _blocks(heading: str) -> str:
    """The first ```python block after ``heading`` in the README."""
    text = README.read_text(encoding="utf-8")
    start = text.index(heading)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, heading
    return match.group(1)


def test_readme_library_examples_run_unchanged_in_a_hugging_face_style_script(tmp_path, monkeypatch):
    pytest.importorskip("transformers").logging.set_verbosity_error()
    pytest.importorskip("tokenizers")
    monkeypatch.chdir(tmp_path)  # save_pretrained("my-lm") and the GloVe file land here
    first = _blocks("## Every scheme, one interface")
    second = _blocks("## Coming from Hugging Face or torchtune")
    namespace: dict = {}
    torch.manual_seed(0)
    exec(compile(PRELUDE + first + second, "README.md", "exec"), namespace)
    assert namespace["x"].shape == (2, 128, 512) and namespace["bias"].shape == (1, 8, 16, 16)
    assert namespace["logits"].shape == (2, 64, 256)
    out = namespace["out"]
    assert out[0] is out.loss and out["logits"].shape == (2, 16, 256)
    tokens = namespace["tokens"]
    assert tokens.shape == (2, 54) and torch.equal(tokens[:, :4], namespace["prompt"])
    assert namespace["coverage"].found == 2 and namespace["coverage"].missing == ["[PAD]", "[UNK]"]
    cos, sin = namespace["cos"], namespace["sin"]
    assert cos.shape == (1, 8, 32) and torch.equal(torch.cat((cos, cos), -1), namespace["hf_cos"])
    assert torch.equal(torch.cat((sin, sin), -1), namespace["hf_sin"])
    assert (tmp_path / "my-lm" / "config.json").is_file()
    assert namespace["lm"].dtype == torch.bfloat16
    assert namespace["layer"].token is namespace["emb"]
