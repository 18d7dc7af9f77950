"""Hugging Face checkpoints in and out, without ``transformers`` for folders:

* :mod:`~posenc.model.hf.convert` -- :func:`from_transformers`, :func:`to_transformers`,
  :func:`save_transformers`, :func:`export_state` (the public API, re-exported here);
* :mod:`~posenc.model.hf.files` -- a checkpoint folder read and written (``config.json``,
  safetensors shards), every field and tensor checked;
* :mod:`~posenc.model.hf.fields` -- the config fields the families share (activations, heads,
  RoPE, tying, sliding windows);
* :mod:`~posenc.model.hf.links` -- how each HF tensor maps onto posenc's (:class:`Link`) and what
  a family is (:class:`Family`);
* :mod:`~posenc.model.hf.families` -- the families, in the order export tries them:
  :mod:`~posenc.model.hf.llama` (Llama, Mistral, Qwen2/3, Phi-3), :mod:`~posenc.model.hf.gpt`
  (GPT-2, GPT-NeoX, GPT-J), :mod:`~posenc.model.hf.bloom`.
"""

from .convert import export_state, from_transformers, save_transformers, to_transformers

__all__ = ["export_state", "from_transformers", "save_transformers", "to_transformers"]
