"""Baseline for encoder_throughput: sentence-transformers on the same texts.

Prints one JSON object per configuration on stdout:
{"config": ..., "precision": ..., "texts_per_s": ..., "texts_per_cpu_s": ..., "peak_rss_mib": ...}

Usage: python st_throughput.py MODEL_DIR CORPUS N CONFIG [CONFIG ...]
with CONFIG `THREADS:BATCH` (CPU, fp32) or `cuda:fp32:BATCH` /
`cuda:fp16:BATCH` (PyTorch on the first GPU, the model in that dtype).
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
    models = {}

    def model_for(device, dtype):
        if (device, dtype) not in models:
            t0 = time.perf_counter()
            model = SentenceTransformer(model_dir, device=device)
            # The folder's weights may be stored in either type.
            model = model.half() if dtype == "fp16" else model.float()
            model.encode(["warm up"] * 8)
            if device == "cuda":
                torch.cuda.synchronize()
            models[(device, dtype)] = model
            print(json.dumps({"config": "load", "load_s": time.perf_counter() - t0,
                              "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
                  flush=True)
        return models[(device, dtype)]

    for cfg in configs:
        parts = cfg.split(":")
        if len(parts) == 2:
            device, dtype, threads, batch = "cpu", "fp32", int(parts[0]), int(parts[1])
            torch.set_num_threads(threads)
            label = f"torch threads={threads} batch={batch}"
        else:
            device, dtype, batch = parts[0], parts[1], int(parts[2])
            label = f"torch {device} {dtype} batch={batch}"
        model = model_for(device, dtype)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        c0, w0 = time.process_time(), time.perf_counter()
        out = model.encode(texts, batch_size=batch, normalize_embeddings=True)
        if device == "cuda":
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        assert out.shape[0] == len(texts)
        line = {
            "config": label,
            "precision": dtype,
            "texts_per_s": len(texts) / wall,
            "texts_per_cpu_s": len(texts) / cpu,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        if device == "cuda":
            line["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
