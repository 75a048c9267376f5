#!/usr/bin/python3
"""A RAG pipeline that reuses document KV through lazykv.

For each question:
  1. retrieve the ids of the k most relevant documents (a toy word-overlap retriever);
  2. Lookup all of them in lazykv at once (counted as hits and misses by the daemon);
  3. for each miss, compute the document's KV in isolation from position 0 and Put it;
  4. Get every document's KV (blocks in the kernels/lkv_layout.h layout), ready for a decode
     worker whose LazyAttention kernels place each document at its position in this prompt.

STAND-IN, NOT A MODEL: `compute_kv` fabricates deterministic bytes of the right size for the
tiny "stories260k" profile (5 layers, 4 KV heads, head_dim 8, f32, 16 tokens per block) instead
of running the model, and `tokenize` is a toy byte-level tokenizer into its 512-token vocabulary.
A real pipeline calls its model's prefill there (the reference decode worker does that).

Run against a daemon on loopback (no token needed there by default):
    PYTHONPATH=build/python /usr/bin/python3 client/python/examples/rag_pipeline.py \\
        --target 127.0.0.1:7070 [--token TOKEN]
"""

import argparse
import time

import lazykv

PROFILE = "stories260k"
N_LAYERS, N_KV_HEADS, HEAD_DIM, ELEM, BLOCK_TOKENS, VOCAB = 5, 4, 8, 4, 16, 512
BLOCK_BYTES = N_LAYERS * 2 * N_KV_HEADS * BLOCK_TOKENS * HEAD_DIM * ELEM  # 20480

CORPUS = {
    "lily": "Lily loved to play outside in the park with her big red ball.",
    "ben": "Ben had a small dog named Max who liked to run and jump in the garden.",
    "sun": "The sun was warm and bright, so the children went to the beach to swim.",
    "cake": "Mom baked a sweet cake for the party and everyone sang a happy song.",
    "tree": "A tall tree grew near the river, and birds built a nest in its branches.",
    "rain": "When the rain came, Tim and Sue stayed inside and read a book together.",
}
QUESTIONS = [
    "What did Lily play with in the park?",
    "Where did the children swim when the sun was bright?",
    "What did Lily and Ben do in the garden and the park?",
    "Who baked a cake for the party?",
]


def tokenize(text):
    """Toy tokenizer (stand-in): bytes folded into the 512-token vocabulary."""
    return [(b * 3 + i % 7) % VOCAB for i, b in enumerate(text.encode())]


def retrieve(question, k=2):
    """Toy retriever: the k documents sharing the most words with the question."""
    q = set(question.lower().replace("?", "").split())
    scored = sorted(CORPUS, key=lambda d: (-len(q & set(CORPUS[d].lower().split())), d))
    return scored[:k]


def compute_kv(tokens):
    """STAND-IN for the model's prefill of one document at positions 0..n-1: returns
    ceil(n / 16) deterministic blocks of BLOCK_BYTES, unused slots of the last block zero."""
    blocks = []
    for b in range(0, len(tokens), BLOCK_TOKENS):
        chunk = tokens[b:b + BLOCK_TOKENS]
        row = bytearray(BLOCK_TOKENS * HEAD_DIM * ELEM)  # One (layer, K|V, head) slab.
        for t, tok in enumerate(chunk):
            row[t * HEAD_DIM * ELEM:(t + 1) * HEAD_DIM * ELEM] = bytes([tok % 251 + 1]) * 32
        blocks.append(bytes(row) * (N_LAYERS * 2 * N_KV_HEADS))
    return blocks


def answer(kv, question, k=2, log=print):
    """Runs steps 1-4 for one question; returns (hits, misses, {doc id: lazykv.Document})."""
    ids = retrieve(question, k)
    docs = [lazykv.Doc(PROFILE, tokenize(CORPUS[d])) for d in ids]
    status = kv.lookup(docs)
    hits = misses = 0
    for doc_id, doc, st in zip(ids, docs, status):
        if st.present:
            hits += 1
            continue
        misses += 1
        kv.put(PROFILE, doc.tokens, compute_kv(list(doc.tokens)))  # Miss: compute and store.
    kvs = {d: kv.get(profile=PROFILE, tokens=doc.tokens) for d, doc in zip(ids, docs)}
    # A decode worker would now prefill the question against these segments, in order.
    log(f"{question!r}: docs {ids}, {hits} hit(s), {misses} miss(es), "
        f"{sum(x.n_blocks for x in kvs.values())} blocks fetched")
    return hits, misses, kvs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="127.0.0.1:7070")
    ap.add_argument("--token", default=None, help="bearer token of a tenant with role data")
    ap.add_argument("-k", type=int, default=2, help="documents retrieved per question")
    args = ap.parse_args()
    t0 = time.perf_counter()
    total_hits = total_misses = 0
    with lazykv.Client(args.target, token=args.token, timeout=30) as kv:
        for q in QUESTIONS:
            h, m, _ = answer(kv, q, args.k)
            total_hits += h
            total_misses += m
    print(f"{total_hits} hits, {total_misses} misses in {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
