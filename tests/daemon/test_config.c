/*
 * test_config.c: lazykvd configuration parsing (daemon/lkv_config.c): defaults, the shipped
 * daemon/lazykvd.conf, good and bad files, command-line overrides, and that every error names
 * the option at fault.
 */
#include <string.h>

#include "lkv_arena.h"
#include "lkv_config.h"
#include "lkv_log.h"
#include "lkv_policy.h"
#include "lkv_test.h"

#ifndef LKV_SOURCE_DIR
#error "LKV_SOURCE_DIR must be defined"
#endif

static char err[LKV_CONFIG_ERR_MAX];

/* Runs lkv_config_from_args on a NULL-terminated argument list. */
static int from_args(lkv_config *c, int *action, const char **args)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"lazykvd";
    for (int i = 0; args[i] != NULL; i++) {
        argv[argc++] = (char *)args[i];
    }
    argv[argc] = NULL;
    err[0] = '\0';
    return lkv_config_from_args(c, argc, argv, action, err, sizeof(err));
}

/* Asserts err contains needle. */
#define ASSERT_ERR_HAS(needle)                                                                     \
    do {                                                                                           \
        if (strstr(err, (needle)) == NULL) {                                                       \
            LKV_FAIL("error message '%s' lacks '%s'", err, (needle));                              \
        }                                                                                          \
    } while (0)

static void test_defaults(void)
{
    static lkv_config c;
    int action;
    const char *args[] = {NULL};
    ASSERT_OK(from_args(&c, &action, args));
    ASSERT_EQ(action, LKV_CONFIG_RUN);
    ASSERT_TRUE(strcmp(c.listen, "127.0.0.1:7070") == 0);
    ASSERT_TRUE(strcmp(c.data_dir, "./data/lazykvd") == 0);
    ASSERT_EQ(c.hot_bytes, 1ull << 30);
    ASSERT_EQ(c.hot_backend, LKV_HOT_AUTO);
    ASSERT_EQ(c.durability, LKV_DURABILITY_WRITE_BACK);
    ASSERT_EQ(c.policy_kind, LKV_POLICY_ADAPTIVE);
    ASSERT_EQ(c.max_message_bytes, 64ull << 20);
    ASSERT_EQ(c.threads, 2);
    ASSERT_EQ(c.pool_threads, 4);
    ASSERT_EQ(c.log_level, LKV_LOG_INFO);
    ASSERT_EQ(c.shutdown_grace_ms, 5000);
    ASSERT_EQ(c.max_calls_per_peer, 4096);
    ASSERT_EQ(c.tls_max_streams, 1024);
    ASSERT_EQ(c.tls_handshake_timeout_ms, 10000);
    ASSERT_EQ(c.tls_idle_timeout_ms, 30 * 60000);
    ASSERT_EQ(c.n_profiles, 2);
    const lkv_profile *s = lkv_config_profile(&c, "stories260k");
    ASSERT_TRUE(s != NULL);
    ASSERT_EQ(s->shape.n_layers, 5);
    ASSERT_EQ(s->shape.n_q_heads, 8);
    ASSERT_EQ(s->shape.n_kv_heads, 4);
    ASSERT_EQ(s->shape.head_dim, 8);
    ASSERT_EQ(s->shape.dtype, LKV_DTYPE_F32);
    ASSERT_EQ(s->posenc.rope_pairing, LKV_ROPE_INTERLEAVED);
    ASSERT_EQ(s->vocab_size, 512);
    ASSERT_EQ(lkv_block_bytes(&s->shape), 20480);
    const lkv_profile *l = lkv_config_profile(&c, "llama-3.1-8b");
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(lkv_block_bytes(&l->shape), 2u << 20);
    ASSERT_EQ(l->posenc.rope_scaling, LKV_ROPE_SCALING_LLAMA3);
    ASSERT_NEAR(l->posenc.rope_theta, 500000.0, 0);
    ASSERT_NEAR(l->posenc.scaling_factor, 8.0, 0);
    ASSERT_NEAR(l->posenc.high_freq_factor, 4.0, 0);
    ASSERT_NEAR(l->posenc.original_max_pos, 8192.0, 0);
    ASSERT_EQ(l->vocab_size, 128256);
    /* Fingerprints were computed and differ. */
    ASSERT_TRUE(memcmp(s->fingerprint, l->fingerprint, 32) != 0);
}

