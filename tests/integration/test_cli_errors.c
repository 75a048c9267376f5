/*
 * test_cli_errors.c: integration.cli_errors. The exit codes of the lazykv CLI that scripts rely
 * on, through the CLI binary (test_cli_run.h), against a real lazykvd with tenants and
 * loopback_roles=none:
 *   - --help on every command (and `help CMD`, and the top level) exits 0 and prints the usage
 *     and the exit codes;
 *   - every usage error exits 2 with a message on stderr and nothing on stdout;
 *   - auth: no token or a wrong token exits 5 (UNAUTHENTICATED), a tenant lacking the role
 *     exits 5 (PERMISSION_DENIED), the right token (--token, LAZYKV_TOKEN, or --token after the
 *     command word) exits 0, and ping needs no token; LAZYKV_ADDR works and --addr wins;
 *   - an unknown key exits 1;
 *   - the daemon down (stopped, or nothing listening) exits 4 for every command.
 * Token hashes: BLAKE2b-256("lazykv-token-v1:" || token), unkeyed (daemon/lkv_auth.h), as in
 * test_auth.c.
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

#define TOK_ALICE  "alice-secret-token-0123456789"
#define TOK_ADMIN  "admin-secret-token-0123456789"
#define HASH_ALICE "aa2da52eb056945abdc6b48fdeaf120d11f2072c3b65e74f1df10a16e2ced5cb"
#define HASH_ADMIN "236f0715c36b4b6428484ea28d2450bd78ab8255b05936c1544c06a6412f946f"

static lkv_daemon dm;
static char addr[200];
static char kvpath[700];
static char key[65];

static const char *zero = "0000000000000000000000000000000000000000000000000000000000000000";
static const char *lease0 = "00000000000000000000000000000000";

static void test_help(void)
{
    static const char *cmds[] = {"ping", "put",   "get",   "lookup", "rm",
                                 "ls",   "evict", "stats", "attach", "release"};
    ASSERT_EQ(cli_run("--help", NULL), 0);
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char line[64];
        snprintf(line, sizeof(line), "\n  %s ", cmds[i]);
        ASSERT_TRUE(strstr(cli_out, line) != NULL); /* Listed at the top level. */
    }
    ASSERT_TRUE(strstr(cli_out, "Exit codes") != NULL && strstr(cli_out, "  5  auth") != NULL);
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char usage[64];
        snprintf(usage, sizeof(usage), "usage: lazykv %s", cmds[i]);
        /* --help needs no daemon and no token, also with other arguments around it. */
        ASSERT_EQ(cli_run(cmds[i], "--help", NULL), 0);
        ASSERT_TRUE(strncmp(cli_out, usage, strlen(usage)) == 0);
        ASSERT_TRUE(strstr(cli_out, "Exit codes") != NULL);
        ASSERT_EQ(cli_run("--addr", "127.0.0.1:1", cmds[i], "x", "-h", NULL), 0);
        ASSERT_TRUE(strncmp(cli_out, usage, strlen(usage)) == 0);
        ASSERT_EQ(cli_run("help", cmds[i], NULL), 0);
        ASSERT_TRUE(strncmp(cli_out, usage, strlen(usage)) == 0);
    }
    ASSERT_EQ(cli_run("help", NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "Commands") != NULL);
}

