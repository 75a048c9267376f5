/*
 * lkv_tokenizer.h: the llama2.c tokenizer (tok512.bin and friends): load, encode (byte-level
 * BPE by merge score, as llama2.c run.c) and decode one token to text.
 *
 * File format (little-endian): int32 max_token_length, then per token: float32 score, int32
 * len, len bytes of text (no NUL). Ids 0/1/2 are <unk>, <s> (BOS), </s> (EOS); ids 3..258 are
 * the byte fallbacks <0x00>..<0xFF>. Depends only on common/.
 */
#ifndef LKV_TOKENIZER_H
#define LKV_TOKENIZER_H

#define LKV_TOK_BOS 1
#define LKV_TOK_EOS 2

typedef struct lkv_tokenizer {
    int vocab_size;     /* Tokens. */
    int max_token_len;  /* From the file header. */
    char **pieces;      /* [vocab_size] NUL-terminated texts. Owned. */
    float *scores;      /* [vocab_size] merge scores. Owned. */
    char bytes[256][2]; /* Single-byte strings for the byte fallbacks. */
} lkv_tokenizer;

/* Loads path, expecting vocab_size tokens, into *t (caller-owned struct; free the contents with
 * lkv_tokenizer_free). Returns 0, LKV_EIO (cannot open or short read) or LKV_ECORRUPT. */
int lkv_tokenizer_load(lkv_tokenizer *t, const char *path, int vocab_size);

/* Frees what lkv_tokenizer_load allocated. Safe on a zeroed struct. */
void lkv_tokenizer_free(lkv_tokenizer *t);

/* Encodes NUL-terminated text: optional BOS, a dummy-prefix space when text is not empty, one
 * token per UTF-8 character (or its bytes), then greedy merges of the best-scoring pair.
 * Writes at most cap ids to tokens (caller-owned) and the count to *n. Returns 0, or
 * LKV_ENOSPC if cap is too small. */
int lkv_tokenizer_encode(const lkv_tokenizer *t, const char *text, int bos, int *tokens, int cap,
                         int *n);

/* Returns the text of token (borrowed from t, valid until lkv_tokenizer_free): a byte fallback
 * becomes its byte, and a leading space is dropped right after BOS (prev == LKV_TOK_BOS). Returns
 * "" for an id out of range. */
const char *lkv_tokenizer_decode(const lkv_tokenizer *t, int prev, int token);

#endif
