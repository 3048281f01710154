"""A reference file for encoder_throughput --golden, made by
sentence-transformers from a model folder's own weights: token ids and
normalised fp32 vectors (CPU, each text alone) of every sentence of the
given reference files.

A folder whose weights were stored as f16 (`node model convert`) gives
vectors that differ from the f32 weights' by up to ~2.4e-4 in single
values: checking an encoder's f32 arithmetic on such a folder needs a
reference made from the same weights, which this writes.

Usage: python st_reference.py MODEL_DIR OUT.json REFERENCE.json [REFERENCE.json ...]
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(min(4, os.cpu_count() or 1))
    model = SentenceTransformer(model_dir, device="cpu").float()
    texts = []
    for path in sys.argv[3:]:
        with open(path, encoding="utf-8") as f:
            texts.extend(s["text"] for s in json.load(f)["sentences"])
    sentences = []
    for text in texts:
        ids = model.tokenize([text])["input_ids"][0].tolist()
        vec = model.encode([text], batch_size=1, normalize_embeddings=True)[0]
        sentences.append({"text": text, "token_ids": ids, "embedding": [float(v) for v in vec]})
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"model": model_dir, "made_by": "sentence-transformers, fp32, CPU, each text alone",
                   "sentences": sentences}, f)
    print(f"{len(sentences)} reference sentences from {model_dir} in {out}")


if __name__ == "__main__":
    main()