/* The shipped file states exactly the defaults. */
static void test_shipped_file_equals_defaults(void)
{
    static lkv_config a, b;
    int action;
    const char *none[] = {NULL};
    ASSERT_OK(from_args(&a, &action, none));
    const char *args[] = {"--config", LKV_SOURCE_DIR "/daemon/lazykvd.conf", NULL};
    if (from_args(&b, &action, args) != 0) {
        LKV_FAIL("shipped config: %s", err);
    }
    ASSERT_TRUE(strcmp(a.listen, b.listen) == 0);
    ASSERT_TRUE(strcmp(a.data_dir, b.data_dir) == 0);
    ASSERT_EQ(a.hot_bytes, b.hot_bytes);
    ASSERT_EQ(a.cold_bytes, b.cold_bytes);
    ASSERT_EQ(a.hot_backend, b.hot_backend);
    ASSERT_EQ(a.cuda_device, b.cuda_device);
    ASSERT_EQ(a.get_staging, b.get_staging);
    ASSERT_EQ(a.get_stage_slots, b.get_stage_slots);
    ASSERT_EQ(a.get_stage_wait_ms, b.get_stage_wait_ms);
    ASSERT_EQ(a.policy_kind, b.policy_kind);
    ASSERT_EQ(a.policy_cost_bytes, b.policy_cost_bytes);
    ASSERT_EQ(a.durability, b.durability);
    ASSERT_EQ(a.threads, b.threads);
    ASSERT_EQ(a.max_message_bytes, b.max_message_bytes);
    ASSERT_EQ(a.log_level, b.log_level);
    ASSERT_EQ(a.shutdown_grace_ms, b.shutdown_grace_ms);
    ASSERT_EQ(a.evicted_memory, b.evicted_memory);
    ASSERT_EQ(a.max_connections_per_peer, b.max_connections_per_peer);
    ASSERT_EQ(a.max_calls_per_peer, b.max_calls_per_peer);
    ASSERT_EQ(a.tls_max_streams, b.tls_max_streams);
    ASSERT_EQ(a.tls_handshake_timeout_ms, b.tls_handshake_timeout_ms);
    ASSERT_EQ(a.tls_idle_timeout_ms, b.tls_idle_timeout_ms);
    ASSERT_EQ(a.cold_min_blob_bytes, b.cold_min_blob_bytes);
    ASSERT_EQ(a.loopback_roles, b.loopback_roles);
    ASSERT_EQ(a.allow_insecure_bind, b.allow_insecure_bind);
    ASSERT_EQ(a.have_auth_key, b.have_auth_key);
    ASSERT_EQ(a.n_tenants, b.n_tenants);
    ASSERT_EQ(a.n_profiles, b.n_profiles);
    for (int i = 0; i < a.n_profiles; i++) {
        ASSERT_TRUE(strcmp(a.profiles[i].name, b.profiles[i].name) == 0);
        ASSERT_TRUE(memcmp(a.profiles[i].fingerprint, b.profiles[i].fingerprint, 32) == 0);
        ASSERT_EQ(a.profiles[i].max_doc_tokens, b.profiles[i].max_doc_tokens);
    }
    ASSERT_TRUE(strstr(b.source, "lazykvd.conf") != NULL);
}

/* The Get staging ring's options: defaults, every name, bounds, and a bad name named. */
static void test_get_staging(void)
{
    static lkv_config c;
    char err[LKV_CONFIG_ERR_MAX];
    lkv_config_defaults(&c);
    ASSERT_EQ(c.get_staging, LKV_GET_STAGING_AUTO);
    ASSERT_EQ(c.get_stage_slots, 64);
    ASSERT_EQ(c.get_stage_wait_ms, 200);
    ASSERT_EQ(c.get_stage_streams, 1);
    lkv_store_config sc;
    lkv_config_to_store(&c, &sc);
    ASSERT_EQ(sc.cuda_read_streams, 1);
    ASSERT_OK(lkv_config_load_string(&c, "get_stage_streams = 4\n", "t.conf", err, sizeof(err)));
    lkv_config_to_store(&c, &sc);
    ASSERT_EQ(sc.cuda_read_streams, 4);
    ASSERT_TRUE(
        lkv_config_load_string(&c, "get_stage_streams = 17\n", "t.conf", err, sizeof(err)) != 0);
    ASSERT_TRUE(strstr(err, "get_stage_streams") != NULL);
    /* wb_wal: true by default (the WAL), false maps to the store's wb_no_wal. */
    lkv_config_defaults(&c);
    lkv_config_to_store(&c, &sc);
    ASSERT_EQ(sc.wb_no_wal, 0);
    ASSERT_OK(lkv_config_load_string(&c, "wb_wal = false\n", "t.conf", err, sizeof(err)));
    lkv_config_to_store(&c, &sc);
    ASSERT_EQ(sc.wb_no_wal, 1);
    ASSERT_OK(lkv_config_load_string(&c,
                                     "get_staging = off\nget_stage_slots = 3\n"
                                     "get_stage_wait = 0\n",
                                     "t.conf", err, sizeof(err)));
    ASSERT_EQ(c.get_staging, LKV_GET_STAGING_OFF);
    ASSERT_EQ(c.get_stage_slots, 3);
    ASSERT_EQ(c.get_stage_wait_ms, 0);
    ASSERT_OK(lkv_config_load_string(&c, "get_staging = always\n", "t.conf", err, sizeof(err)));
    ASSERT_EQ(c.get_staging, LKV_GET_STAGING_ALWAYS);
    ASSERT_TRUE(lkv_config_load_string(&c, "get_staging = pinned\n", "t.conf", err, sizeof(err)) !=
                0);
    ASSERT_TRUE(strstr(err, "get_staging") != NULL);
    ASSERT_TRUE(lkv_config_load_string(&c, "get_stage_slots = 0\n", "t.conf", err, sizeof(err)) !=
                0);
    ASSERT_TRUE(strstr(err, "get_stage_slots") != NULL);
    ASSERT_TRUE(
        lkv_config_load_string(&c, "get_stage_slots = 65537\n", "t.conf", err, sizeof(err)) != 0);
}

