/*
 * test_cli_admin.c: integration.cli_admin. The lazykv CLI's admin commands against a real
 * lazykvd, all through the CLI binary (test_cli_run.h):
 *   - ls: the documents put with `lazykv put`, with the right profile, tier, tokens, blocks, size
 *     (human units in the table, bytes in --json) and pins; paging with --limit/--after and
 *     --all; filters by profile and tier;
 *   - evict: moves a document to the cold tier (ls and stats show it), by key or key prefix;
 *     exit 1 for a key not hot or not cached; a pinned document is refused (exit 3);
 *   - stats: --json parses and counts hits per tier and misses by cause after lookups; the
 *     human view has binary units, percentages and the derived lines; --watch --count 2 prints
 *     two samples; several sections;
 *   - attach/release: a lease shows as a pin in ls; release twice: 0 then 1;
 *   - get of an unknown key exits 1.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_kvfile.h"
#include "lkv_test.h"
#include "test_cli_run.h"

static lkv_daemon dm;
static char addr[200];

#define N_DOCS 3
static const uint32_t doc_tokens[N_DOCS] = {45, 20, 33}; /* 3, 2 and 3 blocks of 2 KiB. */
static char keys[N_DOCS][65];                            /* Keys, as put printed them. */

static void write_doc(const char *path, const it_doc *d)
{
    lkv_kvfile kf;
    memset(&kf, 0, sizeof(kf));
    snprintf(kf.profile, sizeof(kf.profile), "%s", lkv_it_itest.profile);
    kf.n_tokens = d->n_tokens;
    kf.tokens = d->tokens;
    kf.n_blocks = d->n_blocks;
    kf.block_bytes = d->block_bytes;
    kf.blocks = d->blocks;
    char err[256];
    ASSERT_OK(lkv_kvfile_write(path, &kf, err, sizeof(err)));
}

/* Index of the document whose key starts with the first 16 digits at p, or -1. */
static int doc_of(const char *p)
{
    for (int i = 0; i < N_DOCS; i++) {
        if (strncmp(p, keys[i], 16) == 0) {
            return i;
        }
    }
    return -1;
}

/* The table row of document i in cli_out, or NULL. */
static const char *row_of(int i)
{
    char short_key[17];
    memcpy(short_key, keys[i], 16);
    short_key[16] = '\0';
    return strstr(cli_out, short_key);
}

static void test_put_and_ls(void)
{
    char path[700];
    for (int i = 0; i < N_DOCS; i++) {
        it_doc d;
        lkv_it_doc_make(&lkv_it_itest, 900 + (uint64_t)i, doc_tokens[i], &d);
        snprintf(path, sizeof(path), "%s/doc%d.kv", dm.dir, i);
        write_doc(path, &d);
        ASSERT_EQ(cli_run(addr, "put", path, NULL), 0);
        ASSERT_TRUE(strlen(cli_out) > 64 && cli_out[64] == ' ');
        memcpy(keys[i], cli_out, 64);
        keys[i][64] = '\0';
        lkv_it_doc_free(&d);
    }

    /* Table: one row per document, with tier, tokens, blocks, human size and pins. */
    ASSERT_EQ(cli_run(addr, "ls", NULL), 0);
    ASSERT_TRUE(strncmp(cli_out, "KEY ", 4) == 0 && strstr(cli_out, "SIZE") != NULL);
    for (int i = 0; i < N_DOCS; i++) {
        const char *r = row_of(i);
        ASSERT_TRUE(r != NULL);
        char want[200], size[32];
        uint32_t blocks = (doc_tokens[i] + 15) / 16;
        snprintf(size, sizeof(size), "%u.0 KiB", blocks * 2);
        snprintf(want, sizeof(want), "%.16s  itest             hot   %8u  %6u  %10s     0\n",
                 keys[i], doc_tokens[i], blocks, size);
        if (strncmp(r, want, strlen(want)) != 0) {
            fprintf(stderr, "row: %.90s\nwant: %s", r, want);
        }
        ASSERT_TRUE(strncmp(r, want, strlen(want)) == 0);
    }
    ASSERT_TRUE(strstr(cli_out, "3 documents, 16.0 KiB\n") != NULL);
    ASSERT_TRUE(strstr(cli_out, "more:") == NULL);

    /* --full prints whole keys; --json has raw numbers. */
    ASSERT_EQ(cli_run(addr, "ls", "--full", NULL), 0);
    for (int i = 0; i < N_DOCS; i++) {
        ASSERT_TRUE(strstr(cli_out, keys[i]) != NULL);
    }
    ASSERT_EQ(cli_run(addr, "ls", "--json", NULL), 0);
    for (int i = 0; i < N_DOCS; i++) {
        char want[300];
        uint32_t blocks = (doc_tokens[i] + 15) / 16;
        snprintf(want, sizeof(want),
                 "{\"key\": \"%s\", \"profile\": \"itest\", \"tier\": \"hot\", \"tokens\": %u, "
                 "\"blocks\": %u, \"bytes\": %u, \"pins\": 0}",
                 keys[i], doc_tokens[i], blocks, blocks * 2048);
        ASSERT_TRUE(strstr(cli_out, want) != NULL);
    }
    ASSERT_TRUE(cli_json_check("len(d['docs']) == 3 and d['next_after_key'] is None and "
                               "[x['key'] for x in d['docs']] == sorted(x['key'] for x in "
                               "d['docs'])"));

    /* Filters. */
    ASSERT_EQ(cli_run(addr, "ls", "--profile", "itest", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "3 documents") != NULL);
    ASSERT_EQ(cli_run(addr, "ls", "--tier", "cold", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "0 documents, 0 B") != NULL);
    ASSERT_EQ(cli_run(addr, "ls", "--profile", "llama-3.1-8b", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "0 documents") != NULL);
    ASSERT_EQ(cli_run(addr, "ls", "--profile", "nosuch-model", NULL), 3);
    ASSERT_TRUE(strstr(cli_err, "nosuch-model") != NULL);
}

