/*
 * test_cli_residency.c: integration.cli_residency. The residency controls (DESIGN.md 4) through
 * the lazykv CLI against real lazykvd processes (test_cli_run.h):
 *   daemon A (no tenants, a hot tier of 16 pages (2 MiB: the built-in llama profile)):
 *   - put --hold: the document stays hot while 40 others go through the hot tier; `hold KEY
 *     --off` releases it and the next pressure demotes it; `hold KEY` of a cold document
 *     promotes it (ls shows it hot) and keeps it;
 *   - put --ttl: the document is absent with cause=expired within the sweep period;
 *   - hold/evict by profile: a held profile survives a flood, `evict --profile` demotes every
 *     unheld document of it; an unknown profile exits 3 and changes nothing (stats);
 *   - bad options (--priority 5, --ttl abc, hold without a target) exit 2;
 *   daemon B (tenants alice, bob: data; ops: admin; loopback callers: the default tenant):
 *   - `evict --tenant alice --purge` drops alice's documents (her lookups: cause=deleted) and
 *     leaves bob's and the default tenant's;
 *   - hold/evict by a data-only tenant: exit 5 (PERMISSION_DENIED), nothing changes; an
 *     unknown tenant: exit 3;
 *   - hold_tenants=bob in the config is applied at start (a release after a restart succeeds;
 *     without it, it would be NOT_FOUND).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_kvfile.h"
#include "lkv_test.h"
#include "test_cli_run.h"

#define TOK_ALICE  "alice-secret-token-0123456789"
#define TOK_BOB    "bob-secret-token-0123456789"
#define TOK_ADMIN  "admin-secret-token-0123456789"
#define HASH_ALICE "aa2da52eb056945abdc6b48fdeaf120d11f2072c3b65e74f1df10a16e2ced5cb"
#define HASH_BOB   "aba12b322f2ba41b7087832629514c0c68a91ead1057d4554f8587ad17499c6c"
#define HASH_ADMIN "236f0715c36b4b6428484ea28d2450bd78ab8255b05936c1544c06a6412f946f"

static lkv_daemon dm;
static char addr[200];

/* Writes document seed (n tokens of itest) into DIR/name.kv; path out. */
static void doc_file(uint64_t seed, uint32_t n, char *path, size_t len)
{
    it_doc d;
    lkv_it_doc_make(&lkv_it_itest, seed, n, &d);
    snprintf(path, len, "%s/d%llu.kv", dm.dir, (unsigned long long)seed);
    lkv_kvfile kf;
    memset(&kf, 0, sizeof(kf));
    snprintf(kf.profile, sizeof(kf.profile), "%s", lkv_it_itest.profile);
    kf.n_tokens = d.n_tokens;
    kf.tokens = d.tokens;
    kf.n_blocks = d.n_blocks;
    kf.block_bytes = d.block_bytes;
    kf.blocks = d.blocks;
    char err[256];
    ASSERT_OK(lkv_kvfile_write(path, &kf, err, sizeof(err)));
    lkv_it_doc_free(&d);
}

/* Puts document seed (16 tokens: one block) with extra words (NULL-terminated, may be empty)
 * and the token option tok (NULL: none); writes its key (as put printed it) into key. */
static void put_doc(uint64_t seed, const char *tok, char key[65], const char *o1, const char *o2)
{
    char path[700];
    doc_file(seed, 16, path, sizeof(path));
    const char *w[8];
    int n = 0;
    w[n++] = addr;
    if (tok != NULL) {
        w[n++] = tok;
    }
    w[n++] = "put";
    if (o1 != NULL) {
        w[n++] = o1;
    }
    if (o2 != NULL) {
        w[n++] = o2;
    }
    w[n++] = path;
    ASSERT_EQ(cli_runv(n, w), 0);
    ASSERT_TRUE(strlen(cli_out) > 64 && cli_out[64] == ' ');
    if (key != NULL) {
        memcpy(key, cli_out, 64);
        key[64] = '\0';
    }
}

