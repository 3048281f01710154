"""The texts the rival benches embed: the first N of a JSONL corpus."""
import json


def read_texts(corpus, n):
    """The `text` of the first `n` rows of `corpus`."""
    texts = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if len(texts) == n:
                break
    return texts