static void test_paging(void)
{
    /* Page by page with --limit 1 --after: every document once, in key order. */
    int seen[N_DOCS] = {0};
    char after[65] = "";
    char prev[17] = "";
    int pages = 0;
    for (;;) {
        int rc = after[0] ? cli_run(addr, "ls", "--limit", "1", "--after", after, NULL)
                          : cli_run(addr, "ls", "--limit", "1", NULL);
        ASSERT_EQ(rc, 0);
        pages++;
        ASSERT_TRUE(pages <= N_DOCS);
        const char *row = strchr(cli_out, '\n') + 1; /* After the header. */
        int i = doc_of(row);
        ASSERT_TRUE(i >= 0);
        ASSERT_EQ(seen[i], 0);
        seen[i] = 1;
        ASSERT_TRUE(strncmp(prev, keys[i], 16) < 0);
        memcpy(prev, keys[i], 16);
        ASSERT_TRUE(strstr(cli_out, "1 document, ") != NULL);
        const char *more = strstr(cli_out, "more: lazykv ls --after ");
        if (more == NULL) {
            break;
        }
        memcpy(after, more + strlen("more: lazykv ls --after "), 64);
        after[64] = '\0';
        ASSERT_TRUE(strncmp(after, keys[i], 64) == 0); /* Resume after the last key shown. */
    }
    ASSERT_EQ(pages, N_DOCS);

    /* --all pages through everything, even with tiny pages. */
    ASSERT_EQ(cli_run(addr, "ls", "--limit", "1", "--all", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "3 documents, 16.0 KiB") != NULL &&
                strstr(cli_out, "more:") == NULL);
    ASSERT_EQ(cli_run(addr, "ls", "--limit", "2", "--all", "--json", NULL), 0);
    ASSERT_TRUE(cli_json_check("len(d['docs']) == 3 and d['next_after_key'] is None"));
    ASSERT_EQ(cli_run(addr, "ls", "--limit", "2", "--json", NULL), 0);
    ASSERT_TRUE(
        cli_json_check("len(d['docs']) == 2 and d['next_after_key'] == d['docs'][1]['key']"));
}

static void test_evict(void)
{
    /* By full key: 0, then it is cold. */
    ASSERT_EQ(cli_run(addr, "evict", keys[0], NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "evicted ") != NULL && strstr(cli_out, keys[0]) != NULL);
    ASSERT_EQ(cli_run(addr, "ls", "--tier", "cold", NULL), 0);
    ASSERT_TRUE(row_of(0) != NULL && strstr(row_of(0), " cold ") != NULL);
    ASSERT_TRUE(row_of(1) == NULL && row_of(2) == NULL);
    ASSERT_TRUE(strstr(cli_out, "1 document, 6.0 KiB") != NULL);
    ASSERT_EQ(cli_run(addr, "ls", "--json", NULL), 0);
    char want[200];
    snprintf(want, sizeof(want), "\"key\": \"%s\", \"profile\": \"itest\", \"tier\": \"cold\"",
             keys[0]);
    ASSERT_TRUE(strstr(cli_out, want) != NULL);
    ASSERT_EQ(cli_run(addr, "stats", "--json", "hot", "movement", NULL), 0);
    ASSERT_TRUE(cli_json_check("d['hot']['docs'] == 2 and d['hot']['blocks'] == 5 and "
                               "d['movement']['evictions_hot'] == 1 and set(d) == "
                               "{'hot', 'movement'}"));
    ASSERT_EQ(cli_run(addr, "stats", "hot", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "docs:                    2\n") != NULL);
    ASSERT_TRUE(strstr(cli_out, "bytes_used:") != NULL && strstr(cli_out, "of budget)") != NULL);

    /* Not hot any more: 1. Unknown key: 1. */
    ASSERT_EQ(cli_run(addr, "evict", keys[0], NULL), 1);
    const char *zero = "0000000000000000000000000000000000000000000000000000000000000000";
    ASSERT_EQ(cli_run(addr, "evict", zero, NULL), 1);
    ASSERT_EQ(cli_run(addr, "get", zero, NULL), 1);

    /* By prefix, along with an unknown key: that one is evicted, the exit code is 1. */
    char prefix[13];
    memcpy(prefix, keys[1], 12);
    prefix[12] = '\0';
    ASSERT_EQ(cli_run(addr, "evict", prefix, zero, NULL), 1);
    ASSERT_TRUE(strstr(cli_out, keys[1]) != NULL);
    ASSERT_EQ(cli_run(addr, "ls", "--tier", "hot", NULL), 0);
    ASSERT_TRUE(row_of(2) != NULL && row_of(0) == NULL && row_of(1) == NULL);

    /* A get promotes a cold document back to the hot tier. */
    ASSERT_EQ(cli_run(addr, "get", keys[1], NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "tier=") != NULL);
    ASSERT_EQ(cli_run(addr, "ls", "--tier", "hot", NULL), 0);
    ASSERT_TRUE(row_of(1) != NULL);
}

