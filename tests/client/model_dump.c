/*
 * model_dump.c: writes the QKV dump of the tiny model (format in client/lkv_model.h) for a
 * fixed prompt [doc_a][doc_b][question], for GPU kernel checks that cannot run the model.
 *
 *   model_dump MODEL_DIR OUT_FILE [BLOCK_TOKENS (16)] [DTYPE f32|f16|bf16 (f32)]
 *
 * MODEL_DIR holds stories260K.bin and tok512.bin. Prints the dump's dimensions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_model.h"
#include "lkv_tokenizer.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR OUT_FILE [BLOCK_TOKENS] [f32|f16|bf16]\n", argv[0]);
        return 2;
    }
    int bt = argc > 3 ? atoi(argv[3]) : 16;
    int dtype = LKV_DTYPE_F32;
    if (argc > 4) {
        dtype = strcmp(argv[4], "f16") == 0    ? LKV_DTYPE_F16
                : strcmp(argv[4], "bf16") == 0 ? LKV_DTYPE_BF16
                                               : LKV_DTYPE_F32;
    }
    char path[4096];
    lkv_model *m;
    lkv_tokenizer tok;
    snprintf(path, sizeof path, "%s/stories260K.bin", argv[1]);
    int rc = lkv_model_load(path, &m);
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", path, lkv_strerror(rc));
        return 1;
    }
    snprintf(path, sizeof path, "%s/tok512.bin", argv[1]);
    rc = lkv_tokenizer_load(&tok, path, m->cfg.vocab_size);
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", path, lkv_strerror(rc));
        return 1;
    }
    int a[256], b[256], q[256], na, nb, nq;
    lkv_tokenizer_encode(&tok, "Lily went to the park with her mom. They saw a big tree.", 1, a,
                         256, &na);
    lkv_tokenizer_encode(&tok, "Tom had a red ball. He liked to throw it high in the sky.", 0, b,
                         256, &nb);
    lkv_tokenizer_encode(&tok, "One day, Lily and Tom", 0, q, 256, &nq);
    lkv_qkv_dump d;
    rc = lkv_qkv_dump_make(m, a, na, b, nb, q, nq, bt, dtype, &d);
    if (rc == 0) {
        rc = lkv_qkv_dump_write(argv[2], &d);
    }
    if (rc != 0) {
        fprintf(stderr, "dump: %s\n", lkv_strerror(rc));
        return 1;
    }
    printf("%s: layers %d, heads %d/%d, head_dim %d, dtype %d, B %d, pages %u, prefill %d tokens "
           "at %lld over %d refs, decode at %lld over %d refs\n",
           argv[2], d.shape.n_layers, d.shape.n_q_heads, d.shape.n_kv_heads, d.shape.head_dim,
           d.shape.dtype, d.shape.block_tokens, d.n_pages, d.n_new, (long long)d.new_start,
           d.n_refs, (long long)d.dec_pos, d.n_dec_refs);
    lkv_qkv_dump_free(&d);
    lkv_tokenizer_free(&tok);
    lkv_model_destroy(m);
    return 0;
}