/* Puts documents seeds [from, from + n) as the caller tok. */
static void flood(uint64_t from, int n, const char *tok)
{
    for (int i = 0; i < n; i++) {
        put_doc(from + (uint64_t)i, tok, NULL, NULL, NULL);
    }
}

/* The `lookup KEY` line of key (as tok) into cli_out; returns the exit code. */
static int lookup(const char *key, const char *tok)
{
    return tok != NULL ? cli_run(addr, tok, "lookup", key, NULL)
                       : cli_run(addr, "lookup", key, NULL);
}

static int is_tier(const char *key, const char *tier)
{
    char want[32];
    snprintf(want, sizeof(want), "present tier=%s", tier);
    return lookup(key, NULL) == 0 && strstr(cli_out, want) != NULL;
}

/* The stats entry section/key (stats --json) as a number. */
static double stat_of(const char *section, const char *key)
{
    ASSERT_EQ(cli_run(addr, "stats", "--json", section, NULL), 0);
    char pat[128];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(cli_out, pat);
    ASSERT_TRUE(p != NULL);
    return atof(p + strlen(pat));
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- daemon A ---------------------------------------------------------------------------- */

static void test_hold_key(void)
{
    char h[65], c[65];
    put_doc(1, NULL, h, "--hold", NULL);
    put_doc(2, NULL, c, NULL, NULL);
    flood(100, 40, NULL);
    ASSERT_TRUE(is_tier(h, "hot"));
    ASSERT_TRUE(is_tier(c, "cold"));
    ASSERT_TRUE(stat_of("hot", "bytes_held") == 2048); /* One itest block, its region page. */
    /* An admin evict of the held document is refused (3); a release lets pressure demote it. */
    ASSERT_EQ(cli_run(addr, "evict", h, NULL), 3);
    ASSERT_EQ(cli_run(addr, "hold", h, "--off", NULL), 0);
    ASSERT_TRUE(strncmp(cli_out, "released ", 9) == 0);
    flood(200, 20, NULL);
    ASSERT_TRUE(is_tier(h, "cold"));

    /* Hold of a cold document (by a key prefix): promoted, then it stays. */
    char prefix[17];
    memcpy(prefix, c, 16);
    prefix[16] = '\0';
    ASSERT_EQ(cli_run(addr, "hold", prefix, NULL), 0);
    ASSERT_TRUE(strncmp(cli_out, "held ", 5) == 0 && strncmp(cli_out + 5, c, 64) == 0);
    ASSERT_TRUE(is_tier(c, "hot"));
    flood(300, 20, NULL);
    ASSERT_TRUE(is_tier(c, "hot"));
    ASSERT_EQ(cli_run(addr, "hold", c, "--off", NULL), 0);

    /* Unknown key: exit 1. Bad input: exit 2. */
    char zero[65];
    memset(zero, '0', 64);
    zero[64] = '\0';
    ASSERT_EQ(cli_run(addr, "hold", zero, NULL), 1);
    ASSERT_EQ(cli_run(addr, "hold", NULL), 2);
    ASSERT_EQ(cli_run(addr, "hold", c, "--profile", "itest", NULL), 2);
    char path[700];
    doc_file(9, 16, path, sizeof(path));
    ASSERT_EQ(cli_run(addr, "put", "--priority", "5", path, NULL), 2);
    ASSERT_EQ(cli_run(addr, "put", "--ttl", "abc", path, NULL), 2);
    ASSERT_EQ(cli_run(addr, "put", "--ttl", "-5", path, NULL), 2);
}

static void test_ttl(void)
{
    char t[65], k[65];
    put_doc(400, NULL, t, "--ttl", "1500ms");
    put_doc(401, NULL, k, "--priority", "high");
    ASSERT_EQ(lookup(t, NULL), 0);
    int expired = 0;
    for (int i = 0; i < 100 && !expired; i++) {
        sleep_ms(100);
        expired = lookup(t, NULL) == 1 && strstr(cli_out, "absent cause=expired") != NULL;
    }
    ASSERT_TRUE(expired);
    ASSERT_EQ(lookup(k, NULL), 0);
    ASSERT_TRUE(stat_of("movement", "expired") >= 1);
    ASSERT_TRUE(stat_of("lookups", "misses_expired") >= 1);
}

static void test_profile_class(void)
{
    char a[65], path[700];
    put_doc(500, NULL, a, NULL, NULL); /* The hot tier is full now. */
    ASSERT_EQ(cli_run(addr, "hold", "--profile", "itest", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "held tenant=* profile=itest docs=") != NULL);
    /* Everything is held: a put that needs room is refused (3), and nothing held moves. */
    doc_file(501, 16, path, sizeof(path));
    ASSERT_EQ(cli_run(addr, "put", path, NULL), 3);
    ASSERT_TRUE(strstr(cli_err, "RESOURCE_EXHAUSTED") != NULL || strstr(cli_err, "ENOSPC") != NULL);
    double before = stat_of("movement", "class_evictions");
    ASSERT_EQ(cli_run(addr, "evict", "--profile", "itest", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "evicted tenant=* profile=itest hot=0 cold=0") != NULL);
    ASSERT_TRUE(is_tier(a, "hot"));
    ASSERT_EQ(cli_run(addr, "hold", "--profile", "itest", "--off", NULL), 0);
    ASSERT_EQ(cli_run(addr, "hold", "--profile", "itest", "--off", NULL), 1); /* Not there. */

    /* Unknown profile: exit 3, the reason names the known ones, nothing changes. */
    ASSERT_EQ(cli_run(addr, "evict", "--profile", "nope", "--purge", NULL), 3);
    ASSERT_TRUE(strstr(cli_err, "itest") != NULL);
    ASSERT_EQ(cli_run(addr, "hold", "--profile", "nope", NULL), 3);
    ASSERT_TRUE(stat_of("movement", "class_evictions") == before);
    ASSERT_TRUE(is_tier(a, "hot"));

    /* Evict the profile: every hot document goes to the cold tier, still served. */
    double hot_docs = stat_of("hot", "docs");
    ASSERT_TRUE(hot_docs >= 2);
    ASSERT_EQ(cli_run(addr, "evict", "--profile", "itest", NULL), 0);
    char want[96];
    snprintf(want, sizeof(want), "evicted tenant=* profile=itest hot=%d cold=0", (int)hot_docs);
    ASSERT_TRUE(strstr(cli_out, want) != NULL);
    ASSERT_TRUE(stat_of("hot", "docs") == 0);
    ASSERT_TRUE(is_tier(a, "cold"));
    ASSERT_EQ(cli_run(addr, "get", a, "-o", "/dev/null", NULL), 0);
}

/* ---- daemon B ---------------------------------------------------------------------------- */

static void test_tenants(void)
{
    char ka[65], kb[65], kd[65];
    put_doc(600, "--token=" TOK_ALICE, ka, NULL, NULL);
    put_doc(601, "--token=" TOK_BOB, kb, NULL, NULL);
    put_doc(602, NULL, kd, NULL, NULL); /* The default tenant (loopback, no token). */

    /* A data-only tenant may not hold or evict (5); nothing changes. */
    ASSERT_EQ(cli_run(addr, "--token=" TOK_ALICE, "evict", "--tenant", "bob", "--purge", NULL), 5);
    ASSERT_EQ(cli_run(addr, "--token=" TOK_ALICE, "hold", "--tenant", "alice", NULL), 5);
    ASSERT_EQ(lookup(kb, "--token=" TOK_BOB), 0);
    /* Unknown tenant: 3, nothing changes. */
    ASSERT_EQ(cli_run(addr, "--token=" TOK_ADMIN, "evict", "--tenant", "mallory", "--purge", NULL),
              3);
    ASSERT_TRUE(strstr(cli_err, "mallory") != NULL);
    ASSERT_EQ(lookup(ka, "--token=" TOK_ALICE), 0);

    /* The admin tenant purges alice: her document is gone, bob's and the default's stay. */
    ASSERT_EQ(cli_run(addr, "--token=" TOK_ADMIN, "evict", "--tenant", "alice", "--purge", NULL),
              0);
    ASSERT_TRUE(strstr(cli_out, "purged tenant=alice profile=* hot=1 cold=0") != NULL);
    ASSERT_EQ(lookup(ka, "--token=" TOK_ALICE), 1);
    ASSERT_TRUE(strstr(cli_out, "absent cause=deleted") != NULL);
    ASSERT_EQ(lookup(kb, "--token=" TOK_BOB), 0);
    ASSERT_EQ(lookup(kd, NULL), 0);

    /* A tenant hold made at runtime is not kept across a restart; hold_tenants=bob is. */
    ASSERT_EQ(cli_run(addr, "hold", "--tenant", "default", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "held tenant=default profile=* docs=1") != NULL);
    ASSERT_EQ(lkv_daemon_stop(&dm, SIGTERM, 15000) >= 0, 1);
    const char *more[] = {"--set", "hold_tenants=bob", NULL};
    ASSERT_OK(lkv_daemon_start_with(&dm, more));
    snprintf(addr, sizeof(addr), "--addr=%s", dm.addr);
    ASSERT_EQ(cli_run(addr, "hold", "--tenant", "default", "--off", NULL), 1);
    ASSERT_EQ(cli_run(addr, "hold", "--tenant", "bob", "--off", NULL), 0);
    ASSERT_EQ(lookup(kb, "--token=" TOK_BOB), 0); /* Persisted, with its tenant. */
    ASSERT_EQ(lookup(ka, "--token=" TOK_ALICE), 1);
    /* Bob's class survived the restart (cold record v2): a purge of bob finds it. */
    ASSERT_EQ(cli_run(addr, "evict", "--tenant", "bob", "--purge", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "purged tenant=bob profile=* hot=0 cold=1") != NULL);
    ASSERT_EQ(lookup(kb, "--token=" TOK_BOB), 1);
    ASSERT_EQ(lookup(kd, NULL), 0);
}

int main(void)
{
    /* hot_admission=always: the hold and TTL tests push documents out of the hot tier with puts
     * of new ones (the door would store those cold instead). */
    const char *args_a[] = {LKV_IT_PROFILE_ARGS,    "--set", "hot_bytes=32MiB", "--set",
                            "hot_admission=always", NULL};
    lkv_daemon_init(&dm, args_a);
    lkv_it_start(&dm);
    cli_dir = dm.dir;
    snprintf(addr, sizeof(addr), "--addr=%s", dm.addr);
    LKV_RUN(test_hold_key);
    LKV_RUN(test_ttl);
    LKV_RUN(test_profile_class);
    lkv_daemon_stop(&dm, SIGTERM, 15000);
    lkv_daemon_cleanup(&dm);

    const char *args_b[] = {
        LKV_IT_PROFILE_ARGS,       "--set", "tenant.alice.token_hash=blake2b:" HASH_ALICE, "--set",
        "tenant.alice.roles=data", "--set", "tenant.bob.token_hash=blake2b:" HASH_BOB,     "--set",
        "tenant.bob.roles=data",   "--set", "tenant.ops.token_hash=blake2b:" HASH_ADMIN,   "--set",
        "tenant.ops.roles=admin",  NULL};
    lkv_daemon_init(&dm, args_b);
    lkv_it_start(&dm);
    cli_dir = dm.dir;
    snprintf(addr, sizeof(addr), "--addr=%s", dm.addr);
    LKV_RUN(test_tenants);
    lkv_daemon_stop(&dm, SIGTERM, 15000);
    lkv_daemon_cleanup(&dm);
    return 0;
}
