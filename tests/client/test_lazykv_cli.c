/*
 * test_lazykv_cli.c: client.lazykv_cli. Unit tests of the lazykv CLI's pure helpers, reached by
 * including client/lazykv_cli.c with its main() renamed: human units, durations, percentages,
 * number and tier parsing, key-prefix matching, lease ids, token lists, page ranges and the
 * stats views (human and JSON) on a fixed set of entries, captured through a temporary file.
 */
#define main lazykv_cli_main
#include "../../client/lazykv_cli.c"
#undef main

#include <unistd.h>

#include "lkv_test.h"

static void test_human_bytes(void)
{
    char b[32];
    ASSERT_TRUE(strcmp(human_bytes(0, b, sizeof(b)), "0 B") == 0);
    ASSERT_TRUE(strcmp(human_bytes(1023, b, sizeof(b)), "1023 B") == 0);
    ASSERT_TRUE(strcmp(human_bytes(1024, b, sizeof(b)), "1.0 KiB") == 0);
    ASSERT_TRUE(strcmp(human_bytes(6144, b, sizeof(b)), "6.0 KiB") == 0);
    ASSERT_TRUE(strcmp(human_bytes(1.5 * 1024 * 1024, b, sizeof(b)), "1.5 MiB") == 0);
    ASSERT_TRUE(strcmp(human_bytes(16.0 * (1u << 30), b, sizeof(b)), "16.0 GiB") == 0);
    ASSERT_TRUE(strcmp(human_bytes(3.0 * 1099511627776.0, b, sizeof(b)), "3.0 TiB") == 0);
}

static void test_duration_percent(void)
{
    char b[64];
    ASSERT_TRUE(strcmp(human_duration(0, b, sizeof(b)), "0s") == 0);
    ASSERT_TRUE(strcmp(human_duration(59, b, sizeof(b)), "59s") == 0);
    ASSERT_TRUE(strcmp(human_duration(61, b, sizeof(b)), "1m 1s") == 0);
    ASSERT_TRUE(strcmp(human_duration(3600 + 2, b, sizeof(b)), "1h 0m 2s") == 0);
    ASSERT_TRUE(strcmp(human_duration(2 * 86400 + 5, b, sizeof(b)), "2d 0h 0m 5s") == 0);
    ASSERT_TRUE(strcmp(percent(1, 4, b, sizeof(b)), "25.0%") == 0);
    ASSERT_TRUE(strcmp(percent(0, 4, b, sizeof(b)), "0.0%") == 0);
    ASSERT_TRUE(strcmp(percent(1, 0, b, sizeof(b)), "-") == 0);
    ASSERT_TRUE(strcmp(percent(1, 1e6, b, sizeof(b)), "<0.1%") == 0);
    ASSERT_TRUE(strcmp(plain_num(42, b, sizeof(b)), "42") == 0);
    ASSERT_TRUE(strcmp(plain_num(0.25, b, sizeof(b)), "0.25") == 0);
}

static void test_parsers(void)
{
    long v = 0;
    ASSERT_EQ(parse_count("1", 10, &v), 0);
    ASSERT_EQ(v, 1);
    ASSERT_EQ(parse_count("10", 10, &v), 0);
    ASSERT_EQ(parse_count("11", 10, &v), -1);
    ASSERT_EQ(parse_count("0", 10, &v), -1);
    ASSERT_EQ(parse_count("-3", 10, &v), -1);
    ASSERT_EQ(parse_count("2x", 10, &v), -1);
    ASSERT_EQ(parse_count("", 10, &v), -1);
    ASSERT_EQ(parse_count("1.5", 10, &v), -1);
    ASSERT_EQ(parse_count("99999999999999999999", 1000, &v), -1);

    int t = -1;
    ASSERT_EQ(parse_tier("hot", &t), 0);
    ASSERT_EQ(t, LKV_WIRE_TIER_HOT);
    ASSERT_EQ(parse_tier("cold", &t), 0);
    ASSERT_EQ(t, LKV_WIRE_TIER_COLD);
    ASSERT_EQ(parse_tier("all", &t), 0);
    ASSERT_EQ(t, LKV_WIRE_TIER_UNSPECIFIED);
    ASSERT_EQ(parse_tier("warm", &t), -1);

    ASSERT_TRUE(is_hex("0123456789abcdefABCDEF") && !is_hex("12g4") && is_hex(""));
    ASSERT_TRUE(hex_prefix_match("abcdef01", "ABCD", 4));
    ASSERT_TRUE(!hex_prefix_match("abcdef01", "abce", 4));

    uint8_t id[LKV_LEASE_ID_BYTES];
    ASSERT_EQ(lease_from_hex("000102030405060708090a0b0c0d0eFF", id), 0);
    ASSERT_EQ(id[1], 1);
    ASSERT_EQ(id[10], 10);
    ASSERT_EQ(id[15], 255);
    char hex[2 * LKV_LEASE_ID_BYTES + 1];
    bytes_to_hex(id, LKV_LEASE_ID_BYTES, hex);
    ASSERT_TRUE(strcmp(hex, "000102030405060708090a0b0c0d0eff") == 0);
    ASSERT_EQ(lease_from_hex("0001", id), -1);
    ASSERT_EQ(lease_from_hex("zz0102030405060708090a0b0c0d0eff", id), -1);

    uint32_t *tok = NULL;
    size_t n = 0;
    ASSERT_EQ(parse_token_text("1,2, 3\n4\t5", &tok, &n), 0);
    ASSERT_EQ(n, 5);
    ASSERT_EQ(tok[4], 5);
    free(tok);
    ASSERT_EQ(parse_token_text("1,-2", &tok, &n), -1);
    ASSERT_EQ(parse_token_text("4294967296", &tok, &n), -1);
    ASSERT_EQ(parse_token_text(" , ", &tok, &n), -1);
}

