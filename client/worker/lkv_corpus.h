/*
 * lkv_corpus.h: a small corpus of short stories written by the model itself, for the demo and
 * the worker benchmark: story i starts from "<name i> found <thing i>." and is continued by the
 * worker locally (no cache), sampling at temperature 0.8, top-p 0.9, seed i + 1, up to
 * max_tokens tokens or an end token. Deterministic for a given model.
 */
#ifndef LKV_CORPUS_H
#define LKV_CORPUS_H

#include "lkv_worker.h"

/* Writes n stories into *texts (an array of n malloc'ed strings, owned by the caller: free with
 * lkv_corpus_free). Returns 0, or the worker's error (message on stderr). */
int lkv_corpus_make(lkv_worker *w, int n, int max_tokens, char ***texts);

/* Frees n texts and the array. */
void lkv_corpus_free(char **texts, int n);

#endif