static void test_good_text(void)
{
    static lkv_config c;
    lkv_config_defaults(&c);
    const char *text = "# comment\n"
                       "\n"
                       "listen = [::1]:0   # trailing comment\n"
                       "hot_bytes = 1.5GiB\n"
                       "cold_bytes = 0\n"
                       "data_dir = \"/tmp/with space\"\n"
                       "hot_backend = HOST\n"
                       "policy = gdsf\n"
                       "policy_cost = bytes\n"
                       "durability = write-through\n"
                       "threads = 8\n"
                       "max_message_bytes = 128m\n"
                       "log_level = debug\n"
                       "shutdown_grace = 250ms\n"
                       "max_calls_per_peer = 2\n"
                       "tls_idle_timeout = 90s\n"
                       "[profile tiny]\n"
                       "n_layers = 2\n"
                       "n_q_heads = 4\n"
                       "n_kv_heads = 2\n"
                       "head_dim = 16\n"
                       "vocab_size = 100\n"
                       "posenc = alibi\n"
                       "  [ profile stories260k ]  \n"
                       "block_tokens = 32\n";
    if (lkv_config_load_string(&c, text, "t.conf", err, sizeof(err)) != 0) {
        LKV_FAIL("%s", err);
    }
    if (lkv_config_validate(&c, err, sizeof(err)) != 0) {
        LKV_FAIL("%s", err);
    }
    ASSERT_TRUE(strcmp(c.listen, "[::1]:0") == 0);
    ASSERT_EQ(c.hot_bytes, 3ull << 29);
    ASSERT_EQ(c.cold_bytes, 0);
    ASSERT_TRUE(strcmp(c.data_dir, "/tmp/with space") == 0);
    ASSERT_EQ(c.hot_backend, LKV_HOT_HOST);
    ASSERT_EQ(c.policy_kind, LKV_POLICY_GDSF);
    ASSERT_EQ(c.policy_cost_bytes, 1);
    ASSERT_EQ(c.durability, LKV_DURABILITY_WRITE_THROUGH);
    ASSERT_EQ(c.threads, 8);
    ASSERT_EQ(c.max_message_bytes, 128ull << 20);
    ASSERT_EQ(c.log_level, LKV_LOG_DEBUG);
    ASSERT_EQ(c.shutdown_grace_ms, 250);
    ASSERT_EQ(c.max_calls_per_peer, 2);
    ASSERT_EQ(c.tls_idle_timeout_ms, 90000);
    ASSERT_EQ(c.n_profiles, 3);
    const lkv_profile *t = lkv_config_profile(&c, "tiny");
    ASSERT_TRUE(t != NULL);
    ASSERT_EQ(t->shape.dtype, LKV_DTYPE_F16); /* template */
    ASSERT_EQ(t->shape.block_tokens, 16);     /* template */
    ASSERT_EQ(t->posenc.kind, LKV_POSENC_ALIBI);
    ASSERT_EQ(lkv_config_profile(&c, "stories260k")->shape.block_tokens, 32);
    ASSERT_EQ(lkv_config_profile(&c, "stories260k")->shape.n_layers, 5); /* kept */
}

static void test_overrides(void)
{
    static lkv_config c;
    int action;
    const char *args[] = {"--set",
                          "threads=3",
                          "--hot-bytes",
                          "256MiB",
                          "--log_level=warn",
                          "--set",
                          "profile.stories260k.vocab_size=1000",
                          "--listen",
                          "127.0.0.1:0",
                          "--check-config",
                          NULL};
    if (from_args(&c, &action, args) != 0) {
        LKV_FAIL("%s", err);
    }
    ASSERT_EQ(action, LKV_CONFIG_CHECK);
    ASSERT_EQ(c.threads, 3);
    ASSERT_EQ(c.hot_bytes, 256ull << 20);
    ASSERT_EQ(c.log_level, LKV_LOG_WARN);
    ASSERT_EQ(lkv_config_profile(&c, "stories260k")->vocab_size, 1000);
    ASSERT_TRUE(strcmp(c.listen, "127.0.0.1:0") == 0);

    /* model_id is part of the fingerprint: a fine-tune of the same shape gets other keys. */
    static lkv_config ft;
    const char *args_ft[] = {"--set", "profile.stories260k.model_id=stories260k-ft@r2", NULL};
    if (from_args(&ft, &action, args_ft) != 0) {
        LKV_FAIL("%s", err);
    }
    static lkv_config base;
    ASSERT_OK(from_args(&base, &action, (const char *[]){NULL}));
    const lkv_profile *pb = lkv_config_profile(&base, "stories260k");
    const lkv_profile *pf = lkv_config_profile(&ft, "stories260k");
    ASSERT_TRUE(strncmp(pb->model_id, "blake2b:", 8) == 0);
    ASSERT_TRUE(strcmp(pf->model_id, "stories260k-ft@r2") == 0);
    ASSERT_TRUE(memcmp(pb->fingerprint, pf->fingerprint, 32) != 0);

    /* The command line wins over the file, whatever the argument order. */
    const char *args2[] = {"--threads", "7", "--config", LKV_SOURCE_DIR "/daemon/lazykvd.conf",
                           NULL};
    if (from_args(&c, &action, args2) != 0) {
        LKV_FAIL("%s", err);
    }
    ASSERT_EQ(c.threads, 7);

    const char *help[] = {"--threads", "bogus", "--help", NULL};
    ASSERT_OK(from_args(&c, &action, help));
    ASSERT_EQ(action, LKV_CONFIG_HELP);
}