static void test_lease(void)
{
    /* attach pins (promoting keys[0] from cold); ls shows the pins; evict is refused. */
    ASSERT_EQ(cli_run(addr, "attach", "--ttl", "20000", keys[0], keys[2], NULL), 0);
    ASSERT_TRUE(strncmp(cli_out, "lease ", 6) == 0 && strstr(cli_out, "arena backend=host") &&
                strstr(cli_out, "pages=") != NULL && strstr(cli_out, "block_bytes=2048") != NULL);
    char lease[33];
    memcpy(lease, cli_out + 6, 32);
    lease[32] = '\0';
    ASSERT_EQ(cli_run(addr, "ls", NULL), 0);
    ASSERT_TRUE(strstr(row_of(0), " hot ") != NULL);
    ASSERT_TRUE(strncmp(strchr(row_of(0), '\n') - 5, "    1", 5) == 0);
    ASSERT_TRUE(strncmp(strchr(row_of(2), '\n') - 5, "    1", 5) == 0);
    ASSERT_TRUE(strncmp(strchr(row_of(1), '\n') - 5, "    0", 5) == 0);
    ASSERT_EQ(cli_run(addr, "evict", keys[2], NULL), 3);
    ASSERT_TRUE(strstr(cli_err, "pinned") != NULL);

    /* Renew with --json: the same lease, pages listed. */
    ASSERT_EQ(cli_run(addr, "attach", "--lease", lease, "--json", keys[0], NULL), 0);
    char expr[300];
    snprintf(expr, sizeof(expr),
             "d['lease_id'] == '%s' and d['lease_docs'] == 2 and len(d['docs'][0]['pages']) == 3"
             " and d['arena']['backend'] == 'host'",
             lease);
    ASSERT_TRUE(cli_json_check(expr));

    ASSERT_EQ(cli_run(addr, "release", lease, NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "docs=2") != NULL);
    ASSERT_EQ(cli_run(addr, "release", lease, NULL), 1);
    ASSERT_EQ(cli_run(addr, "ls", "--json", NULL), 0);
    ASSERT_TRUE(cli_json_check("all(x['pins'] == 0 for x in d['docs'])"));
    /* A document that is not cached: 1, nothing pinned. */
    const char *zero = "0000000000000000000000000000000000000000000000000000000000000000";
    ASSERT_EQ(cli_run(addr, "attach", keys[1], zero, NULL), 1);
}

