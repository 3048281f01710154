"""Baseline for encoder_throughput: ONNX Runtime on the same texts.

The encoder graph (BERT, RoBERTa / XLM-RoBERTa or MPNet) is written out
from the model folder's safetensors with ONNX Runtime's fused operators
(Attention, SkipLayerNormalization, BiasGelu; what its transformer
optimizer produces for BERT; MPNet's relative position bias goes in as the
Attention operator's bias), with the folder's pooling (mean or CLS) and
Normalize, then run fp32 and, quantized with ONNX Runtime's dynamic
per-channel int8, again.
Batches are cut from the texts sorted by token length, as Flotilla's
bench does. Before timing, each graph is checked against
sentence-transformers (when importable) on the first 64 texts.

Prints one JSON object per configuration on stdout:
{"config": ..., "precision": ..., "texts_per_s": ..., "texts_per_cpu_s": ...,
 "peak_rss_mib": ..., "min_cosine": ...}

Usage: python ort_throughput.py MODEL_DIR CORPUS N PRECISION:THREADS:BATCH ...
       (PRECISION fp32 or int8; pipe-fp32 or pipe-int8 for the whole
       pipeline: the timing then also covers tokenizing every text with
       Hugging Face tokenizers on one thread, sorting them by length and
       cutting the batches, what a user writes around ONNX Runtime)
"""
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench_corpus import read_texts

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The whole-pipeline rival tokenizes on one thread, as it runs inference.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
MS = "com.microsoft"


