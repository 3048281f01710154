"""Builds small random-weight sentence-transformers models of every family and
folder feature `flotilla-embed` supports, and sentence-transformers' own
vectors of a set of texts on each: the references of tests/families.rs.

Every model is made from fixed seeds: BERT and MPNet with a WordPiece
vocabulary and XLM-RoBERTa with a SentencePiece unigram model, both trained
here on a small English, Chinese and mixed-script corpus. Weights are drawn
wider than transformers' initialisation (and the relative attention bias of
MPNet much wider) so that every part of the encoder moves the vectors.

Usage: python make_test_models.py OUT [REAL_MODEL_DIR ...]   (needs
sentence-transformers, torch, transformers, sentencepiece and protobuf:
scripts/fetch-test-tools)

Writes OUT/<model>/ (a folder as sentence-transformers saves it) and
OUT/references.json. Each REAL_MODEL_DIR (a published model installed from
a package registry, all-mpnet-base-v2 for one) is linked in as
OUT/<its name> and gets references too, over-length texts included.
"""
import json
import os
import random
import shutil
import sys
import tempfile

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Dense, Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling

CORPUS_EN = [
    "the quick brown fox jumps over the lazy dog",
    "a batch of texts becomes a batch of vectors",
    "supervisors restart what fails within limits",
    "placement groups pack or spread bundles over nodes",
    "embeddings of similar sentences lie close together",
    "the head keeps the membership of the cluster",
    "models are loaded once and kept resident in memory",
    "numbers like 42 and 3.14 appear in text too",
]
CORPUS_ZH = [
    "北京欢迎你，上海也很好",
    "东京是日本的首都",
    "机器学习模型把句子变成向量",
    "今天天气很好，我们去公园散步",
    "分布式系统需要容错和监督",
]
CORPUS_MIXED = [
    "emoji 🚀 and accents déjà vu in café",
    "Ελληνικά και русский текст together",
    "混合 script 文本 with English words",
]

TEXTS = [
    "a short sentence",
    "the quick brown fox jumps over the lazy dog",
    "北京欢迎你，上海也很好",
    "机器学习模型把句子变成向量",
    "混合 script 文本 with English words and 数字 42",
    "Ελληνικά και русский текст together with 🚀",
    "naïve café — déjà vu",
    "The Quick BROWN Fox visits İstanbul and ÉLAN",
    " ".join(f"token{i} 东京 placement" for i in range(60)),
]

MAX_SEQ_LENGTH = 40

# Past every real model's max_seq_length too (all-mpnet-base-v2: 384).
REAL_TEXTS = TEXTS + [" ".join(f"token{i} 东京 placement" for i in range(200))]


def corpus():
    rng = random.Random(7)
    lines = CORPUS_EN + CORPUS_ZH + CORPUS_MIXED
    out = []
    for _ in range(400):
        a, b = rng.choice(lines), rng.choice(lines)
        out.append(f"{a} {b}")
    return out + lines


def wordpiece_vocab(workdir):
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(corpus(), vocab_size=600, min_frequency=1)
    path = os.path.join(workdir, "vocab.txt")
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    with open(path, "w", encoding="utf-8") as f:
        for token, _ in vocab:
            f.write(token + "\n")
    return path


