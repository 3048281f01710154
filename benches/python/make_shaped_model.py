"""A random-weight sentence-transformers folder in the shape of a published
model, for throughput benches where the model itself cannot be installed
from a package registry: the same layers, widths, heads, pooling and
sequence limit, transformers' own initialisation (seed 0). Its vectors
mean nothing; its cost per text is the real model's, up to the tokenizer
(below).

Shapes:
  mpnet-base    all-mpnet-base-v2: MPNet, 12 layers, 768 wide, 12 heads,
                mean pooling, Normalize, 384 tokens; the uncased WordPiece
                vocabulary of the MiniLM folder given (all-mpnet-base-v2's
                is the same vocabulary with five special tokens added).
  xlmr-small    multilingual-e5-small: XLM-RoBERTa, 12 layers, 384 wide,
                12 heads, mean pooling, Normalize, 512 tokens; a
                SentencePiece unigram vocabulary of 8,000 pieces trained
                here on the bench corpus (e5's has 250,002: only the
                embedding table's size differs, not the work per token).

Usage: python make_shaped_model.py SHAPE OUT MINILM_DIR CORPUS_JSONL
"""
import json
import os
import sys
import tempfile

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling


def texts(corpus):
    with open(corpus, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def mpnet_base(work, minilm, corpus):
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizer

    words = [w.rstrip("\n") for w in open(os.path.join(minilm, "vocab.txt"), encoding="utf-8")]
    vocab = {w: i for i, w in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + words + ["<mask>"])}
    tok = MPNetTokenizer(vocab=vocab, do_lower_case=True, unk_token="[UNK]")
    config = MPNetConfig(vocab_size=len(tok), hidden_size=768, num_hidden_layers=12,
                         num_attention_heads=12, intermediate_size=3072,
                         max_position_embeddings=514, pad_token_id=1, layer_norm_eps=1e-5)
    return MPNetModel(config, add_pooling_layer=False), tok, 384


def xlmr_small(work, minilm, corpus):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizer

    text = os.path.join(work, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(texts(corpus)))
    prefix = os.path.join(work, "spm")
    spm.SentencePieceTrainer.train(
        f"--input={text} --model_prefix={prefix} --vocab_size=8000 --model_type=unigram "
        "--character_coverage=0.9995 --num_threads=2 --minloglevel=2 --hard_vocab_limit=false"
    )
    proto = sentencepiece_model_pb2.ModelProto()
    with open(prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(p.piece, p.score) for p in proto.pieces if p.type == 1]
    vocab.append(("<mask>", 0.0))
    tok = XLMRobertaTokenizer(vocab=vocab,
                              _spm_precompiled_charsmap=proto.normalizer_spec.precompiled_charsmap)
    config = XLMRobertaConfig(vocab_size=len(tok), hidden_size=384, num_hidden_layers=12,
                              num_attention_heads=12, intermediate_size=1536,
                              max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                              bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    return XLMRobertaModel(config, add_pooling_layer=False), tok, 512


SHAPES = {"mpnet-base": mpnet_base, "xlmr-small": xlmr_small}


def main():
    shape, out, minilm, corpus = sys.argv[1:5]
    torch.manual_seed(0)
    work = tempfile.mkdtemp()
    model, tok, max_len = SHAPES[shape](work, minilm, corpus)
    hf = os.path.join(work, "hf")
    model.save_pretrained(hf, safe_serialization=True)
    tok.save_pretrained(hf)
    transformer = Transformer(hf, max_seq_length=max_len)
    dim = transformer.get_embedding_dimension()
    st = SentenceTransformer(modules=[transformer, Pooling(dim, pooling_mode="mean"), Normalize()],
                             device="cpu")
    st.save(out)


if __name__ == "__main__":
    main()