def relative_buckets(length, buckets=32, max_distance=128):
    """MPNet's bucket of every (query, key) pair, `[length, length]`."""
    rel = np.arange(length)[None, :] - np.arange(length)[:, None]
    n = -rel
    half = buckets // 2
    ret = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    max_exact = half // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (np.log(np.maximum(n, 1) / max_exact)
                             / np.log(max_distance / max_exact)
                             * (half - max_exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return ret + np.where(n < max_exact, n, large)


def folder_settings(model_dir):
    """Pooling mode, whether vectors are normalised, and the longest
    sequence, as the sentence-transformers folder says."""
    pooling, normalize = "mean", False
    modules_path = os.path.join(model_dir, "modules.json")
    if os.path.exists(modules_path):
        with open(modules_path) as f:
            modules = json.load(f)
        for m in modules:
            kind = m["type"].rsplit(".", 1)[-1]
            if kind == "Pooling":
                with open(os.path.join(model_dir, m["path"], "config.json")) as f:
                    p = json.load(f)
                mode = p.get("pooling_mode")
                if mode is None:
                    mode = "cls" if p.get("pooling_mode_cls_token") else "mean"
                pooling = mode if isinstance(mode, str) else mode[0]
            normalize = normalize or kind == "Normalize"
    max_len = None
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        path = os.path.join(model_dir, name)
        if max_len is None and os.path.exists(path):
            with open(path) as f:
                value = json.load(f).get(key)
            if value is not None and value < 1e9:
                max_len = int(value)
    return pooling, normalize, max_len or 256


def build_graph(model_dir):
    """The encoder as an ONNX model: ids and mask in, pooled (and, where
    the folder says, normalised) vectors out."""
    from safetensors.numpy import load_file

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    kind = cfg["model_type"]
    if kind not in ("bert", "roberta", "xlm-roberta", "mpnet"):
        raise SystemExit(f"model_type {kind!r}: this baseline builds bert, roberta, xlm-roberta, mpnet")
    pooling, normalize, max_len = folder_settings(model_dir)
    if pooling not in ("mean", "cls"):
        raise SystemExit(f"pooling {pooling!r}: this baseline builds mean and cls")
    w = load_file(os.path.join(model_dir, "model.safetensors"))
    w = {k.removeprefix("bert.").removeprefix("roberta.").removeprefix("mpnet."):
         v.astype(np.float32) for k, v in w.items() if v.dtype != np.int64}
    h, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
    offset = 0 if kind == "bert" else cfg.get("pad_token_id", 1) + 1
    mpnet = kind == "mpnet"

    def ln(name, out):
        """The layer norm `name`'s scale and shift as constants `{out}_g`
        and `{out}_b` (stored as weight/bias or gamma/beta)."""
        for g, b in (("weight", "bias"), ("gamma", "beta")):
            if f"{name}.{g}" in w:
                const(f"{out}_g", w[f"{name}.{g}"])
                const(f"{out}_b", w[f"{name}.{b}"])
                return
        raise KeyError(name)

    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(op, inputs, outputs, domain="", **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attrs))
        return outputs[0]

    # Embeddings: word + position (from the family's offset) + token type
    # 0 where the family has types, then LayerNorm.
    const("word", w["embeddings.word_embeddings.weight"])
    const("pos", w["embeddings.position_embeddings.weight"])
    ln("embeddings.LayerNorm", "emb")
    node("Shape", ["input_ids"], ["ids_shape"])
    const("one_i", np.array([1], dtype=np.int64))
    const("two_i", np.array([2], dtype=np.int64))
    const("zero_i", np.array([0], dtype=np.int64))
    const("offset_i", np.array([offset], dtype=np.int64))
    node("Slice", ["ids_shape", "one_i", "two_i"], ["seq"])
    node("Add", ["seq", "offset_i"], ["seq_end"])
    node("Slice", ["pos", "offset_i", "seq_end", "zero_i"], ["pos_s"])
    node("Gather", ["word", "input_ids"], ["we"])
    emb = node("Add", ["we", "pos_s"], ["wp"])
    if "embeddings.token_type_embeddings.weight" in w:
        const("type0", w["embeddings.token_type_embeddings.weight"][0])
        emb = node("Add", ["wp", "type0"], ["wpt"])
    x = node("LayerNormalization", [emb, "emb_g", "emb_b"], ["x0"], axis=-1, epsilon=eps)
    node("Cast", ["attention_mask"], ["mask_i32"], to=TensorProto.INT32)
    attention_inputs = ["mask_i32"]
    if mpnet:
        # The relative position bias of every (query, key) pair up to the
        # longest sequence, sliced to this batch's length.
        table = w["encoder.relative_attention_bias.weight"]  # [buckets, heads]
        buckets = relative_buckets(max_len, cfg.get("relative_attention_num_buckets", 32))
        const("rel_bias", np.ascontiguousarray(table[buckets].transpose(2, 0, 1)))
        node("Slice", ["rel_bias", "zero_i", "seq", "one_i"], ["rel_q"])
        node("Slice", ["rel_q", "zero_i", "seq", "two_i"], ["rel_qk"])
        node("Unsqueeze", ["rel_qk", "zero_i"], ["rel_b"])
        attention_inputs = ["mask_i32", "", "rel_b"]

    names = ({"q": "attention.attn.q", "k": "attention.attn.k", "v": "attention.attn.v",
              "o": "attention.attn.o", "ln1": "attention.LayerNorm"} if mpnet else
             {"q": "attention.self.query", "k": "attention.self.key",
              "v": "attention.self.value", "o": "attention.output.dense",
              "ln1": "attention.output.LayerNorm"})
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        qkv_w = np.concatenate([w[f"{p}.{names[t]}.weight"].T for t in "qkv"], axis=1)
        qkv_b = np.concatenate([w[f"{p}.{names[t]}.bias"] for t in "qkv"])
        const(f"l{i}_qkv_w", qkv_w)
        const(f"l{i}_qkv_b", qkv_b)
        ctx = node("Attention", [x, f"l{i}_qkv_w", f"l{i}_qkv_b", *attention_inputs],
                   [f"l{i}_ctx"], domain=MS, num_heads=heads)
        const(f"l{i}_o_w", w[f"{p}.{names['o']}.weight"].T)
        const(f"l{i}_o_b", w[f"{p}.{names['o']}.bias"])
        ln(f"{p}.{names['ln1']}", f"l{i}_ln1")
        o = node("MatMul", [ctx, f"l{i}_o_w"], [f"l{i}_o"])
        x = node("SkipLayerNormalization",
                 [o, x, f"l{i}_ln1_g", f"l{i}_ln1_b", f"l{i}_o_b"],
                 [f"l{i}_x1"], domain=MS, epsilon=eps)
        const(f"l{i}_i_w", w[f"{p}.intermediate.dense.weight"].T)
        const(f"l{i}_i_b", w[f"{p}.intermediate.dense.bias"])
        const(f"l{i}_f_w", w[f"{p}.output.dense.weight"].T)
        const(f"l{i}_f_b", w[f"{p}.output.dense.bias"])
        ln(f"{p}.output.LayerNorm", f"l{i}_ln2")
        a = node("MatMul", [x, f"l{i}_i_w"], [f"l{i}_a"])
        a = node("BiasGelu", [a, f"l{i}_i_b"], [f"l{i}_g"], domain=MS)
        f_ = node("MatMul", [a, f"l{i}_f_w"], [f"l{i}_f"])
        x = node("SkipLayerNormalization",
                 [f_, x, f"l{i}_ln2_g", f"l{i}_ln2_b", f"l{i}_f_b"],
                 [f"l{i}_x2"], domain=MS, epsilon=eps)

    # The mean over real tokens or the first token, then L2
    # normalisation where the folder lists it.
    if pooling == "mean":
        node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT)
        const("axis2", np.array([2], dtype=np.int64))
        const("axis1", np.array([1], dtype=np.int64))
        node("Unsqueeze", ["mask_f", "axis2"], ["mask3"])
        node("Mul", [x, "mask3"], ["masked"])
        node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0)
        node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0)
        pooled = node("Div", ["summed", "count"], ["pooled"])
    else:
        node("Slice", [x, "zero_i", "one_i", "one_i"], ["first_token"])
        pooled = node("Squeeze", ["first_token", "one_i"], ["pooled"])
    if normalize:
        node("LpNormalization", [pooled], ["embedding"], axis=-1, p=2)
    else:
        node("Identity", [pooled], ["embedding"])

    graph = helper.make_graph(
        nodes, kind,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["b", h])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def main():
    model_dir, corpus, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    configs = sys.argv[4:]
    import onnxruntime as ort
    from tokenizers import Tokenizer

    texts = read_texts(corpus, n)
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.enable_truncation(folder_settings(model_dir)[2])
    tok.no_padding()
    encoded = tok.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i].ids))

    t0 = time.perf_counter()
    work = tempfile.mkdtemp()
    fp32_path = os.path.join(work, "model.onnx")
    onnx.save(build_graph(model_dir), fp32_path)
    int8_path = os.path.join(work, "model.int8.onnx")
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(fp32_path, int8_path, per_channel=True, weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})
    print(json.dumps({"config": "load", "load_s": time.perf_counter() - t0,
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
          flush=True)

    def batches(size, encoded=encoded, order=order):
        for start in range(0, len(order), size):
            rows = [encoded[i].ids for i in order[start:start + size]]
            s = max(len(r) for r in rows)
            ids = np.zeros((len(rows), s), dtype=np.int64)
            mask = np.zeros((len(rows), s), dtype=np.int64)
            for k, r in enumerate(rows):
                ids[k, :len(r)] = r
                mask[k, :len(r)] = 1
            yield ids, mask

    def session(path, threads):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    reference = None
    try:
        from sentence_transformers import SentenceTransformer
        st = SentenceTransformer(model_dir, device="cpu")
        reference = st.encode(texts[:64], batch_size=64, normalize_embeddings=True)
        del st
    except ImportError:
        pass

    for cfg in configs:
        precision, threads, batch = cfg.split(":")
        threads, batch = int(threads), int(batch)
        whole = precision.startswith("pipe-")
        precision = precision.removeprefix("pipe-")
        sess = session(int8_path if precision == "int8" else fp32_path, threads)
        min_cos = None
        if reference is not None:
            enc = tok.encode_batch(texts[:64])
            s = max(len(e.ids) for e in enc)
            ids = np.zeros((64, s), dtype=np.int64)
            mask = np.zeros((64, s), dtype=np.int64)
            for k, e in enumerate(enc):
                ids[k, :len(e.ids)] = e.ids
                mask[k, :len(e.ids)] = 1
            got = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            got = got / np.linalg.norm(got, axis=1, keepdims=True)
            min_cos = float(np.min(np.sum(got * reference, axis=1)))
        first = np.array([encoded[0].ids], dtype=np.int64)
        sess.run(None, {"input_ids": first, "attention_mask": np.ones_like(first)})
        c0, w0 = time.process_time(), time.perf_counter()
        rows = 0
        if whole:
            timed = tok.encode_batch(texts)
            timed_order = sorted(range(len(texts)), key=lambda i: len(timed[i].ids))
            plan = batches(batch, timed, timed_order)
        else:
            plan = batches(batch)
        for ids, mask in plan:
            out = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            rows += out.shape[0]
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        assert rows == len(texts)
        print(json.dumps({
            "config": f"ort {'whole pipeline ' if whole else ''}{precision} threads={threads} batch={batch}",
            "precision": precision,
            "texts_per_s": len(texts) / wall,
            "texts_per_cpu_s": len(texts) / cpu,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "min_cosine": min_cos,
        }), flush=True)


if __name__ == "__main__":
    main()
