"""Writes tests/data/reference-extra.json: sentence-transformers' token ids and
normalized embeddings for texts the shared golden file does not cover
(CJK, emoji, mixed scripts, whitespace, a text far over max_seq_length).

Usage: python make_reference.py MODEL_DIR OUT.json   (needs sentence-transformers)
"""
import json
import sys

from sentence_transformers import SentenceTransformer

TEXTS = [
    "東京は日本の首都です。",
    "北京欢迎你，上海也很好",
    "emoji 🚀🔥 and accents déjà vu",
    "👍",
    "   \t\n  ",
    "Ελληνικά και русский текст together",
    "naïve café — “quotes” and ‘apostrophes’ … ellipsis",
    " ".join(f"token{i} 東京" for i in range(300)),
]


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    model = SentenceTransformer(model_dir, device="cpu")
    tok = model.tokenizer
    vectors = model.encode(TEXTS, batch_size=1, normalize_embeddings=True)
    items = []
    for text, vec in zip(TEXTS, vectors):
        ids = tok(text, truncation=True, max_length=model.max_seq_length)["input_ids"]
        items.append({"text": text, "token_ids": ids, "embedding": [float(v) for v in vec]})
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"model": "sentence-transformers/all-MiniLM-L6-v2",
                   "max_seq_length": model.max_seq_length, "sentences": items}, f)


if __name__ == "__main__":
    main()