/* Runs fn with stdout redirected to a temporary file; returns what it printed (static). */
static const char *capture(void (*fn)(void))
{
    static char buf[16384];
    fflush(stdout);
    FILE *tmp = tmpfile();
    ASSERT_TRUE(tmp != NULL);
    int saved = dup(1);
    dup2(fileno(tmp), 1);
    fn();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(tmp);
    size_t got = fread(buf, 1, sizeof(buf) - 1, tmp);
    buf[got] = '\0';
    fclose(tmp);
    return buf;
}

static const lkv_stat_entry entries[] = {
    {"server", "version", 0, "0.1.0"},
    {"server", "uptime_s", 3725, ""},
    {"hot", "bytes_used", 6144, ""},
    {"hot", "bytes_budget", 134217728, ""},
    {"hot", "pages_total", 64, ""},
    {"hot", "pages_free", 16, ""},
    {"cold", "bytes_used", 1.5 * 1024 * 1024, ""},
    {"cold", "bytes_budget", 0, ""},
    {"lookups", "hits_hot", 2, ""},
    {"lookups", "hits_cold", 1, ""},
    {"lookups", "misses", 1, ""},
    {"lookups", "misses_never", 0, ""},
    {"lookups", "misses_deleted", 1, ""},
    {"lookups", "hit_rate_docs", 0.75, ""},
    {"calls", "Cache.Put.calls", 3, ""},
    {"calls", "Cache.Put.errors", 1, ""},
    {"calls", "Cache.Put.usec_per_call", 150.25, ""},
};
#define N_ENTRIES (sizeof(entries) / sizeof(entries[0]))

static void print_human(void)
{
    print_stats_human(entries, N_ENTRIES);
}

static void print_json(void)
{
    print_stats_json(entries, N_ENTRIES);
}

static void print_some_pages(void)
{
    static const uint32_t p[] = {3, 4, 5, 9, 2, 7, 8};
    print_pages(p, 7);
    print_pages(p, 0);
}

static void test_stats_views(void)
{
    const char *h = capture(print_human);
    fprintf(stderr, "%s", h);
    ASSERT_TRUE(strncmp(h, "# Server\nversion:                 0.1.0\n", 39) == 0);
    ASSERT_TRUE(strstr(h, "uptime_s:                1h 2m 5s\n") != NULL);
    ASSERT_TRUE(strstr(h, "\n# Hot\nbytes_used:              6.0 KiB (<0.1% of budget)\n") != NULL);
    ASSERT_TRUE(strstr(h, "bytes_budget:            128.0 MiB\n") != NULL);
    ASSERT_TRUE(strstr(h, "pages_free:              16 (25.0%)\n") != NULL);
    ASSERT_TRUE(strstr(h, "\n# Cold\nbytes_used:              1.5 MiB\nbytes_budget:            "
                          "unlimited\n") != NULL);
    ASSERT_TRUE(strstr(h, "hit_rate_docs:           75.0%\n") != NULL);
    ASSERT_TRUE(
        strstr(h, "hit_rate:                75.0% of 4 lookups (hot 50.0%, cold 25.0%)\n") != NULL);
    ASSERT_TRUE(strstr(h, "misses_by_cause:         deleted 1 (100.0%)\n") != NULL);
    ASSERT_TRUE(
        strstr(h, "\n# Calls\nCache.Put:               3 calls, 1 error, 150.2 us/call\n") !=
            NULL ||
        strstr(h, "\n# Calls\nCache.Put:               3 calls, 1 error, 150.3 us/call\n") != NULL);

    const char *j = capture(print_json);
    ASSERT_TRUE(strncmp(j,
                        "{\"server\": {\"version\": \"0.1.0\", \"uptime_s\": 3725}, \"hot\": "
                        "{\"bytes_used\": 6144, ",
                        70) == 0);
    ASSERT_TRUE(strstr(j, "\"hit_rate_docs\": 0.75") != NULL);
    ASSERT_TRUE(strstr(j, "\"Cache.Put.usec_per_call\": 150.25}}\n") != NULL);

    const char *p = capture(print_some_pages);
    ASSERT_TRUE(strcmp(p, "3-5,9,2,7-8") == 0);
}

int main(void)
{
    LKV_RUN(test_human_bytes);
    LKV_RUN(test_duration_percent);
    LKV_RUN(test_parsers);
    LKV_RUN(test_stats_views);
    return 0;
}
