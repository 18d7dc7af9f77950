"""From text to vectors: tokenizers, corpora, synthetic tasks, the input pipeline step by step.

* :mod:`.tokenizer` - WordPiece / byte-level BPE / byte tokenizers on Hugging Face ``tokenizers``.
* :mod:`.corpus` - the Python stdlib's own source and user files, split by document, byte views.
* :mod:`.tasks` - copy, reverse, addition (Kazemnejad et al. 2023) for length generalization.
* :mod:`.pipeline` - ids -> scaled embedding -> + positions -> LayerNorm -> dropout, each step kept.
* :mod:`.projection` - a learned ``[V, d]`` embedding matrix projected to 2D (PCA, t-SNE).

Heavy optional packages (``tokenizers``, ``scikit-learn``, ``matplotlib``) are imported only when
a function needs them.
"""

from .corpus import CORPORA, Corpus, CorpusInfo, Document, load_corpus, split_documents
from .pipeline import PipelineResult, encode_text, format_pipeline, plot_pipeline, run_pipeline
from .projection import PROJECTIONS, plot_embedding_space, project_2d
from .tasks import TASKS, TaskBatch, exact_match, generate_task
from .tokenizer import (
    TOKENIZER_KINDS,
    Encoding,
    Tokenizer,
    build_tokenizer,
    byte_tokenizer,
    load_tokenizer,
    train_bpe,
    train_wordpiece,
)

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