/* Each bad input fails with LKV_ECONFIG and a message containing every needle. */
static void bad_args(const char **args, const char *n1, const char *n2)
{
    static lkv_config c;
    int action;
    int rc = from_args(&c, &action, args);
    if (rc != LKV_ECONFIG) {
        LKV_FAIL("expected LKV_ECONFIG for '%s ...', got %s", args[0], lkv_err_name(rc));
    }
    ASSERT_ERR_HAS(n1);
    if (n2 != NULL) {
        ASSERT_ERR_HAS(n2);
    }
}

/* Profile (and tenant) names with dots work on the command line: NAME runs to the last dot.
 * Issue 12: "--set profile.llama-3.1-8b.max_doc_tokens=1024" used to address profile "llama-3"
 * (created from the template) with field "1-8b.max_doc_tokens". */
static void test_dotted_names(void)
{
    static lkv_config c;
    int action;
    const char *args[] = {"--set",          "profile.llama-3.1-8b.max_doc_tokens=1024",
                          "--set",          "profile.my.model.v2.n_layers=2",
                          "--set",          "profile.my.model.v2.n_q_heads=4",
                          "--set",          "profile.my.model.v2.n_kv_heads=2",
                          "--set",          "profile.my.model.v2.head_dim=8",
                          "--set",          "profile.my.model.v2.vocab_size=100",
                          "--check-config", NULL};
    if (from_args(&c, &action, args) != 0) {
        LKV_FAIL("%s", err);
    }
    ASSERT_EQ(lkv_config_profile(&c, "llama-3.1-8b")->max_doc_tokens, 1024);
    ASSERT_EQ(lkv_config_profile(&c, "llama-3.1-8b")->shape.n_layers, 32); /* The built-in. */
    ASSERT_TRUE(lkv_config_profile(&c, "llama-3") == NULL);
    const lkv_profile *p = lkv_config_profile(&c, "my.model.v2");
    ASSERT_TRUE(p != NULL);
    ASSERT_EQ(p->shape.n_layers, 2);
    ASSERT_EQ(p->vocab_size, 100);
    ASSERT_EQ(c.n_profiles, 3);
    /* The same through the file syntax, and an unknown field of a dotted name names it. */
    const char *bad[] = {"--set", "profile.llama-3.1-8b.no_such_field=1", NULL};
    bad_args(bad, "llama-3.1-8b", "no_such_field");
}

static void bad_text(const char *text, const char *n1, const char *n2)
{
    static lkv_config c;
    lkv_config_defaults(&c);
    err[0] = '\0';
    int rc = lkv_config_load_string(&c, text, "bad.conf", err, sizeof(err));
    if (rc == 0) {
        rc = lkv_config_validate(&c, err, sizeof(err));
    }
    if (rc != LKV_ECONFIG) {
        LKV_FAIL("expected LKV_ECONFIG for '%s', got %s", text, lkv_err_name(rc));
    }
    ASSERT_ERR_HAS(n1);
    if (n2 != NULL) {
        ASSERT_ERR_HAS(n2);
    }
}