static void test_stats_counts(void)
{
    /* Counters before; then 1 hot hit, 1 cold hit, 1 never-seen miss, 1 deleted miss. */
    ASSERT_EQ(cli_run(addr, "stats", "--json", "lookups", NULL), 0);
    ASSERT_TRUE(cli_json_check("set(d) == {'lookups'} and 'misses_deleted' in d['lookups']"));
    long hh0 = 0, hc0 = 0, m0 = 0;
    const char *p = strstr(cli_out, "\"hits_hot\": ");
    ASSERT_TRUE(p != NULL);
    hh0 = atol(p + 12);
    hc0 = atol(strstr(cli_out, "\"hits_cold\": ") + 13);
    m0 = atol(strstr(cli_out, "\"misses\": ") + 10);

    ASSERT_EQ(cli_run(addr, "evict", keys[0], NULL), 0);
    ASSERT_EQ(cli_run(addr, "lookup", keys[2], NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "present tier=hot") != NULL);
    ASSERT_EQ(cli_run(addr, "lookup", keys[0], NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "present tier=cold") != NULL);
    const char *zero = "0000000000000000000000000000000000000000000000000000000000000000";
    ASSERT_EQ(cli_run(addr, "lookup", zero, NULL), 1);
    ASSERT_EQ(cli_run(addr, "rm", keys[1], NULL), 0);
    ASSERT_EQ(cli_run(addr, "lookup", keys[1], NULL), 1);
    ASSERT_TRUE(strstr(cli_out, "absent cause=deleted") != NULL);

    ASSERT_EQ(cli_run(addr, "stats", "--json", NULL), 0);
    char expr[600];
    snprintf(expr, sizeof(expr),
             "d['lookups']['hits_hot'] == %ld and d['lookups']['hits_cold'] == %ld and "
             "d['lookups']['misses'] == %ld and d['lookups']['misses_deleted'] >= 1 and "
             "sum(v for k, v in d['lookups'].items() if k.startswith('misses_')) == "
             "d['lookups']['misses'] and d['calls']['Cache.Lookup.calls'] >= 4 and "
             "isinstance(d['server']['version'], str)",
             hh0 + 1, hc0 + 1, m0 + 2);
    ASSERT_TRUE(cli_json_check(expr));

    /* Human view: units, percentages and the derived lines. */
    ASSERT_EQ(cli_run(addr, "stats", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "# Hot\n") != NULL && strstr(cli_out, "# Lookups\n") != NULL &&
                strstr(cli_out, "# Calls\n") != NULL);
    /* hot_bytes = 128 MiB shared by three regions of equal token capacity: 63 pages each of
     * 20 KiB (stories260k), 2 MiB (llama-3.1-8b) and 2 KiB (itest): 127.4 MiB really held. */
    ASSERT_TRUE(strstr(cli_out, "bytes_budget:            127.4 MiB\n") != NULL);
    ASSERT_TRUE(strstr(cli_out, " KiB (") != NULL); /* bytes_used with its share of budget */
    ASSERT_TRUE(strstr(cli_out, "hit_rate:") != NULL && strstr(cli_out, "lookups (hot ") != NULL);
    ASSERT_TRUE(strstr(cli_out, "misses_by_cause:") != NULL &&
                strstr(cli_out, "deleted 1 (") != NULL);
    ASSERT_TRUE(strstr(cli_out, "Cache.Lookup:") != NULL && strstr(cli_out, "us/call") != NULL);
    ASSERT_TRUE(strstr(cli_out, "uptime_s:") != NULL);

    /* --raw is the daemon's INFO text. */
    ASSERT_EQ(cli_run(addr, "stats", "--raw", "hot", NULL), 0);
    ASSERT_TRUE(strncmp(cli_out, "# Hot\ndocs:", 11) == 0);
    ASSERT_TRUE(strstr(cli_out, "bytes_budget:133539840\n") != NULL);

    /* --watch --count 2: two samples, human and JSON. */
    ASSERT_EQ(cli_run(addr, "stats", "--watch", "0.2", "--count", "2", "lookups", NULL), 0);
    ASSERT_EQ(cli_count(cli_out, "# Lookups\n"), 2);
    ASSERT_EQ(cli_count(cli_out, "# ---- sample "), 2);
    ASSERT_TRUE(strstr(cli_out, "# ---- sample 2 at ") != NULL);
    ASSERT_EQ(cli_count(cli_out, "# Rates (per second"), 1); /* After the second sample. */
    ASSERT_TRUE(strstr(strstr(cli_out, "# Rates"), "lookups:") != NULL);
    ASSERT_EQ(cli_run(addr, "stats", "--watch", "0.2", "--count", "2", "calls", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "# Rates") != NULL &&
                strstr(strstr(cli_out, "# Rates"), "Admin.Stats:") != NULL &&
                strstr(strstr(cli_out, "# Rates"), " calls/s") != NULL);
    ASSERT_EQ(cli_run(addr, "stats", "--json", "--watch", "0.1", "--count", "2", "hot", NULL), 0);
    ASSERT_EQ(cli_count(cli_out, "\n"), 2);
    ASSERT_TRUE(cli_json_check("set(d) == {'hot'}"));
}

int main(void)
{
    const char *args[] = {LKV_IT_PROFILE_ARGS, NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    cli_dir = dm.dir;
    snprintf(addr, sizeof(addr), "--addr=%s", dm.addr);
    LKV_RUN(test_put_and_ls);
    LKV_RUN(test_paging);
    LKV_RUN(test_evict);
    LKV_RUN(test_lease);
    LKV_RUN(test_stats_counts);
    lkv_daemon_stop(&dm, SIGTERM, 15000);
    lkv_daemon_cleanup(&dm);
    return 0;
}