static void test_usage_errors(void)
{
    /* Each row: arguments after --addr=...; every one must exit 2 before any RPC. */
    static const char *cases[][8] = {
        {NULL},
        {"frobnicate", NULL},
        {"--bogus", "ping", NULL},
        {"help", "frobnicate", NULL},
        {"--timeout", "0", "ping", NULL},
        {"--timeout", "abc", "ping", NULL},
        {"ping", "--timeout", NULL},
        {"ping", "a", "b", NULL},
        {"put", NULL},
        {"put", "a.kv", "b.kv", NULL},
        {"put", "/nonexistent/doc.kv", NULL},
        {"get", NULL},
        {"get", "nothex", NULL},
        {"get", "--profile", "itest", NULL},
        {"get", "--profile", "itest", "--tokens", "1,x", NULL},
        {"get", "--tokens", "1,2", NULL},
        {"lookup", NULL},
        {"rm", "--frob", NULL},
        {"ls", "--limit", "0", NULL},
        {"ls", "--limit", "10001", NULL},
        {"ls", "--limit", "abc", NULL},
        {"ls", "--tier", "warm", NULL},
        {"ls", "--after", "nothex", NULL},
        {"ls", "--profile", NULL},
        {"ls", "extra", NULL},
        {"ls", "--bogus", NULL},
        {"evict", NULL},
        {"evict", "xyz", NULL},
        {"evict", "abc", NULL}, /* A prefix shorter than 8 digits. */
        {"evict", "-x", NULL},
        {"stats", "--watch", NULL},
        {"stats", "--watch", "0", NULL},
        {"stats", "--watch", "abc", NULL},
        {"stats", "--watch", "1", "--count", "0", NULL},
        {"stats", "--watch", "1", "--count", "1.5", NULL},
        {"stats", "--count", "2", NULL},
        {"stats", "--json", "--raw", NULL},
        {"stats", "--bogus", NULL},
        {"attach", NULL},
        {"attach", "--ttl", "0", NULL},
        {"attach", "--lease", "xyz", NULL},
        {"attach", "nothex", NULL},
        {"release", NULL},
        {"release", "nothex", NULL},
        {"release", "00", "11", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *w[10];
        int n = 0;
        w[n++] = addr;
        for (int k = 0; cases[i][k] != NULL; k++) {
            w[n++] = cases[i][k];
        }
        ASSERT_EQ(cli_runv(n, w), 2);
        ASSERT_TRUE(strstr(cli_err, "lazykv") != NULL); /* A message saying what is wrong. */
        ASSERT_TRUE(cli_out[0] == '\0');
    }
    /* A corrupt KV file is bad local input: 2. */
    char bad[700];
    snprintf(bad, sizeof(bad), "%s/bad.kv", dm.dir);
    FILE *f = fopen(bad, "wb");
    ASSERT_TRUE(f != NULL);
    fputs("LKVKV1 but not really", f);
    fclose(f);
    ASSERT_EQ(cli_run(addr, "--token", TOK_ALICE, "put", bad, NULL), 2);
    ASSERT_TRUE(strstr(cli_err, "bad.kv") != NULL || strstr(cli_err, "magic") != NULL ||
                strstr(cli_err, "corrupt") != NULL);
}

static void test_auth(void)
{
    /* Health needs no token. */
    ASSERT_EQ(cli_run(addr, "ping", NULL), 0);

    /* No token, wrong token: 5 (UNAUTHENTICATED), on data and admin commands alike. */
    ASSERT_EQ(cli_run(addr, "ls", NULL), 5);
    ASSERT_EQ(cli_run(addr, "stats", NULL), 5);
    ASSERT_EQ(cli_run(addr, "put", kvpath, NULL), 5);
    ASSERT_EQ(cli_run(addr, "--token", "not-a-valid-token", "stats", NULL), 5);
    ASSERT_TRUE(strstr(cli_err, "unauthenticated") != NULL);
    ASSERT_EQ(cli_run(addr, "--token", "not-a-valid-token", "lookup", zero, NULL), 5);
    cli_env_token = "not-a-valid-token";
    ASSERT_EQ(cli_run(addr, "ls", NULL), 5);
    cli_env_token = NULL;

    /* alice (data role): put/get work; admin commands are denied: 5 (PERMISSION_DENIED). */
    ASSERT_EQ(cli_run(addr, "--token", TOK_ALICE, "put", kvpath, NULL), 0);
    memcpy(key, cli_out, 64);
    key[64] = '\0';
    ASSERT_EQ(cli_run(addr, "--token", TOK_ALICE, "get", key, NULL), 0);
    ASSERT_EQ(cli_run(addr, "--token", TOK_ALICE, "ls", NULL), 5);
    ASSERT_TRUE(strstr(cli_err, "permission denied") != NULL);
    ASSERT_EQ(cli_run(addr, "--token", TOK_ALICE, "evict", key, NULL), 5);
    ASSERT_EQ(cli_run(addr, "--token", TOK_ALICE, "attach", key, NULL), 5); /* worker role */

    /* Unknown key: 1. */
    ASSERT_EQ(cli_run(addr, "--token", TOK_ALICE, "get", zero, NULL), 1);
    ASSERT_EQ(cli_run(addr, "--token", TOK_ALICE, "rm", zero, NULL), 1);

    /* ops (admin role): --token, LAZYKV_TOKEN, --token after the command word. */
    ASSERT_EQ(cli_run(addr, "--token", TOK_ADMIN, "ls", NULL), 0);
    /* Admin/List spans tenants (store keys, not alice's wire keys): her document is listed. */
    ASSERT_TRUE(strstr(cli_out, " itest ") != NULL &&
                strstr(cli_out, "1 document, 6.0 KiB") != NULL);
    cli_env_token = TOK_ADMIN;
    ASSERT_EQ(cli_run(addr, "stats", "--json", "hot", NULL), 0);
    ASSERT_TRUE(cli_json_check("d['hot']['docs'] == 1"));
    cli_env_token = NULL;
    cli_env_addr = dm.addr; /* LAZYKV_ADDR; --addr wins over it. */
    ASSERT_EQ(cli_run("--token", TOK_ADMIN, "ls", NULL), 0);
    ASSERT_EQ(cli_run("--addr", "127.0.0.1:1", "--timeout", "3000", "ping", NULL), 4);
    cli_env_addr = "127.0.0.1:1";
    ASSERT_EQ(cli_run(addr, "ping", NULL), 0);
    cli_env_addr = NULL;
    ASSERT_EQ(cli_run("stats", "hot", addr, "--token=" TOK_ADMIN, NULL), 0);
    ASSERT_TRUE(strstr(cli_out, "# Hot") != NULL);
    ASSERT_EQ(cli_run(addr, "--token", TOK_ADMIN, "put", kvpath, NULL), 5); /* no data role */
    ASSERT_EQ(cli_run(addr, "--token", TOK_ADMIN, "evict", zero, NULL), 1);
}

static void test_daemon_down(void)
{
    /* Nothing listening. */
    ASSERT_EQ(cli_run("--addr", "127.0.0.1:1", "--timeout", "3000", "ping", NULL), 4);
    ASSERT_EQ(cli_run("--addr", "127.0.0.1:1", "--timeout", "3000", "ls", NULL), 4);

    /* The daemon stopped: every command that needs it exits 4. */
    ASSERT_TRUE(lkv_daemon_stop(&dm, SIGTERM, 15000) >= 0);
    static const char *cases[][4] = {
        {"ping", NULL},  {"ls", NULL},     {"stats", NULL},   {"stats", "--json", NULL},
        {"put", NULL},   {"get", NULL},    {"lookup", NULL},  {"rm", NULL},
        {"evict", NULL}, {"attach", NULL}, {"release", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *w[10];
        int n = 0;
        w[n++] = addr;
        w[n++] = "--timeout=3000";
        w[n++] = "--token=" TOK_ADMIN;
        for (int k = 0; cases[i][k] != NULL; k++) {
            w[n++] = cases[i][k];
        }
        const char *c = cases[i][0];
        if (strcmp(c, "put") == 0) {
            w[n++] = kvpath;
        } else if (strcmp(c, "release") == 0) {
            w[n++] = lease0;
        } else if (strcmp(c, "get") == 0 || strcmp(c, "lookup") == 0 || strcmp(c, "rm") == 0 ||
                   strcmp(c, "evict") == 0 || strcmp(c, "attach") == 0) {
            w[n++] = key;
        }
        ASSERT_EQ(cli_runv(n, w), 4);
        ASSERT_TRUE(strstr(cli_err, "unavailable") != NULL);
    }
}

int main(void)
{
    const char *args[] = {LKV_IT_PROFILE_ARGS,
                          "--set",
                          "loopback_roles=none",
                          "--set",
                          "tenant.alice.token_hash=blake2b:" HASH_ALICE,
                          "--set",
                          "tenant.alice.roles=data",
                          "--set",
                          "tenant.ops.token_hash=blake2b:" HASH_ADMIN,
                          "--set",
                          "tenant.ops.roles=admin",
                          NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    cli_dir = dm.dir;
    snprintf(addr, sizeof(addr), "--addr=%s", dm.addr);

    it_doc d;
    lkv_it_doc_make(&lkv_it_itest, 4711, 40, &d);
    lkv_kvfile kf;
    memset(&kf, 0, sizeof(kf));
    snprintf(kf.profile, sizeof(kf.profile), "%s", lkv_it_itest.profile);
    kf.n_tokens = d.n_tokens;
    kf.tokens = d.tokens;
    kf.n_blocks = d.n_blocks;
    kf.block_bytes = d.block_bytes;
    kf.blocks = d.blocks;
    char err[256];
    snprintf(kvpath, sizeof(kvpath), "%s/doc.kv", dm.dir);
    ASSERT_OK(lkv_kvfile_write(kvpath, &kf, err, sizeof(err)));
    lkv_it_doc_free(&d);
    memcpy(key, zero, 65);

    LKV_RUN(test_help);
    LKV_RUN(test_usage_errors);
    LKV_RUN(test_auth);
    LKV_RUN(test_daemon_down);
    lkv_daemon_cleanup(&dm);
    return 0;
}