static void test_bad_values_name_the_option(void)
{
    bad_text("hot_bytes = 1XB\n", "'hot_bytes'", "bad.conf:1");
    bad_text("\n\nhot_bytes = -5\n", "'hot_bytes'", "bad.conf:3");
    bad_text("threads = 0\n", "'threads'", "1..256");
    bad_text("threads = two\n", "'threads'", "two");
    bad_text("threads = 4x\n", "'threads'", NULL);
    bad_text("pool_threads = 257\n", "'pool_threads'", "0..256");
    bad_text("durability = sometimes\n", "'durability'", "write-through");
    bad_text("policy = fifo\n", "'policy'", "lru");
    bad_text("hot_backend = tpu\n", "'hot_backend'", "cuda");
    bad_text("log_level = loud\n", "'log_level'", "debug");
    bad_text("shutdown_grace = 5 parsecs\n", "'shutdown_grace'", NULL);
    bad_text("max_calls_per_peer = -1\n", "'max_calls_per_peer'", NULL);
    bad_text("max_calls_per_peer = 16777217\n", "'max_calls_per_peer'", "16777216");
    bad_text("tls_handshake_timeout = 2h\n", "'tls_handshake_timeout'", NULL);
    bad_text("tls_idle_timeout = 25h\n", "'tls_idle_timeout'", NULL);
    bad_text("max_message_bytes = 1K\n", "'max_message_bytes'", NULL);
    bad_text("listen = localhost\n", "'listen'", "host:port");
    bad_text("listen = 127.0.0.1:70000\n", "'listen'", NULL);
    bad_text("data_dir =\n", "'data_dir'", "empty");
    bad_text("frobnicate = 1\n", "'frobnicate'", "unknown option");
    bad_text("just words\n", "bad.conf:1", "key = value");
    bad_text("= 3\n", "bad.conf:1", "key");
    bad_text("[server]\n", "bad.conf:1", "[profile NAME]");
    bad_text("[profile bad/name]\n", "bad/name", NULL);
    bad_text("[profile p]\nn_layers = 2\n", "profile 'p'", "n_q_heads");
    bad_text("[profile p]\nwidth = 2\n", "'width'", "profile 'p'");
    bad_text("[profile stories260k]\ndtype = f64\n", "'dtype'", "bf16");
    bad_text("[profile stories260k]\nmodel_id = blake2b:abc\n", "'model_id'", "64 lowercase hex");
    bad_text("[profile stories260k]\nrope_theta = fast\n", "'rope_theta'", "stories260k");
    bad_text("[profile stories260k]\nn_kv_heads = 3\n", "n_kv_heads", "stories260k");
    /* Cross-option checks. */
    bad_text("hot_bytes = 1MiB\n", "'hot_bytes'", "2.0 MiB");
    /* Arena regions (DESIGN.md 4): explicit shares over hot_bytes, a share too small for one
     * block, all of hot_bytes taken by one profile with others left over. */
    bad_text("hot_bytes = 64MiB\n[profile llama-3.1-8b]\nhot_bytes = 65MiB\n", "'hot_bytes'",
             "more than");
    bad_text("hot_bytes = 64MiB\n[profile llama-3.1-8b]\nhot_bytes = 1MiB\n", "llama-3.1-8b",
             "gets 0 arena pages");
    bad_text("hot_bytes = 64MiB\n[profile llama-3.1-8b]\nhot_bytes = 64MiB\n", "all of",
             "nothing for the profiles without one");
    bad_text("[profile stories260k]\nhot_bytes = lots\n", "hot_bytes", "not a size");
    bad_text("max_message_bytes = 1MiB\n", "'max_message_bytes'", "llama-3.1-8b");
}

static int collect_name(void *ctx, const char *name)
{
    char *out = ctx;
    strcat(out, "[");
    strcat(out, name);
    strcat(out, "]");
    return strcmp(name, "stop") == 0 ? 7 : 0;
}

/* hold_profiles / hold_tenants: lists (may be empty), each name checked at validation. */
static void test_hold_lists(void)
{
    static lkv_config c;
    lkv_config_defaults(&c);
    ASSERT_EQ(c.hold_profiles[0], '\0');
    ASSERT_OK(lkv_config_validate(&c, err, sizeof(err)));
    const char *text = "hold_profiles = stories260k , llama-3.1-8b\n"
                       "hold_tenants = default, alice\n"
                       "[tenant alice]\n"
                       "token_hash = blake2b:"
                       "aa2da52eb056945abdc6b48fdeaf120d11f2072c3b65e74f1df10a16e2ced5cb\n"
                       "roles = data\n";
    ASSERT_OK(lkv_config_load_string(&c, text, "good.conf", err, sizeof(err)));
    if (lkv_config_validate(&c, err, sizeof(err)) != 0) {
        LKV_FAIL("validate: %s", err);
    }
    char seen[256] = "";
    ASSERT_OK(lkv_config_each_name(c.hold_profiles, collect_name, seen));
    ASSERT_TRUE(strcmp(seen, "[stories260k][llama-3.1-8b]") == 0);
    seen[0] = '\0';
    ASSERT_EQ(lkv_config_each_name(" a,,b , stop, c", collect_name, seen), 7);
    ASSERT_TRUE(strcmp(seen, "[a][b][stop]") == 0);
    bad_text("hold_profiles = stories260k, nope\n", "'hold_profiles'", "'nope'");
    bad_text("hold_tenants = mallory\n", "'hold_tenants'", "'mallory'");
}

static void test_bad_args_name_the_option(void)
{
    const char *a1[] = {"--hot-bytes", "lots", NULL};
    bad_args(a1, "'hot_bytes'", "lots");
    const char *a2[] = {"--set", "nope=1", NULL};
    bad_args(a2, "'nope'", "unknown option");
    const char *a3[] = {"--threads", NULL};
    bad_args(a3, "threads", "needs a value");
    const char *a4[] = {"stray", NULL};
    bad_args(a4, "stray", NULL);
    const char *a5[] = {"--config", "/nonexistent/lazykvd.conf", NULL};
    bad_args(a5, "'config'", "/nonexistent/lazykvd.conf");
    const char *a6[] = {"--set", "threads", NULL};
    bad_args(a6, "threads", "KEY=VALUE");
    const char *a7[] = {"--set", "profile.stories260k.head_dim=12", NULL};
    bad_args(a7, "head_dim", "stories260k");
    const char *a8[] = {"--config", NULL};
    bad_args(a8, "'config'", "FILE");
}

/* A failed set changes nothing. */
/* The default shares: equal token capacity (pages) for the profiles without a hot_bytes, what
 * an explicit share asks for, 256 B page rounding, one region per profile. */
