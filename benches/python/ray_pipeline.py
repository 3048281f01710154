"""Ray's embedding job, the rival of the embed job in benches/src/bin/pipeline.rs.

Ray Core with N sentence-transformers actors (one torch thread each, one
CPU each), and a driver that reads the JSONL corpus, sorts each window of
rows by length, cuts batches from it, keeps at most 2 batches per actor in
flight (ray.wait), sends each to the actor with the fewest in flight, and
writes each batch's vectors to its own .npy file, as the embed job writes
one part per batch.

Prints one JSON object:
{"texts": N, "startup_s": ..., "steady_texts_per_s": ..., "total_s": ...}
startup_s is ray.init plus the actors' model loads and a warm-up call;
steady_texts_per_s is the texts over the time from the first batch sent to
the last part written; total_s is the whole, start to end.

Usage: python ray_pipeline.py MODEL_DIR CORPUS OUT_DIR ACTORS BATCH [WINDOW]
"""
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    started = time.perf_counter()
    model_dir, corpus, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    actors, batch = int(sys.argv[4]), int(sys.argv[5])
    window = int(sys.argv[6]) if len(sys.argv) > 6 else 4096
    import numpy as np
    import ray

    ray.init(num_cpus=actors, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Embedder:
        def __init__(self, model_dir):
            import torch
            from sentence_transformers import SentenceTransformer

            torch.set_num_threads(1)
            self.model = SentenceTransformer(model_dir, device="cpu")

        def embed(self, texts):
            return self.model.encode(texts, batch_size=16, normalize_embeddings=True)

    pool = [Embedder.remote(model_dir) for _ in range(actors)]
    ray.get([a.embed.remote(["warm up"]) for a in pool])
    ready = time.perf_counter()

    os.makedirs(out_dir, exist_ok=True)
    rows = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))

    def batches():
        for start in range(0, len(rows), window):
            win = sorted(rows[start:start + window], key=lambda r: len(r["text"]))
            for b in range(0, len(win), batch):
                yield win[b:b + batch]

    in_flight = {}
    load = [0] * actors
    texts = 0
    t0 = time.perf_counter()

    def finish(ref):
        nonlocal texts
        (n, actor), vectors = in_flight.pop(ref), ray.get(ref)
        load[actor] -= 1
        np.save(os.path.join(out_dir, f"batch-{n:08}.npy"), vectors)
        texts += len(vectors)

    for n, b in enumerate(batches()):
        while len(in_flight) >= 2 * actors:
            done, _ = ray.wait(list(in_flight), num_returns=1)
            finish(done[0])
        # The least-loaded actor, as the embed job routes.
        actor = min(range(actors), key=lambda a: load[a])
        load[actor] += 1
        ref = pool[actor].embed.remote([r["text"] for r in b])
        in_flight[ref] = (n, actor)
    while in_flight:
        done, _ = ray.wait(list(in_flight), num_returns=1)
        finish(done[0])
    end = time.perf_counter()
    assert texts == len(rows), (texts, len(rows))
    print(json.dumps({
        "texts": texts,
        "startup_s": ready - started,
        "steady_texts_per_s": texts / (end - t0),
        "total_s": end - started,
    }), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
