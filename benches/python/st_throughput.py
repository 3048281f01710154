"""Baseline for encoder_throughput: sentence-transformers on the same texts.

Prints one JSON object per configuration on stdout:
{"config": ..., "texts_per_s": ..., "texts_per_cpu_s": ..., "peak_rss_mib": ...}

Usage: python st_throughput.py MODEL_DIR CORPUS N THREADS:BATCH [THREADS:BATCH ...]
"""
import json
import os
import resource
import sys
import time

from bench_corpus import read_texts

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    model_dir, corpus, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    configs = sys.argv[4:]
    import torch
    from sentence_transformers import SentenceTransformer

    texts = read_texts(corpus, n)
    t0 = time.perf_counter()
    model = SentenceTransformer(model_dir, device="cpu")
    load_s = time.perf_counter() - t0
    model.encode(["warm up"])
    print(json.dumps({"config": "load", "load_s": load_s,
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)
    for cfg in configs:
        threads, batch = (int(x) for x in cfg.split(":"))
        torch.set_num_threads(threads)
        c0, w0 = time.process_time(), time.perf_counter()
        out = model.encode(texts, batch_size=batch, normalize_embeddings=True)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        assert out.shape[0] == len(texts)
        print(json.dumps({
            "config": f"torch threads={threads} batch={batch}",
            "texts_per_s": len(texts) / wall,
            "texts_per_cpu_s": len(texts) / cpu,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }), flush=True)


if __name__ == "__main__":
    main()