def sentencepiece_vocab(workdir):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    text = os.path.join(workdir, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus()))
    prefix = os.path.join(workdir, "spm")
    spm.SentencePieceTrainer.train(
        f"--input={text} --model_prefix={prefix} --vocab_size=160 --model_type=unigram --hard_vocab_limit=false "
        "--character_coverage=1.0 --num_threads=1 --minloglevel=2"
    )
    proto = sentencepiece_model_pb2.ModelProto()
    with open(prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
    # XLM-R's layout: <s> <pad> </s> <unk>, the pieces, then <mask>.
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    for piece in proto.pieces:
        if piece.type == 1:  # NORMAL
            vocab.append((piece.piece, piece.score))
    vocab.append(("<mask>", 0.0))
    return vocab, proto.normalizer_spec.precompiled_charsmap


def widen(model, seed):
    """Draws every parameter wider than the default initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "relative_attention_bias" in name:
                p.copy_(1.5 * torch.randn(p.shape, generator=g))
            elif "embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def bert(workdir, vocab_file, hidden, heads, seed, act="gelu", cased=False):
    from transformers import BertConfig, BertModel, BertTokenizer

    words = [line.rstrip("\n") for line in open(vocab_file, encoding="utf-8")]
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(words)}, do_lower_case=not cased)
    config = BertConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
        intermediate_size=2 * hidden, max_position_embeddings=64, hidden_act=act,
    )
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=False)
    widen(model, seed)
    return save_hf(workdir, f"bert-{seed}", model, tok)


def mpnet(workdir, vocab_file, hidden, heads, seed):
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizer

    words = [line.rstrip("\n") for line in open(vocab_file, encoding="utf-8")]
    vocab = {w: i for i, w in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + words + ["<mask>"])}
    tok = MPNetTokenizer(vocab=vocab, do_lower_case=True, unk_token="[UNK]")
    config = MPNetConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
        intermediate_size=2 * hidden, max_position_embeddings=66, pad_token_id=1,
    )
    torch.manual_seed(seed)
    model = MPNetModel(config, add_pooling_layer=False)
    widen(model, seed)
    return save_hf(workdir, f"mpnet-{seed}", model, tok)


def xlm_roberta(workdir, vocab, charsmap, hidden, heads, seed):
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizer

    tok = XLMRobertaTokenizer(vocab=vocab, _spm_precompiled_charsmap=charsmap)
    config = XLMRobertaConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
        intermediate_size=2 * hidden, max_position_embeddings=66, type_vocab_size=1,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    model = XLMRobertaModel(config, add_pooling_layer=False)
    widen(model, seed)
    return save_hf(workdir, f"xlmr-{seed}", model, tok)


def save_hf(workdir, name, model, tok):
    # A tokenizer that knows the corpus: no word of an English text is unknown.
    ids = tok(TEXTS[1].lower())["input_ids"]
    assert len(tok) > 100 and tok.unk_token_id not in ids, f"{name}: vocabulary not loaded"
    path = os.path.join(workdir, name)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def sentence_model(hf_dir, pooling, *, include_prompt=True, dense=None, normalize=True,
                   prompts=None, default_prompt_name=None, similarity=None, seed=0):
    transformer = Transformer(hf_dir, max_seq_length=MAX_SEQ_LENGTH)
    dim = transformer.get_embedding_dimension()
    modules = [transformer, Pooling(dim, pooling_mode=pooling, include_prompt=include_prompt)]
    width = modules[1].get_embedding_dimension() if hasattr(modules[1], "get_embedding_dimension") \
        else dim * (len(pooling) if isinstance(pooling, tuple) else 1)
    if dense is not None:
        out, activation = dense
        layer = Dense(width, out, activation_function=activation)
        g = torch.Generator().manual_seed(seed + 1000)
        with torch.no_grad():
            layer.linear.weight.copy_(0.3 * torch.randn(layer.linear.weight.shape, generator=g))
            layer.linear.bias.copy_(0.3 * torch.randn(layer.linear.bias.shape, generator=g))
        modules.append(layer)
    if normalize:
        modules.append(Normalize())
    kwargs = {}
    if prompts:
        kwargs["prompts"] = prompts
        kwargs["default_prompt_name"] = default_prompt_name
    if similarity:
        kwargs["similarity_fn_name"] = similarity
    return SentenceTransformer(modules=modules, device="cpu", **kwargs)


def legacy_layout(folder, lower=False):
    """Rewrites a saved folder in the layout of sentence-transformers 2.x,
    as Hub models carry it: pooling_mode_*_tokens flags, the old module
    class paths, word_embedding_dimension, and do_lower_case in
    sentence_bert_config.json (which newer versions fold into the saved
    tokenizer instead)."""
    pooling_path = os.path.join(folder, "1_Pooling", "config.json")
    with open(pooling_path) as f:
        cfg = json.load(f)
    modes = cfg["pooling_mode"] if isinstance(cfg["pooling_mode"], list) else [cfg["pooling_mode"]]
    legacy = {
        "word_embedding_dimension": cfg["embedding_dimension"],
        "pooling_mode_cls_token": "cls" in modes,
        "pooling_mode_mean_tokens": "mean" in modes,
        "pooling_mode_max_tokens": "max" in modes,
        "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens" in modes,
        "pooling_mode_weightedmean_tokens": "weightedmean" in modes,
        "pooling_mode_lasttoken": "lasttoken" in modes,
        "include_prompt": cfg.get("include_prompt", True),
    }
    with open(pooling_path, "w") as f:
        json.dump(legacy, f, indent=2)
    modules_path = os.path.join(folder, "modules.json")
    with open(modules_path) as f:
        modules = json.load(f)
    for m in modules:
        m["type"] = "sentence_transformers.models." + m["type"].rsplit(".", 1)[-1]
    with open(modules_path, "w") as f:
        json.dump(modules, f, indent=2)
    sbert_path = os.path.join(folder, "sentence_bert_config.json")
    with open(sbert_path) as f:
        sbert = json.load(f)
    with open(sbert_path, "w") as f:
        json.dump({"max_seq_length": sbert.get("max_seq_length", MAX_SEQ_LENGTH),
                   "do_lower_case": lower}, f, indent=2)


def cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def references(name, model, folder, cases, texts=TEXTS):
    tok = model.tokenizer
    out = {"model": name, "cases": []}
    for case in cases:
        prompt = case.get("prompt")
        kwargs = {}
        if prompt is not None:
            kwargs["prompt"] = prompt
        if case.get("prompt_name") is not None:
            kwargs["prompt_name"] = case["prompt_name"]
        if case.get("dim") is not None:
            kwargs["truncate_dim"] = case["dim"]
            kwargs["normalize_embeddings"] = True
        vectors = model.encode(texts, batch_size=1, convert_to_tensor=True, **kwargs)
        text_prompt = prompt
        if case.get("prompt_name") is not None:
            text_prompt = model.prompts[case["prompt_name"]]
        items = []
        for text, vec in zip(texts, vectors):
            full = (text_prompt or "") + text
            ids = tok(full, truncation=True, max_length=model.max_seq_length)["input_ids"]
            items.append({"text": text, "token_ids": ids, "embedding": [float(v) for v in vec]})
        out["cases"].append({**case, "sentences": items})
    return out


def main():
    out = sys.argv[1]
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    torch.set_num_threads(1)
    work = tempfile.mkdtemp()
    vocab_file = wordpiece_vocab(work)
    spm_vocab, charsmap = sentencepiece_vocab(work)

    bert_a = bert(work, vocab_file, 64, 2, 1)
    bert_b = bert(work, vocab_file, 48, 4, 2, act="gelu_new")
    bert_cased = bert(work, vocab_file, 48, 4, 5, cased=True)
    mp = mpnet(work, vocab_file, 64, 4, 3)
    xl = xlm_roberta(work, spm_vocab, charsmap, 48, 4, 4)

    plain = [{}]
    prompted = [{"prompt": "query: "}, {"prompt_name": "passage"}]
    specs = [
        # name, hf folder, pooling, options, cases
        ("bert-mean-normalize", bert_a, "mean", {}, plain + [{"dim": 16}]),
        ("bert-cls", bert_a, "cls", {"normalize": False}, plain),
        ("bert-max", bert_b, "max", {"normalize": False}, plain),
        ("bert-mean-sqrt-len", bert_b, "mean_sqrt_len_tokens", {}, plain),
        ("bert-weightedmean", bert_a, "weightedmean", {"normalize": False}, plain),
        ("bert-lasttoken", bert_b, "lasttoken", {}, plain),
        ("bert-cls-max-mean-dense-tanh", bert_a, ("cls", "max", "mean"),
         {"dense": (32, torch.nn.Tanh())}, plain),
        ("bert-mean-prompt-excluded", bert_b, "mean",
         {"include_prompt": False, "prompts": {"query": "query: ", "passage": "passage: "},
          "default_prompt_name": "query"}, [{"prompt_name": "query"}, {"prompt": "represent this: "}]),
        ("bert-cls-legacy-layout", bert_a, "cls", {"legacy": True}, plain),
        # A cased tokenizer whose folder asks for lower-cased input.
        ("bert-mean-legacy-lowercase", bert_cased, "mean", {"legacy": True, "lower": True}, plain),
        ("mpnet-mean-normalize", mp, "mean", {"similarity": "dot"}, plain + [{"dim": 32}]),
        ("mpnet-cls-dense-identity", mp, "cls", {"dense": (24, torch.nn.Identity()), "normalize": False},
         plain),
        ("xlmr-cls-normalize", xl, "cls", {"prompts": {"query": "query: ", "passage": "passage: "}},
         plain + prompted),
        ("xlmr-mean-normalize", xl, "mean", {}, plain + [{"dim": 24}]),
    ]
    refs = []
    for i, (name, hf, pooling, opts, cases) in enumerate(specs):
        legacy = opts.pop("legacy", False)
        lower = opts.pop("lower", False)
        model = sentence_model(hf, pooling, seed=i, **opts)
        folder = os.path.join(out, name)
        model.save(folder)
        if legacy:
            legacy_layout(folder, lower)
        # The saved folder is what is tested: reload it as a user would.
        model = SentenceTransformer(folder, device="cpu")
        refs.append(references(name, model, folder, cases))

    for real in sys.argv[2:]:
        name = os.path.basename(os.path.normpath(real))
        os.symlink(os.path.abspath(real), os.path.join(out, name))
        model = SentenceTransformer(real, device="cpu")
        refs.append(references(name, model, real, [{}, {"prompt": "query: "}, {"dim": 256}],
                               texts=REAL_TEXTS))

    # The parts that must matter do: without MPNet's relative attention
    # bias, or XLM-R's position offset, the vectors differ.
    check = SentenceTransformer(os.path.join(out, "mpnet-mean-normalize"), device="cpu")
    before = check.encode(TEXTS[1], convert_to_tensor=True)
    with torch.no_grad():
        check[0].model.encoder.relative_attention_bias.weight.zero_()
    after = check.encode(TEXTS[1], convert_to_tensor=True)
    assert cosine(before, after) < 0.999, "MPNet's relative attention bias does not move the vectors"

    with open(os.path.join(out, "references.json"), "w", encoding="utf-8") as f:
        json.dump({"made_by": "sentence-transformers, fp32, CPU, each text alone",
                   "max_seq_length": MAX_SEQ_LENGTH, "models": refs}, f)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
