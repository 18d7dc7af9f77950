"""From text to vectors: tokenizers, corpora, synthetic tasks, the input pipeline step by step.

* :mod:`.tokenizer` - WordPiece / byte-level BPE / byte tokenizers on Hugging Face ``tokenizers``.
* :mod:`.corpus` - the Python stdlib's own source and user files, split by document, byte views.
* :mod:`.tasks` - copy, reverse, addition, sort, parity (Kazemnejad et al. 2023) for length
  generalization.
* :mod:`.pipeline` - ids -> scaled embedding -> + positions -> LayerNorm -> dropout, each step kept.
* :mod:`.projection` - a learned ``[V, d]`` embedding matrix projected to 2D (PCA, t-SNE).

Heavy optional packages (``tokenizers``, ``scikit-learn``, ``matplotlib``) are imported only when
a function needs them.

Names load on first use, so importing this package (as the command line does to read its
arguments) does not import torch.
"""

from __future__ import annotations

from .._lazy import lazy_attributes

#: public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "CORPORA": "corpus",
    "Corpus": "corpus",
    "CorpusInfo": "corpus",
    "Document": "corpus",
    "load_corpus": "corpus",
    "split_documents": "corpus",
    "PipelineResult": "pipeline",
    "encode_text": "pipeline",
    "format_pipeline": "pipeline",
    "plot_pipeline": "pipeline",
    "run_pipeline": "pipeline",
    "PROJECTIONS": "projection",
    "plot_embedding_space": "projection",
    "project_2d": "projection",
    "TASKS": "tasks",
    "TaskBatch": "tasks",
    "exact_match": "tasks",
    "generate_task": "tasks",
    "Encoding": "tokenizer",
    "TOKENIZER_KINDS": "tokenizer",
    "Tokenizer": "tokenizer",
    "build_tokenizer": "tokenizer",
    "byte_tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "train_bpe": "tokenizer",
    "train_wordpiece": "tokenizer",
}


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)


__all__ = [
    "CORPORA",
    "PROJECTIONS",
    "TASKS",
    "TOKENIZER_KINDS",
    "Corpus",
    "CorpusInfo",
    "Document",
    "Encoding",
    "PipelineResult",
    "TaskBatch",
    "Tokenizer",
    "build_tokenizer",
    "byte_tokenizer",
    "encode_text",
    "exact_match",
    "format_pipeline",
    "generate_task",
    "load_corpus",
    "load_tokenizer",
    "plot_embedding_space",
    "plot_pipeline",
    "project_2d",
    "run_pipeline",
    "split_documents",
    "train_bpe",
    "train_wordpiece",
]