static void test_region_plan(void)
{
    static lkv_config c;
    lkv_config_defaults(&c);
    ASSERT_OK(lkv_config_load_string(&c, "hot_bytes = 1GiB\n", "t.conf", err, sizeof(err)));
    ASSERT_OK(lkv_config_validate(&c, err, sizeof(err)));
    lkv_arena_region_cfg plan[LKV_CONFIG_MAX_PROFILES];
    ASSERT_OK(
        lkv_store_plan_regions(c.profiles, c.n_profiles, c.hot_bytes, plan, err, (int)sizeof(err)));
    ASSERT_EQ(c.n_profiles, 2);
    ASSERT_EQ(plan[0].page_bytes, 20480);    /* stories260k: 20 KiB blocks, 20 KiB pages. */
    ASSERT_EQ(plan[1].page_bytes, 2u << 20); /* llama-3.1-8b. */
    ASSERT_EQ(plan[0].n_pages, plan[1].n_pages);
    ASSERT_EQ(plan[0].n_pages, (1ull << 30) / (20480 + (2u << 20)));
    ASSERT_OK(lkv_config_set(&c, NULL, "profile.stories260k.hot_bytes", "10MiB", err, sizeof(err)));
    ASSERT_OK(lkv_config_validate(&c, err, sizeof(err)));
    ASSERT_OK(
        lkv_store_plan_regions(c.profiles, c.n_profiles, c.hot_bytes, plan, err, (int)sizeof(err)));
    ASSERT_EQ(plan[0].n_pages, (10u << 20) / 20480);
    ASSERT_EQ(plan[1].n_pages, ((1ull << 30) - (10u << 20)) / (2u << 20));
    /* A profile with a 1000-byte block gets 1024-byte pages (256 B rounding, not 4 KiB). */
    lkv_profile odd = c.profiles[0];
    odd.shape.n_layers = 1;
    odd.shape.n_kv_heads = 1;
    odd.shape.head_dim = 8;
    odd.shape.dtype = LKV_DTYPE_F16;
    odd.shape.block_tokens = 62; /* 2 x 62 x 8 x 2 = 1984 bytes. */
    odd.hot_bytes = 0;
    ASSERT_OK(lkv_store_plan_regions(&odd, 1, 1u << 20, plan, err, (int)sizeof(err)));
    ASSERT_EQ(plan[0].page_bytes, 2048);
    ASSERT_EQ(plan[0].n_pages, 512);
}

static void test_failed_set_changes_nothing(void)
{
    static lkv_config c;
    lkv_config_defaults(&c);
    ASSERT_ERR(lkv_config_set(&c, NULL, "threads", "0", err, sizeof(err)), LKV_ECONFIG);
    ASSERT_EQ(c.threads, 2);
    ASSERT_ERR(lkv_config_set(&c, "newprof", "bogus", "1", err, sizeof(err)), LKV_ECONFIG);
    ASSERT_EQ(c.n_profiles, 2);
    ASSERT_TRUE(lkv_config_profile(&c, "newprof") == NULL);
    ASSERT_OK(lkv_config_set(&c, NULL, "threads", "4", err, sizeof(err)));
    ASSERT_EQ(c.threads, 4);
}

static void test_summary_and_format(void)
{
    static lkv_config c;
    char buf[2048], b[32];
    lkv_config_defaults(&c);
    lkv_config_summary(&c, buf, sizeof(buf));
    ASSERT_TRUE(strstr(buf, "listen=127.0.0.1:7070") != NULL);
    ASSERT_TRUE(strstr(buf, "profiles=stories260k,llama-3.1-8b") != NULL);
    ASSERT_TRUE(strcmp(lkv_format_bytes(512, b, sizeof(b)), "512 B") == 0);
    ASSERT_TRUE(strcmp(lkv_format_bytes(1ull << 30, b, sizeof(b)), "1.0 GiB") == 0);
    lkv_store_config sc;
    lkv_config_to_store(&c, &sc);
    ASSERT_EQ(sc.hot_bytes, c.hot_bytes);
    ASSERT_EQ(sc.n_profiles, 2);
    ASSERT_TRUE(sc.data_dir == c.data_dir);
}

#define HASH_A "blake2b:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define HASH_B "blake2b:ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"

