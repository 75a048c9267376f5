/*
 * perf_store.c: a throughput probe of the block store with Llama-3.1-8B-shaped blocks (bf16,
 * 32 layers, 8 KV heads, d=128, 16 tokens: 2 MiB a block). Not a ctest case; run by hand:
 *
 *     perf_store [host|cuda|auto] [docs] [tokens-per-doc] [dir]
 *
 * Phases, each timed (GB/s of KV payload): write-back puts into the hot tier, the writer's
 * flush to RocksDB, hot gets, gets after a restart (cold: promotion from RocksDB), and
 * write-through puts (synced). Prints one line per phase.
 */
#include <time.h>

#include "lkv_log.h"
#include "lkv_store.h"
#include "storage_util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static lkv_profile llama(void)
{
    lkv_profile p;
    memset(&p, 0, sizeof p);
    strcpy(p.name, "llama-3.1-8b");
    p.shape = (lkv_kv_shape){32, 32, 8, 128, LKV_DTYPE_BF16, 16};
    p.posenc.kind = LKV_POSENC_ROPE;
    p.posenc.rope_theta = 500000.0;
    p.vocab_size = 128256;
    return p;
}

static lkv_store *open_store(const char *dir, int backend, int durability, uint64_t hot,
                             lkv_profile *p)
{
    lkv_store_config c;
    lkv_store *s;
    memset(&c, 0, sizeof c);
    c.data_dir = dir;
    c.hot_bytes = hot;
    c.hot_backend = backend;
    c.durability = durability;
    c.profiles = p;
    c.n_profiles = 1;
    ASSERT_OK(lkv_store_open(&c, &s));
    return s;
}

static void report(const char *phase, double secs, uint64_t bytes, int docs)
{
    printf("%-28s %4d docs %8.1f MiB %8.3f s %7.2f GB/s\n", phase, docs, (double)bytes / 1048576.0,
           secs, (double)bytes / secs / 1e9);
}

int main(int argc, char **argv)
{
    int backend = LKV_HOT_HOST;
    int docs = argc > 2 ? atoi(argv[2]) : 16;
    uint32_t ntok = argc > 3 ? (uint32_t)atoi(argv[3]) : 256;
    if (argc > 1) {
        ASSERT_OK(lkv_hot_backend_parse(argv[1], &backend));
    }
    char *dir = argc > 4 ? strdup(argv[4]) : su_tmpdir();
    lkv_profile p = llama();
    ASSERT_OK(lkv_profile_finish(&p, NULL, 0));
    uint64_t bb = lkv_block_bytes(&p.shape);
    uint32_t nb = lkv_blocks_for_tokens(&p.shape, ntok);
    uint64_t doc_bytes = nb * bb, total = doc_bytes * (uint64_t)docs;
    uint64_t hot = total + 4 * doc_bytes;
    uint8_t *kv = malloc(doc_bytes), *out = malloc(doc_bytes);
    uint32_t *tok = malloc(sizeof(uint32_t) * ntok);
    lkv_dockey *keys = calloc((size_t)docs, sizeof(lkv_dockey));
    uint8_t salt[32] = {0};
    su_fill_doc(&p.shape, ntok, 1, kv);
    lkv_log_set_level(LKV_LOG_WARN);

    lkv_store *s = open_store(dir, backend, LKV_DURABILITY_WRITE_BACK, hot, &p);
    lkv_store_arena_info ai;
    lkv_store_arena_info_get(s, &ai);
    printf("backend %s, block %llu bytes, %u blocks per doc\n",
           ai.backend == LKV_HOT_CUDA ? "cuda" : "host", (unsigned long long)bb, nb);
    double t = now_s();
    for (int d = 0; d < docs; d++) {
        su_tokens(tok, ntok, (uint64_t)d, p.vocab_size);
        ASSERT_OK(lkv_store_put_all(s, salt, p.name, tok, ntok, kv, doc_bytes, &keys[d]));
    }
    report("put write-back (hot)", now_s() - t, total, docs);
    t = now_s();
    ASSERT_OK(lkv_store_flush(s));
    report("flush to RocksDB", now_s() - t, total, docs);
    t = now_s();
    for (int d = 0; d < docs; d++) {
        ASSERT_OK(lkv_store_get_all(s, &keys[d], out, doc_bytes, NULL));
    }
    report("get hot", now_s() - t, total, docs);
    ASSERT_TRUE(memcmp(out, kv, doc_bytes) == 0);
    ASSERT_OK(lkv_store_close(s));

    s = open_store(dir, backend, LKV_DURABILITY_WRITE_BACK, hot, &p);
    t = now_s();
    for (int d = 0; d < docs; d++) {
        ASSERT_OK(lkv_store_get_all(s, &keys[d], out, doc_bytes, NULL));
    }
    report("get cold (promote)", now_s() - t, total, docs);
    ASSERT_TRUE(memcmp(out, kv, doc_bytes) == 0);
    for (int d = 0; d < docs; d++) {
        ASSERT_OK(lkv_store_delete(s, &keys[d]));
    }
    ASSERT_OK(lkv_store_close(s));

    s = open_store(dir, backend, LKV_DURABILITY_WRITE_THROUGH, hot, &p);
    t = now_s();
    for (int d = 0; d < docs; d++) {
        su_tokens(tok, ntok, (uint64_t)d + 1000000, p.vocab_size);
        ASSERT_OK(lkv_store_put_all(s, salt, p.name, tok, ntok, kv, doc_bytes, &keys[d]));
    }
    report("put write-through (synced)", now_s() - t, total, docs);
    ASSERT_OK(lkv_store_close(s));
    su_rmdir(dir);
    free(kv);
    free(out);
    free(tok);
    free(keys);
    return 0;
}