static void test_tenants(void)
{
    static lkv_config c;
    lkv_config_defaults(&c);
    ASSERT_EQ(c.loopback_roles, LKV_ROLE_ALL);
    ASSERT_EQ(c.allow_insecure_bind, 0);
    ASSERT_EQ(c.have_auth_key, 0);
    const char *text =
        "listen = 0.0.0.0:7070\n"
        "loopback_roles = none\n"
        "auth_key = 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n"
        "[tenant alice]\n"
        "token_hash = " HASH_A "\n"
        "roles = data,worker\n"
        "[profile stories260k]\n"
        "block_tokens = 16\n"
        "[tenant bob]\n"
        "token_hash = " HASH_B "\n"
        "roles = admin\n";
    if (lkv_config_load_string(&c, text, "t.conf", err, sizeof(err)) != 0 ||
        lkv_config_validate(&c, err, sizeof(err)) != 0) {
        LKV_FAIL("%s", err);
    }
    ASSERT_EQ(c.n_tenants, 2);
    ASSERT_EQ(c.loopback_roles, 0);
    ASSERT_EQ(c.have_auth_key, 1);
    ASSERT_EQ(c.auth_key[31], 0x1f);
    ASSERT_TRUE(strcmp(c.tenants[0].name, "alice") == 0);
    ASSERT_EQ(c.tenants[0].roles, LKV_ROLE_DATA | LKV_ROLE_WORKER);
    ASSERT_EQ(c.tenants[1].roles, LKV_ROLE_ADMIN);
    ASSERT_TRUE(memcmp(c.tenants[0].salt, c.tenants[1].salt, 32) != 0);
    lkv_auth *a = NULL;
    ASSERT_OK(lkv_config_auth(&c, &a, err, sizeof(err)));
    ASSERT_EQ(lkv_auth_count(a), 2);
    lkv_auth_destroy(a);

    /* The command line adds tenants too. */
    static lkv_config d;
    int action;
    const char *args[] = {"--set",    "tenant.carol.token_hash=" HASH_A,
                          "--set",    "tenant.carol.roles=data",
                          "--listen", "[::]:0",
                          NULL};
    if (from_args(&d, &action, args) != 0) {
        LKV_FAIL("%s", err);
    }
    ASSERT_EQ(d.n_tenants, 1);
}

static void test_bad_tenants(void)
{
    /* A non-loopback address without tenants is refused, unless explicitly allowed. */
    bad_text("listen = 0.0.0.0:7070\n", "'listen'", "0.0.0.0");
    static lkv_config c;
    lkv_config_defaults(&c);
    ASSERT_OK(lkv_config_load_string(&c, "listen = 0.0.0.0:1\nallow_insecure_bind = true\n",
                                     "ok.conf", err, sizeof(err)));
    ASSERT_OK(lkv_config_validate(&c, err, sizeof(err)));
    bad_text("[tenant alice]\nroles = data\n", "alice", "token_hash");
    bad_text("[tenant alice]\ntoken_hash = " HASH_A "\nroles = root\n", "alice", "root");
    bad_text("[tenant alice]\ncolour = blue\n", "alice", "colour");
    bad_text("[tenant default]\n", "default", NULL);
    bad_text("[tenant a]\ntoken_hash = " HASH_A "\nroles = data\n[tenant b]\ntoken_hash = " HASH_A
             "\nroles = data\n",
             "token", NULL);
    bad_text("loopback_roles = everything\n", "'loopback_roles'", "everything");
    bad_text("allow_insecure_bind = maybe\n", "'allow_insecure_bind'", "maybe");
    bad_text("auth_key = 1234\n", "'auth_key'", "64 hex");
    bad_text("[club x]\n", "[club x]", "[tenant NAME]");
}

/* The cluster_* options: each mode's requirements, the credential, the prefix; and a good one. */
static void test_cluster_options(void)
{
    bad_text("cluster_mode = zookeeper\n", "'cluster_mode'", "etcd");
    bad_text("cluster_mode = etcd\ncluster_token_file = /t\n", "'cluster_etcd'", "required");
    bad_text("cluster_mode = static\ncluster_token_file = /t\n", "'cluster_members'", NULL);
    bad_text("cluster_mode = dns\ncluster_dns = nameonly\ncluster_token_file = /t\n",
             "'cluster_dns'", "name:port");
    bad_text("cluster_mode = etcd\ncluster_etcd = 127.0.0.1:2379\n", "'cluster_token_file'",
             "required");
    bad_text("cluster_mode = etcd\ncluster_etcd = e:1\ncluster_token_file = /t\n"
             "cluster_prefix = /lazykv\n",
             "'cluster_prefix'", "/");
    bad_text("cluster_mode = static\ncluster_members = a:1\ncluster_token_file = /t\n"
             "cluster_advertise = noport\n",
             "'cluster_advertise'", NULL);
    bad_text("cluster_lease_ttl = 1s\n", "'cluster_lease_ttl'", NULL);
    bad_text("cluster_down_after = soon\n", "'cluster_down_after'", NULL);
    static lkv_config c;
    lkv_config_defaults(&c);
    ASSERT_TRUE(strcmp(c.cluster_mode, "none") == 0);
    ASSERT_EQ(c.cluster_id[0], '\0'); /* Empty defaults are allowed for these. */
    ASSERT_EQ(c.cluster_lease_ttl_ms, 10000);
    ASSERT_EQ(c.cluster_down_after_ms, 2000);
    ASSERT_EQ(c.cluster_health_interval_ms, 500);
    err[0] = '\0';
    ASSERT_OK(
        lkv_config_load_string(&c,
                               "cluster_mode = etcd\ncluster_etcd = 10.0.0.1:2379,10.0.0.2:2379\n"
                               "cluster_id = lazykv-0\ncluster_token_file = /run/tok\n"
                               "cluster_lease_ttl = 5s\ncluster_down_after = 750ms\n",
                               "good.conf", err, sizeof(err)));
    ASSERT_OK(lkv_config_validate(&c, err, sizeof(err)));
    ASSERT_TRUE(strcmp(c.cluster_etcd, "10.0.0.1:2379,10.0.0.2:2379") == 0);
    ASSERT_EQ(c.cluster_lease_ttl_ms, 5000);
    ASSERT_EQ(c.cluster_down_after_ms, 750);
}

/* Issue 13: TLS, metrics and tenant quota options. */
static void test_operations(void)
{
    static lkv_config c;
    lkv_config_defaults(&c);
    ASSERT_TRUE(c.metrics_listen[0] == '\0' && c.tls_cert_file[0] == '\0');
    ASSERT_EQ(c.allow_plaintext_tokens, 0);
    const char *text = "tls_cert_file = /etc/lazykv/tls/cert.pem\n"
                       "tls_key_file = /etc/lazykv/tls/key.pem\n"
                       "tls_client_ca_file = /etc/lazykv/tls/ca.pem\n"
                       "metrics_listen = [::1]:9464\n"
                       "allow_plaintext_tokens = true\n"
                       "[tenant alice]\n"
                       "token_hash = " HASH_A "\n"
                       "roles = data\n"
                       "max_hot_bytes = 1GiB\n"
                       "max_cold_bytes = 10 GiB\n"
                       "max_docs = 5000\n"
                       "rate_calls = 250\n"
                       "rate_bytes = unlimited\n";
    if (lkv_config_load_string(&c, text, "ops.conf", err, sizeof(err)) != 0 ||
        lkv_config_validate(&c, err, sizeof(err)) != 0) {
        LKV_FAIL("%s", err);
    }
    ASSERT_TRUE(strcmp(c.tls_client_ca_file, "/etc/lazykv/tls/ca.pem") == 0);
    ASSERT_TRUE(strcmp(c.metrics_listen, "[::1]:9464") == 0);
    ASSERT_EQ(c.allow_plaintext_tokens, 1);
    ASSERT_EQ(c.tenants[0].max_hot_bytes, 1ull << 30);
    ASSERT_EQ(c.tenants[0].max_cold_bytes, 10ull << 30);
    ASSERT_EQ(c.tenants[0].max_docs, 5000);
    ASSERT_EQ(c.tenants[0].rate_calls, 250);
    ASSERT_EQ(c.tenants[0].rate_bytes, 0);
    char sum[2048];
    lkv_config_summary(&c, sum, sizeof(sum));
    ASSERT_TRUE(strstr(sum, "tls=on+client-certs") != NULL);
    ASSERT_TRUE(strstr(sum, "metrics=[::1]:9464") != NULL);
    /* "none" switches an option off again. */
    ASSERT_OK(lkv_config_set(&c, NULL, "metrics_listen", "none", err, sizeof(err)));
    ASSERT_TRUE(c.metrics_listen[0] == '\0');
    bad_text("tls_cert_file = /x.pem\n", "'tls_key_file'", "both");
    bad_text("tls_key_file = /x.key\n", "'tls_cert_file'", "both");
    bad_text("tls_client_ca_file = /ca.pem\n", "'tls_client_ca_file'", "TLS");
    bad_text("metrics_listen = 0.0.0.0:9464\n", "'metrics_listen'", "allow_insecure_bind");
    bad_text("metrics_listen = 9464\n", "'metrics_listen'", "host:port");
    bad_text("allow_plaintext_tokens = sometimes\n", "'allow_plaintext_tokens'", "sometimes");
    bad_text("[tenant alice]\ntoken_hash = " HASH_A "\nroles = data\nmax_hot_bytes = 1XB\n",
             "alice", "max_hot_bytes");
    bad_text("[tenant alice]\ntoken_hash = " HASH_A "\nroles = data\nrate_calls = -1\n", "alice",
             "rate_calls");
    bad_text("[tenant alice]\ntoken_hash = " HASH_A "\nroles = data\nmax_docs = 99999999999T\n",
             "alice", "max_docs");
    /* Non-loopback metrics with the explicit switch: allowed. */
    lkv_config_defaults(&c);
    ASSERT_OK(lkv_config_load_string(&c, "metrics_listen = 0.0.0.0:0\nallow_insecure_bind = on\n",
                                     "ok.conf", err, sizeof(err)));
    ASSERT_OK(lkv_config_validate(&c, err, sizeof(err)));
}

int main(void)
{
    LKV_RUN(test_defaults);
    LKV_RUN(test_shipped_file_equals_defaults);
    LKV_RUN(test_good_text);
    LKV_RUN(test_get_staging);
    LKV_RUN(test_overrides);
    LKV_RUN(test_bad_values_name_the_option);
    LKV_RUN(test_bad_args_name_the_option);
    LKV_RUN(test_region_plan);
    LKV_RUN(test_failed_set_changes_nothing);
    LKV_RUN(test_summary_and_format);
    LKV_RUN(test_dotted_names);
    LKV_RUN(test_tenants);
    LKV_RUN(test_bad_tenants);
    LKV_RUN(test_hold_lists);
    LKV_RUN(test_cluster_options);
    LKV_RUN(test_operations);
    return 0;
}
