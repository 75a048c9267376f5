/*
 * lazykv_cli.c: the `lazykv` command-line tool. It talks to one lazykvd through the public RPCs
 * only (client/lkv_client.h: lazykv.v1.Cache, lazykv.v1.Admin, grpc.health.v1), like redis-cli.
 *
 *     lazykv [--addr HOST:PORT] [--timeout MS] [--token T] [--tls-ca F [--tls-cert F --tls-key F]]
 *            COMMAND [ARGS]
 *
 * Commands: ping, put, get, lookup, rm, ls, evict, stats, attach, release, help; every command
 * takes --help. Global options may also follow the command word. Exit codes (the contract
 * scripts rely on; also printed by --help):
 *
 *     0  success (lookup: every document present)
 *     1  not found (get/rm/evict/release of an absent document or lease; lookup: a miss)
 *     2  usage error or bad local input (bad arguments, unreadable or corrupt KV file)
 *     3  the daemon refused the request or failed (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...)
 *     4  the daemon is unavailable (cannot connect, not serving, deadline exceeded)
 *     5  authentication or authorisation failed (UNAUTHENTICATED, PERMISSION_DENIED)
 *
 * Documents are named either by their 64-hex-digit key or by --profile NAME --tokens LIST,
 * where LIST is comma-separated token ids or @FILE (ids separated by commas or white space).
 * `evict` also takes a unique key prefix (at least 8 hex digits, as `ls` prints), resolved with
 * Admin/List.
 *
 * Output: human-readable by default (sizes in KiB/MiB/GiB, rates in percent); `ls`, `stats` and
 * `attach` take --json for one JSON object per line, with raw numbers (bytes, counts).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <grpc/status.h>

#include "lkv_client.h"
#include "lkv_err.h"
#include "lkv_kvfile.h"
#include "lkv_log.h"
#include "lkv_status.h"

#define EXIT_OK      0
#define EXIT_MISS    1
#define EXIT_USAGE   2
#define EXIT_SERVER  3
#define EXIT_UNAVAIL 4
#define EXIT_AUTH    5

#define DEFAULT_ADDR      "127.0.0.1:7070"
#define KEY_HEX           (2 * LKV_KEY_BYTES)
#define SHORT_KEY_HEX     16    /* Key digits `ls` prints without --full. */
#define MIN_PREFIX_HEX    8     /* Shortest key prefix `evict` resolves. */
#define LS_DEFAULT_LIMIT  100   /* Documents per `ls` page. */
#define LS_MAX_LIMIT      10000 /* The daemon's List limit. */
#define ATTACH_DEFAULT_MS 30000 /* Default lease TTL of `attach`. */

static const char *exit_codes_help =
    "Exit codes:\n"
    "  0  success (lookup: every document present)\n"
    "  1  not found (get/rm/evict/release: document or lease absent; lookup: a miss)\n"
    "  2  usage error or bad local input (arguments, unreadable or corrupt KV file)\n"
    "  3  the daemon refused or failed the request (bad input, budget exhausted, ...)\n"
    "  4  the daemon is unavailable (cannot connect, not serving, deadline exceeded)\n"
    "  5  authentication or permission failure (missing/wrong token, role lacking)\n";

static const char *main_help =
    "usage: lazykv [--addr HOST:PORT] [--timeout MS] [--token TOKEN] COMMAND [ARGS]\n"
    "\n"
    "Talks to one lazykvd through its public RPCs.\n"
    "\n"
    "Commands (each takes --help; `lazykv help COMMAND` too):\n"
    "  ping                      health check (grpc.health.v1)\n"
    "  put FILE                  store the document in a KV file; prints its key\n"
    "  get DOC [-o FILE]         fetch a document (into a KV file with -o)\n"
    "  lookup DOC...             report whether documents are cached, and where\n"
    "  rm DOC                    delete a document from every tier\n"
    "  ls                        list cached documents (admin; --all, --json, filters)\n"
    "  evict KEY...              move documents out of the hot tier (admin)\n"
    "  stats [SECTION]           daemon statistics (admin; --json, --raw, --watch S)\n"
    "  attach DOC...             pin documents under a lease, print its pages (worker)\n"
    "  release LEASE             end a lease (worker)\n"
    "  cluster                   members, their state, tiers and share of the key space\n"
    "\n"
    "DOC is a 64-hex-digit key, or --profile NAME --tokens LIST (LIST: comma-separated\n"
    "token ids, or @FILE with ids separated by commas or white space).\n"
    "\n"
    "Global options (before or after the command word):\n"
    "  --addr HOST:PORT          daemon address (default $LAZYKV_ADDR, else " DEFAULT_ADDR ")\n"
    "  --timeout MS              deadline of each call (default 30000)\n"
    "  --token TOKEN             bearer token (default $LAZYKV_TOKEN)\n"
    "  --tls-ca FILE             use TLS; verify the daemon against this CA (PEM)\n"
    "                            (default $LAZYKV_TLS_CA)\n"
    "  --tls-cert FILE           client certificate (PEM) for a daemon that requires one\n"
    "                            (default $LAZYKV_TLS_CERT)\n"
    "  --tls-key FILE            its private key (PEM) (default $LAZYKV_TLS_KEY)\n"
    "  --tls-server-name NAME    name to check the daemon's certificate against instead of\n"
    "                            the host of --addr (default $LAZYKV_TLS_SERVER_NAME)\n"
    "\n";

typedef struct cli {
    lkv_client_t *c;   /* Connected handle. */
    int timeout_ms;    /* Per-call deadline. */
    const char *token; /* --token / $LAZYKV_TOKEN (for other members), or NULL. */
} cli;

/* A document named on the command line. */
typedef struct docarg {
    int by_key;                 /* 1: key; 0: profile + tokens. */
    uint8_t key[LKV_KEY_BYTES]; /* When by_key. */
    const char *profile;        /* Borrowed from argv. */
    uint32_t *tokens;           /* Owned (free). */
    size_t n_tokens;            /* Count. */
} docarg;

static int usage_err(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "lazykv%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    fprintf(stderr, fmt, arg ? arg : "");
    fprintf(stderr, "\n(try lazykv%s%s --help)\n", cmd ? " " : "", cmd ? cmd : "");
    return EXIT_USAGE;
}

/* Prints the failed call's message and returns the exit code for rc. */
static int rpc_fail(const char *what, int rc)
{
    const char *msg = lkv_client_last_error();
    fprintf(stderr, "lazykv %s: %s (%s)%s%s\n", what, lkv_strerror(rc), lkv_err_name(rc),
            msg[0] ? ": " : "", msg);
    /* By the code's status family (the one table, proto/lkv_status.c), so that every code of a
     * family (e.g. LKV_EUNAVAIL, LKV_ESHUTDOWN) gives the exit code README.md documents. */
    switch (lkv_status_from_err(rc)) {
    case GRPC_STATUS_NOT_FOUND:
        return EXIT_MISS;
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return EXIT_UNAVAIL;
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED:
        return EXIT_AUTH;
    default:
        return EXIT_SERVER;
    }
}

/* Parses token ids from text (commas or white space between ids) into *out (owned). */
static int parse_token_text(const char *s, uint32_t **out, size_t *n)
{
    size_t cap = 64, k = 0;
    uint32_t *v = lkv_xmalloc(cap * sizeof(*v));
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            p++;
        }
        if (*p == '\0') {
            break;
        }
        char *end = NULL;
        errno = 0;
        unsigned long long x = strtoull(p, &end, 10);
        if (end == p || errno != 0 || x > UINT32_MAX || *p == '-') {
            free(v);
            return -1;
        }
        if (k == cap) {
            cap *= 2;
            v = lkv_xrealloc(v, cap * sizeof(*v));
        }
        v[k++] = (uint32_t)x;
        p = end;
    }
    if (k == 0) {
        free(v);
        return -1;
    }
    *out = v;
    *n = k;
    return 0;
}

static int parse_tokens(const char *arg, uint32_t **out, size_t *n)
{
    if (arg[0] != '@') {
        return parse_token_text(arg, out, n);
    }
    FILE *f = fopen(arg + 1, "rb");
    if (f == NULL) {
        return -1;
    }
    size_t cap = 4096, len = 0;
    char *buf = lkv_xmalloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) {
            cap *= 2;
            buf = lkv_xrealloc(buf, cap);
        }
    }
    fclose(f);
    buf[len] = '\0';
    int rc = parse_token_text(buf, out, n);
    free(buf);
    return rc;
}

static void docarg_free(docarg *d)
{
    free(d->tokens);
    d->tokens = NULL;
}

static void docarg_ref(const docarg *d, lkv_docref *r)
{
    memset(r, 0, sizeof(*r));
    if (d->by_key) {
        r->key = d->key;
    } else {
        r->profile = d->profile;
        r->tokens = d->tokens;
        r->n_tokens = d->n_tokens;
    }
}

static int want_help(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            return 1;
        }
    }
    return 0;
}

/* ---- commands ---- */

static int cmd_ping(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv ping [SERVICE]\n\nChecks the daemon with grpc.health.v1 "
               "Health/Check (SERVICE default \"\": the whole daemon).\nPrints SERVING on "
               "success.\n\n%s",
               exit_codes_help);
        return EXIT_OK;
    }
    if (argc > 1) {
        return usage_err("ping", "too many arguments", NULL);
    }
    int rc = lkv_client_ping(x->c, argc == 1 ? argv[0] : "", x->timeout_ms);
    if (rc != 0) {
        int e = rpc_fail("ping", rc);
        return e == EXIT_MISS ? EXIT_SERVER : e;
    }
    printf("SERVING\n");
    return EXIT_OK;
}

static const char *durability_name(int d)
{
    return d == LKV_WIRE_DURABILITY_HOT       ? "hot"
           : d == LKV_WIRE_DURABILITY_DURABLE ? "durable"
                                              : "unspecified";
}

static const char *tier_name(int t)
{
    return t == LKV_WIRE_TIER_HOT ? "hot" : t == LKV_WIRE_TIER_COLD ? "cold" : "absent";
}

static int cmd_put(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv put FILE\n\nStores the document held in a KV file (format: "
               "client/lkv_kvfile.h) and prints\n\"KEY tokens=N blocks=M durability=hot|durable "
               "[already-present]\".\n\n%s",
               exit_codes_help);
        return EXIT_OK;
    }
    if (argc != 1) {
        return usage_err("put", "expected exactly one FILE", NULL);
    }
    lkv_kvfile kf;
    char err[512];
    if (lkv_kvfile_read(argv[0], &kf, err, sizeof(err)) != 0) {
        fprintf(stderr, "lazykv put: %s\n", err);
        return EXIT_USAGE;
    }
    if (kf.tokens == NULL) {
        fprintf(stderr,
                "lazykv put: %s has no token ids (written by a get by key); a document "
                "can only be stored with its token ids\n",
                argv[0]);
        lkv_kvfile_free(&kf);
        return EXIT_USAGE;
    }
    lkv_put_reply r;
    int rc = lkv_client_put(x->c, kf.profile, kf.tokens, kf.n_tokens, kf.blocks, kf.n_blocks,
                            (size_t)kf.block_bytes, x->timeout_ms, &r);
    lkv_kvfile_free(&kf);
    if (rc != 0) {
        return rpc_fail("put", rc);
    }
    char hex[2 * LKV_KEY_BYTES + 1];
    lkv_key_to_hex(r.key, hex);
    printf("%s tokens=%" PRIu64 " blocks=%u durability=%s%s\n", hex, r.n_tokens, r.n_blocks,
           durability_name(r.durability), r.already_present ? " already-present" : "");
    return EXIT_OK;
}

/* Parses DOC arguments (KEY or --profile/--tokens) plus -o FILE (if out is not NULL) from
 * argv. Fills up to max docs; returns the count, or -1 after printing a usage error. */
static int parse_docs(const char *cmd, int argc, char **argv, docarg *docs, int max,
                      const char **out)
{
    int n = 0;
    const char *profile = NULL, *tokens = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--profile") == 0 || strcmp(a, "--tokens") == 0 ||
            (out != NULL && strcmp(a, "-o") == 0)) {
            if (i + 1 >= argc) {
                usage_err(cmd, "%s needs a value", a);
                return -1;
            }
            const char *v = argv[++i];
            if (a[2] == 'p') {
                profile = v;
            } else if (a[2] == 't') {
                tokens = v;
            } else {
                *out = v;
            }
        } else if (a[0] == '-') {
            usage_err(cmd, "unknown option %s", a);
            return -1;
        } else {
            if (n == max) {
                usage_err(cmd, "too many documents", NULL);
                return -1;
            }
            docarg *d = &docs[n];
            memset(d, 0, sizeof(*d));
            if (lkv_key_from_hex(a, d->key) != 0) {
                usage_err(cmd, "not a 64-hex-digit key: %s", a);
                return -1;
            }
            d->by_key = 1;
            n++;
        }
    }
    if ((profile == NULL) != (tokens == NULL)) {
        usage_err(cmd, "--profile and --tokens go together", NULL);
        return -1;
    }
    if (tokens != NULL) {
        if (n == max) {
            usage_err(cmd, "too many documents", NULL);
            return -1;
        }
        docarg *d = &docs[n];
        memset(d, 0, sizeof(*d));
        d->profile = profile;
        if (parse_tokens(tokens, &d->tokens, &d->n_tokens) != 0) {
            usage_err(cmd, "bad token list %s (comma-separated ids, or @FILE)", tokens);
            return -1;
        }
        n++;
    }
    if (n == 0) {
        usage_err(cmd, "name a document: KEY, or --profile NAME --tokens LIST", NULL);
        return -1;
    }
    return n;
}

static int cmd_get(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv get (KEY | --profile NAME --tokens LIST) [-o FILE]\n\n"
               "Fetches a document's blocks. With -o, writes a KV file (with token ids when\n"
               "named by --tokens; a file written from a KEY has no token ids and cannot be\n"
               "put again). Prints \"KEY profile=P tokens=N blocks=M block_bytes=B tier=T\".\n\n%s",
               exit_codes_help);
        return EXIT_OK;
    }
    docarg d;
    const char *out = NULL;
    int n = parse_docs("get", argc, argv, &d, 1, &out);
    if (n < 0) {
        return EXIT_USAGE;
    }
    lkv_docref ref;
    docarg_ref(&d, &ref);
    lkv_get_header h;
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = lkv_client_get_buf(x->c, &ref, x->timeout_ms, &h, &data, &len);
    if (rc != 0) {
        docarg_free(&d);
        return rpc_fail("get", rc);
    }
    int ex = EXIT_OK;
    if (out != NULL) {
        lkv_kvfile kf;
        memset(&kf, 0, sizeof(kf));
        snprintf(kf.profile, sizeof(kf.profile), "%s", h.profile);
        kf.n_tokens = (uint32_t)h.n_tokens;
        kf.tokens = d.by_key ? NULL : d.tokens;
        kf.n_blocks = h.n_blocks;
        kf.block_bytes = h.block_bytes;
        kf.blocks = data;
        char err[512];
        if (lkv_kvfile_write(out, &kf, err, sizeof(err)) != 0) {
            fprintf(stderr, "lazykv get: %s\n", err);
            ex = EXIT_USAGE;
        }
    }
    if (ex == EXIT_OK) {
        char hex[2 * LKV_KEY_BYTES + 1];
        lkv_key_to_hex(h.key, hex);
        printf("%s profile=%s tokens=%" PRIu64 " blocks=%u block_bytes=%" PRIu64 " tier=%s\n", hex,
               h.profile, h.n_tokens, h.n_blocks, h.block_bytes, tier_name(h.tier));
    }
    free(data);
    docarg_free(&d);
    return ex;
}

static const char *miss_name(int m)
{
    static const char *names[] = {"none",    "unknown", "evicted", "corrupt",
                                  "deleted", "lost",    "profile"};
    return m >= 0 && m < 7 ? names[m] : "unknown";
}

static int cmd_lookup(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv lookup (KEY... | --profile NAME --tokens LIST)\n\n"
               "Prints one line per document, in order:\n"
               "  \"KEY present tier=hot|cold tokens=N blocks=M profile=P\" or\n"
               "  \"KEY absent cause=unknown|evicted|corrupt|deleted|lost|profile\".\n\n%s",
               exit_codes_help);
        return EXIT_OK;
    }
    int max = argc + 1;
    docarg *docs = lkv_xcalloc((size_t)max, sizeof(*docs));
    int n = parse_docs("lookup", argc, argv, docs, max, NULL);
    if (n < 0) {
        free(docs);
        return EXIT_USAGE;
    }
    lkv_docref *refs = lkv_xcalloc((size_t)n, sizeof(*refs));
    lkv_doc_status *st = lkv_xcalloc((size_t)n, sizeof(*st));
    for (int i = 0; i < n; i++) {
        docarg_ref(&docs[i], &refs[i]);
    }
    int ex = EXIT_OK;
    int rc = lkv_client_lookup(x->c, refs, (size_t)n, x->timeout_ms, st);
    if (rc != 0) {
        ex = rpc_fail("lookup", rc);
    } else {
        for (int i = 0; i < n; i++) {
            char hex[2 * LKV_KEY_BYTES + 1];
            lkv_key_to_hex(st[i].key, hex);
            if (st[i].present) {
                printf("%s present tier=%s tokens=%" PRIu64 " blocks=%u profile=%s\n", hex,
                       tier_name(st[i].tier), st[i].n_tokens, st[i].n_blocks, st[i].profile);
            } else {
                printf("%s absent cause=%s\n", hex, miss_name(st[i].miss_cause));
                ex = EXIT_MISS;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        docarg_free(&docs[i]);
    }
    free(st);
    free(refs);
    free(docs);
    return ex;
}

static int cmd_rm(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv rm (KEY | --profile NAME --tokens LIST)\n\n"
               "Deletes a document from every tier; prints \"deleted KEY\".\n\n%s",
               exit_codes_help);
        return EXIT_OK;
    }
    docarg d;
    int n = parse_docs("rm", argc, argv, &d, 1, NULL);
    if (n < 0) {
        return EXIT_USAGE;
    }
    lkv_docref ref;
    docarg_ref(&d, &ref);
    uint8_t key[LKV_KEY_BYTES];
    int rc = lkv_client_delete(x->c, &ref, x->timeout_ms, key);
    docarg_free(&d);
    if (rc != 0) {
        return rpc_fail("rm", rc);
    }
    char hex[2 * LKV_KEY_BYTES + 1];
    lkv_key_to_hex(key, hex);
    printf("deleted %s\n", hex);
    return EXIT_OK;
}

/* ---- output helpers ---- */

/* Prints s as a JSON string (quotes and escapes). */
static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            printf("\\%c", *p);
        } else if (*p < 0x20) {
            printf("\\u%04x", *p);
        } else {
            putchar(*p);
        }
    }
    putchar('"');
}

/* Prints a number as JSON: an integer when it is one, else with full precision. */
static void json_num(double v)
{
    if (v == (double)(long long)v && v < 9.007e15 && v > -9.007e15) {
        printf("%lld", (long long)v);
    } else {
        printf("%.17g", v);
    }
}

static void json_value(const lkv_stat_entry *e)
{
    if (e->text[0] != '\0') {
        json_str(e->text);
    } else {
        json_num(e->value);
    }
}

/* Formats a byte count in binary units into buf: "512 B", "1.5 KiB", "20.0 MiB". */
static const char *human_bytes(double v, char *buf, size_t cap)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double x = v;
    while (x >= 1024.0 && u < 5) {
        x /= 1024.0;
        u++;
    }
    if (u == 0) {
        snprintf(buf, cap, "%.0f B", v);
    } else {
        snprintf(buf, cap, "%.1f %s", x, units[u]);
    }
    return buf;
}

/* Formats seconds as "3d 4h 5m 6s" (leading zero units left out). */
static const char *human_duration(double s, char *buf, size_t cap)
{
    unsigned long long t = s > 0 ? (unsigned long long)s : 0;
    unsigned long long d = t / 86400, h = t / 3600 % 24, m = t / 60 % 60, sec = t % 60;
    if (d > 0) {
        snprintf(buf, cap, "%llud %lluh %llum %llus", d, h, m, sec);
    } else if (h > 0) {
        snprintf(buf, cap, "%lluh %llum %llus", h, m, sec);
    } else if (m > 0) {
        snprintf(buf, cap, "%llum %llus", m, sec);
    } else {
        snprintf(buf, cap, "%llus", sec);
    }
    return buf;
}

/* Formats part/whole as a percentage ("12.5%"), "-" when whole is 0. */
static const char *percent(double part, double whole, char *buf, size_t cap)
{
    if (whole <= 0) {
        snprintf(buf, cap, "-");
    } else if (part > 0 && 100.0 * part / whole < 0.1) {
        snprintf(buf, cap, "<0.1%%");
    } else {
        snprintf(buf, cap, "%.1f%%", 100.0 * part / whole);
    }
    return buf;
}

static const char *plain_num(double v, char *buf, size_t cap)
{
    if (v == (double)(long long)v && v < 9.007e15 && v > -9.007e15) {
        snprintf(buf, cap, "%lld", (long long)v);
    } else {
        snprintf(buf, cap, "%.4g", v);
    }
    return buf;
}

/* ---- stats ---- */

/* Prints entries as one JSON object {"section": {"key": value, ...}, ...}, sections in order
 * of first appearance. */
static void print_stats_json(const lkv_stat_entry *e, size_t n)
{
    printf("{");
    int first_sec = 1;
    for (size_t i = 0; i < n; i++) {
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) {
            seen = strcmp(e[j].section, e[i].section) == 0;
        }
        if (seen) {
            continue;
        }
        printf("%s", first_sec ? "" : ", ");
        first_sec = 0;
        json_str(e[i].section);
        printf(": {");
        int first = 1;
        for (size_t j = i; j < n; j++) {
            if (strcmp(e[j].section, e[i].section) == 0) {
                printf("%s", first ? "" : ", ");
                first = 0;
                json_str(e[j].key);
                printf(": ");
                json_value(&e[j]);
            }
        }
        printf("}");
    }
    printf("}\n");
}

/* Numeric value of section/key among entries, or dflt if absent. */
static double stat_get(const lkv_stat_entry *e, size_t n, const char *section, const char *key,
                       double dflt)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].section, section) == 0 && strcmp(e[i].key, key) == 0) {
            return e[i].value;
        }
    }
    return dflt;
}

static void stat_line(const char *key, const char *value)
{
    char k[80];
    snprintf(k, sizeof(k), "%s:", key);
    printf("%-24s %s\n", k, value);
}

/* The derived lines of the Lookups section: hit rates per tier and misses by cause. */
static void print_lookup_summary(const lkv_stat_entry *e, size_t n)
{
    double hh = stat_get(e, n, "lookups", "hits_hot", 0),
           hc = stat_get(e, n, "lookups", "hits_cold", 0);
    double ms = stat_get(e, n, "lookups", "misses", 0), all = hh + hc + ms;
    char a[32], b[32], c[32], line[512];
    snprintf(line, sizeof(line), "%s of %s lookups (hot %s, cold %s)", percent(hh + hc, all, a, 32),
             plain_num(all, b, 32), percent(hh, all, c, 32), percent(hc, all, line + 400, 32));
    stat_line("hit_rate", line);
    size_t len = 0;
    line[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].section, "lookups") == 0 && strncmp(e[i].key, "misses_", 7) == 0 &&
            e[i].value > 0 && len < sizeof(line) - 64) {
            len += (size_t)snprintf(line + len, sizeof(line) - len, "%s%s %s (%s)", len ? ", " : "",
                                    e[i].key + 7, plain_num(e[i].value, a, 32),
                                    percent(e[i].value, ms, b, 32));
        }
    }
    stat_line("misses_by_cause", len ? line : "none");
}

/* Prints the Calls section: one line per method. */
static void print_calls(const lkv_stat_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(e[i].key);
        if (strcmp(e[i].section, "calls") != 0 || kl < 6 || strcmp(e[i].key + kl - 6, ".calls")) {
            continue;
        }
        char method[64], k[80], a[32], line[160];
        snprintf(method, sizeof(method), "%.*s", (int)(kl - 6), e[i].key);
        snprintf(k, sizeof(k), "%s.errors", method);
        double errs = stat_get(e, n, "calls", k, 0);
        snprintf(k, sizeof(k), "%s.usec_per_call", method);
        double us = stat_get(e, n, "calls", k, 0);
        snprintf(line, sizeof(line), "%s call%s, %s error%s, %.1f us/call",
                 plain_num(e[i].value, a, 32), e[i].value == 1 ? "" : "s", plain_num(errs, k, 32),
                 errs == 1 ? "" : "s", us);
        stat_line(method, line);
    }
}

/* Prints entries for people: "# Section" headers, "key: value" lines with sizes in binary
 * units, shares of budgets and rates in percent, plus derived lines (hit rate per tier, misses
 * by cause) and one line per RPC method. */
static void print_stats_human(const lkv_stat_entry *e, size_t n)
{
    int first_sec = 1;
    for (size_t i = 0; i < n; i++) {
        const char *sec = e[i].section;
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) {
            seen = strcmp(e[j].section, sec) == 0;
        }
        if (seen) {
            continue;
        }
        printf("%s# %c%s\n", first_sec ? "" : "\n",
               sec[0] >= 'a' && sec[0] <= 'z' ? sec[0] - 'a' + 'A' : sec[0], sec + 1);
        first_sec = 0;
        if (strcmp(sec, "calls") == 0) {
            print_calls(e, n);
            continue;
        }
        double budget = stat_get(e, n, sec, "bytes_budget", 0);
        for (size_t j = i; j < n; j++) {
            if (strcmp(e[j].section, sec) != 0) {
                continue;
            }
            const char *k = e[j].key;
            double v = e[j].value;
            char val[256], a[64], b[64];
            if (e[j].text[0] != '\0') {
                snprintf(val, sizeof(val), "%s", e[j].text);
            } else if (strcmp(k, "uptime_s") == 0) {
                human_duration(v, val, sizeof(val));
            } else if (strcmp(k, "bytes_budget") == 0 && v == 0) {
                snprintf(val, sizeof(val), "unlimited");
            } else if (strstr(k, "bytes") != NULL && strcmp(k, "bytes_budget") != 0 &&
                       strcmp(k, "page_bytes") != 0 && budget > 0) {
                snprintf(val, sizeof(val), "%s (%s of budget)", human_bytes(v, a, sizeof(a)),
                         percent(v, budget, b, sizeof(b)));
            } else if (strstr(k, "bytes") != NULL) {
                human_bytes(v, val, sizeof(val));
            } else if (strncmp(k, "hit_rate", 8) == 0) {
                snprintf(val, sizeof(val), "%.1f%%", 100.0 * v);
            } else if (strcmp(k, "pages_free") == 0) {
                snprintf(val, sizeof(val), "%s (%s)", plain_num(v, a, sizeof(a)),
                         percent(v, stat_get(e, n, sec, "pages_total", 0), b, sizeof(b)));
            } else {
                plain_num(v, val, sizeof(val));
            }
            stat_line(k, val);
        }
        if (strcmp(sec, "lookups") == 0) {
            print_lookup_summary(e, n);
        }
    }
}

/* Prints, for people, how fast counters moved between two samples dt seconds apart (prev and
 * cur, both borrowed): lookups per second with the interval's hit rate, and calls per second of
 * every RPC method that was called. */
static void print_rates(const lkv_stat_entry *prev, size_t np, const lkv_stat_entry *cur, size_t nc,
                        double dt)
{
    if (dt <= 0) {
        return;
    }
    printf("\n# Rates (per second, last %.1f s)\n", dt);
    double hits = 0, all = 0;
    static const char *keys[] = {"hits_hot", "hits_cold", "misses"};
    for (int k = 0; k < 3; k++) {
        double d =
            stat_get(cur, nc, "lookups", keys[k], 0) - stat_get(prev, np, "lookups", keys[k], 0);
        all += d;
        hits += k < 2 ? d : 0;
    }
    char line[160], a[32];
    if (stat_get(cur, nc, "lookups", "misses", -1) >= 0) {
        snprintf(line, sizeof(line), "%.1f/s (hit rate %s)", all / dt, percent(hits, all, a, 32));
        stat_line("lookups", line);
    }
    for (size_t i = 0; i < nc; i++) {
        size_t kl = strlen(cur[i].key);
        if (strcmp(cur[i].section, "calls") != 0 || kl < 6 ||
            strcmp(cur[i].key + kl - 6, ".calls") != 0) {
            continue;
        }
        double d = cur[i].value - stat_get(prev, np, "calls", cur[i].key, 0);
        if (d > 0) {
            char method[64];
            snprintf(method, sizeof(method), "%.*s", (int)(kl - 6), cur[i].key);
            snprintf(line, sizeof(line), "%.1f calls/s", d / dt);
            stat_line(method, line);
        }
    }
}

/* One stats sample of the n sections (0: all): prints the human view, the daemon's INFO text
 * (raw) or a JSON line. Unless raw, *out and *n_out (may be NULL) receive the entries (owned by
 * the caller, free()). Returns an exit code. */
static int stats_once(cli *x, char **sections, int n_sections, int json, int raw,
                      lkv_stat_entry **out, size_t *n_out)
{
    if (raw) {
        for (int k = 0; k < (n_sections ? n_sections : 1); k++) {
            char *info = NULL;
            int rc = lkv_client_stats(x->c, n_sections ? sections[k] : NULL, x->timeout_ms, &info);
            if (rc != 0) {
                return rpc_fail("stats", rc);
            }
            printf("%s", k > 0 ? "\n" : "");
            fputs(info, stdout);
            if (info[0] != '\0' && info[strlen(info) - 1] != '\n') {
                fputc('\n', stdout);
            }
            free(info);
        }
        return EXIT_OK;
    }
    lkv_stat_entry *e = NULL;
    size_t n = 0;
    int rc =
        lkv_client_stats_entries(x->c, n_sections == 1 ? sections[0] : NULL, x->timeout_ms, &e, &n);
    if (rc != 0) {
        return rpc_fail("stats", rc);
    }
    if (n_sections > 1) { /* Keep the entries of the sections asked for (daemon order). */
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            int keep = 0;
            for (int k = 0; k < n_sections && !keep; k++) {
                keep = strcasecmp(e[i].section, sections[k]) == 0;
            }
            if (keep) {
                e[m++] = e[i];
            }
        }
        n = m;
    }
    if (json) {
        print_stats_json(e, n);
    } else {
        print_stats_human(e, n);
    }
    if (out != NULL) {
        *out = e;
        *n_out = n;
    } else {
        free(e);
    }
    return EXIT_OK;
}

/* Parses a positive decimal integer in [1, max]; 0 or -1. */
static int parse_count(const char *v, long max, long *out)
{
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || x < 1 || x > max) {
        return -1;
    }
    *out = x;
    return 0;
}

static int member_addr(cli *x, const char *want, char *addr, size_t len);
static lkv_client_t *member_client(const cli *x, const char *addr);

/* stats --member / --cluster: one sample from one member, or from each in turn. */
static int stats_members(cli *x, const char *member, char **sections, int n_sections, int json,
                         int raw)
{
    char addrs[64][128], ids[64][160];
    int n = 0;
    if (member != NULL) {
        int ex = member_addr(x, member, addrs[0], sizeof(addrs[0]));
        if (ex != EXIT_OK) {
            return ex;
        }
        snprintf(ids[0], sizeof(ids[0]), "%s", member);
        n = 1;
    } else {
        lkv_cluster_info ci;
        int rc = lkv_client_cluster(x->c, x->timeout_ms, &ci);
        if (rc != 0) {
            return rpc_fail("stats --cluster", rc);
        }
        for (size_t i = 0; i < ci.n_members && n < 64; i++) {
            snprintf(addrs[n], sizeof(addrs[n]), "%s", ci.members[i].addr);
            snprintf(ids[n], sizeof(ids[n]), "%s (%s)", ci.members[i].id, ci.members[i].state);
            n++;
        }
        lkv_cluster_info_free(&ci);
    }
    int worst = EXIT_OK;
    lkv_client_t *home = x->c;
    for (int i = 0; i < n; i++) {
        lkv_client_t *c = member_client(x, addrs[i]);
        if (c == NULL) {
            worst = EXIT_UNAVAIL;
            continue;
        }
        if (!json) {
            printf("%s# member %s at %s\n", i ? "\n" : "", ids[i], addrs[i]);
        }
        x->c = c;
        lkv_stat_entry *e = NULL;
        size_t ne = 0;
        int ex = stats_once(x, sections, n_sections, json, raw, &e, &ne);
        free(e);
        x->c = home;
        lkv_client_destroy(c);
        if (ex != EXIT_OK) {
            worst = ex;
        }
    }
    return worst;
}

static int cmd_stats(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf(
            "usage: lazykv stats [--json | --raw] [--watch SECONDS [--count N]]\n"
            "                    [--member ID|ADDR | --cluster] [SECTION...]\n\n"
            "Prints the daemon's statistics (lazykv.v1.Admin/Stats; admin role), all sections\n"
            "or the ones named (server, hot, cold, lookups, movement, puts, persistence, leases,\n"
            "tenants, calls). By default for people: sizes in KiB/MiB/GiB with their share of the "
            "tier\n"
            "budget, hit rates in percent, hit rate per tier and misses by cause, one line per\n"
            "RPC method. --raw prints the daemon's INFO text (\"key:value\" lines, raw numbers);\n"
            "--json one JSON object {\"section\": {\"key\": value, ...}, ...} per line.\n"
            "--watch repeats every SECONDS (N times with --count, else until interrupted); from\n"
            "the second sample on, the human view ends with a Rates section (lookups per\n"
            "second with the interval's hit rate, calls per second per RPC method). A failed\n"
            "sample ends the watch with its exit code.\n"
            "In a cluster, --member ID|ADDR shows that member's statistics (found through\n"
            "Cluster at --addr) and --cluster every member's, one after the other, each headed\n"
            "\"# member ID (ADDR)\".\n\n%s",
            exit_codes_help);
        return EXIT_OK;
    }
    int json = 0, raw = 0, all_members = 0;
    const char *member = NULL;
    double every = 0;
    long count = 1;
    int counted = 0;
    char **sections = lkv_xcalloc((size_t)argc + 1, sizeof(*sections));
    int n_sections = 0, ex = EXIT_OK;
    lkv_stat_entry *prev = NULL; /* Previous sample (--watch rates). */
    size_t n_prev = 0;
    struct timespec t_prev = {0, 0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--raw") == 0) {
            raw = 1;
        } else if (strcmp(a, "--member") == 0 && i + 1 < argc) {
            member = argv[++i];
        } else if (strcmp(a, "--cluster") == 0) {
            all_members = 1;
        } else if (strcmp(a, "--watch") == 0 || strcmp(a, "--count") == 0) {
            if (i + 1 >= argc) {
                ex = usage_err("stats", "%s needs a value", a);
                goto out;
            }
            const char *v = argv[++i];
            if (a[2] == 'w') {
                char *end = NULL;
                every = strtod(v, &end);
                if (end == v || *end != '\0' || !(every >= 0.01) || every > 86400) {
                    ex = usage_err("stats", "bad --watch %s (seconds, 0.01 .. 86400)", v);
                    goto out;
                }
            } else {
                if (parse_count(v, 1000000000L, &count) != 0) {
                    ex = usage_err("stats", "bad --count %s (a whole number >= 1)", v);
                    goto out;
                }
                counted = 1;
            }
        } else if (a[0] == '-') {
            ex = usage_err("stats", "unknown option %s", a);
            goto out;
        } else {
            sections[n_sections++] = argv[i];
        }
    }
    if (json && raw) {
        ex = usage_err("stats", "--json and --raw exclude each other", NULL);
        goto out;
    }
    if (counted && every <= 0) {
        ex = usage_err("stats", "--count goes with --watch", NULL);
        goto out;
    }
    if (every > 0 && !counted) {
        count = -1; /* Until interrupted. */
    }
    if (member != NULL || all_members) {
        ex = stats_members(x, member, sections, n_sections, json, raw);
        goto out;
    }
    for (long k = 0; count < 0 || k < count; k++) {
        if (k > 0) {
            struct timespec ts = {(time_t)every, (long)((every - (double)(time_t)every) * 1e9)};
            nanosleep(&ts, NULL);
            if (!json) {
                printf("\n");
            }
        }
        if (every > 0 && !json) {
            char tb[32];
            time_t now = time(NULL);
            struct tm tmv;
            strftime(tb, sizeof(tb), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
            printf("# ---- sample %ld at %s\n", k + 1, tb);
        }
        lkv_stat_entry *e = NULL;
        size_t n = 0;
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        ex = stats_once(x, sections, n_sections, json, raw, &e, &n);
        if (ex == EXIT_OK && !json && !raw && prev != NULL) {
            print_rates(prev, n_prev, e, n,
                        (double)(t.tv_sec - t_prev.tv_sec) + 1e-9 * (t.tv_nsec - t_prev.tv_nsec));
        }
        fflush(stdout);
        free(prev);
        prev = e;
        n_prev = n;
        t_prev = t;
        if (ex != EXIT_OK) {
            break;
        }
    }
out:
    free(prev);
    free(sections);
    return ex;
}

/* ---- ls ---- */

static int parse_tier(const char *v, int *tier)
{
    if (strcmp(v, "hot") == 0) {
        *tier = LKV_WIRE_TIER_HOT;
    } else if (strcmp(v, "cold") == 0) {
        *tier = LKV_WIRE_TIER_COLD;
    } else if (strcmp(v, "all") == 0) {
        *tier = LKV_WIRE_TIER_UNSPECIFIED;
    } else {
        return -1;
    }
    return 0;
}

static void ls_json_doc(const lkv_doc_status *d, int first)
{
    char hex[KEY_HEX + 1];
    lkv_key_to_hex(d->key, hex);
    printf("%s{\"key\": \"%s\", \"profile\": ", first ? "" : ", ", hex);
    json_str(d->profile);
    printf(", \"tier\": \"%s\", \"tokens\": %" PRIu64 ", \"blocks\": %u, \"bytes\": %" PRIu64
           ", \"pins\": %u}",
           tier_name(d->tier), d->n_tokens, d->n_blocks, d->bytes, d->pins);
}

static void ls_row(const lkv_doc_status *d, int full)
{
    char hex[KEY_HEX + 1], sz[32];
    lkv_key_to_hex(d->key, hex);
    if (!full) {
        hex[SHORT_KEY_HEX] = '\0';
    }
    printf("%-*s  %-16s  %-4s  %8" PRIu64 "  %6u  %10s  %4u\n", full ? KEY_HEX : SHORT_KEY_HEX, hex,
           d->profile, tier_name(d->tier), d->n_tokens, d->n_blocks,
           human_bytes((double)d->bytes, sz, sizeof(sz)), d->pins);
}

static int cmd_ls(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv ls [--profile NAME] [--tier hot|cold] [--limit N] [--after KEY]\n"
               "                 [--all] [--full] [--json]\n\n"
               "Lists cached documents in key order (lazykv.v1.Admin/List; admin role), one page\n"
               "of N (default %d, at most %d) documents after KEY, or every page with --all.\n"
               "Table columns: KEY (first %d hex digits; all 64 with --full), PROFILE, TIER,\n"
               "TOKENS, BLOCKS, SIZE (block payload, binary units), PINS (leases holding it);\n"
               "then a total, and the --after KEY of the next page when one remains.\n"
               "--json prints one object {\"docs\": [{\"key\", \"profile\", \"tier\", \"tokens\",\n"
               "\"blocks\", \"bytes\", \"pins\"}, ...], \"next_after_key\": KEY or null}.\n"
               "Keys are the daemon's store keys (what `evict` takes); with tenants configured\n"
               "they differ from the per-tenant keys that `put` prints.\n\n%s",
               LS_DEFAULT_LIMIT, LS_MAX_LIMIT, SHORT_KEY_HEX, exit_codes_help);
        return EXIT_OK;
    }
    lkv_list_filter f;
    memset(&f, 0, sizeof(f));
    f.limit = LS_DEFAULT_LIMIT;
    int all = 0, json = 0, full = 0;
    uint8_t after[LKV_KEY_BYTES];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--all") == 0) {
            all = 1;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--full") == 0) {
            full = 1;
        } else if (strcmp(a, "--profile") == 0 || strcmp(a, "--tier") == 0 ||
                   strcmp(a, "--limit") == 0 || strcmp(a, "--after") == 0) {
            if (i + 1 >= argc) {
                return usage_err("ls", "%s needs a value", a);
            }
            const char *v = argv[++i];
            long lim = 0;
            if (a[2] == 'p') {
                f.profile = v;
            } else if (a[2] == 't' && parse_tier(v, &f.tier) != 0) {
                return usage_err("ls", "bad --tier %s (hot, cold or all)", v);
            } else if (a[2] == 'l') {
                if (parse_count(v, LS_MAX_LIMIT, &lim) != 0) {
                    return usage_err("ls", "bad --limit %s (1 .. 10000)", v);
                }
                f.limit = (uint32_t)lim;
            } else if (a[2] == 'a') {
                if (lkv_key_from_hex(v, after) != 0) {
                    return usage_err("ls", "bad --after %s (a 64-hex-digit key)", v);
                }
                f.after_key = after;
            }
        } else if (a[0] == '-') {
            return usage_err("ls", "unknown option %s", a);
        } else {
            return usage_err("ls", "unexpected argument %s", a);
        }
    }
    uint64_t n_docs = 0, bytes = 0;
    int more = 0, first = 1;
    uint8_t next[LKV_KEY_BYTES];
    for (int page = 0;; page++) {
        lkv_doc_status *docs = NULL;
        size_t n = 0;
        int rc = lkv_client_list(x->c, &f, x->timeout_ms, &docs, &n, next, &more);
        if (rc != 0) {
            fflush(stdout);
            return rpc_fail("ls", rc);
        }
        if (page == 0 && json) {
            printf("{\"docs\": [");
        } else if (page == 0) {
            printf("%-*s  %-16s  %-4s  %8s  %6s  %10s  %4s\n", full ? KEY_HEX : SHORT_KEY_HEX,
                   "KEY", "PROFILE", "TIER", "TOKENS", "BLOCKS", "SIZE", "PINS");
        }
        for (size_t i = 0; i < n; i++) {
            if (json) {
                ls_json_doc(&docs[i], first);
            } else {
                ls_row(&docs[i], full);
            }
            first = 0;
            n_docs++;
            bytes += docs[i].bytes;
        }
        free(docs);
        if (!more || !all) {
            break;
        }
        memcpy(after, next, LKV_KEY_BYTES);
        f.after_key = after;
    }
    char hex[KEY_HEX + 1], sz[32];
    if (more) {
        lkv_key_to_hex(next, hex);
    }
    if (json) {
        printf("], \"next_after_key\": ");
        if (more) {
            printf("\"%s\"}\n", hex);
        } else {
            printf("null}\n");
        }
    } else {
        printf("%" PRIu64 " document%s, %s\n", n_docs, n_docs == 1 ? "" : "s",
               human_bytes((double)bytes, sz, sizeof(sz)));
        if (more) {
            printf("more: lazykv ls --after %s (or --all)\n", hex);
        }
    }
    return EXIT_OK;
}

/* ---- evict ---- */

/* 1 if the lowercase hex string h starts with prefix (len hex digits, any case). */
static int hex_prefix_match(const char *h, const char *prefix, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = prefix[i] >= 'A' && prefix[i] <= 'F' ? (char)(prefix[i] - 'A' + 'a') : prefix[i];
        if (h[i] != c) {
            return 0;
        }
    }
    return 1;
}

/* Resolves a key prefix (MIN_PREFIX_HEX .. 63 hex digits) to the one cached key that starts
 * with it, with Admin/List. Returns an exit code (1 when none matches, 2 when ambiguous). */
static int resolve_prefix(cli *x, const char *prefix, uint8_t *key)
{
    size_t len = strlen(prefix);
    char hex[KEY_HEX + 1];
    memset(hex, '0', KEY_HEX);
    hex[KEY_HEX] = '\0';
    memcpy(hex, prefix, len);
    uint8_t lo[LKV_KEY_BYTES];
    if (lkv_key_from_hex(hex, lo) != 0) {
        return usage_err("evict", "not a key or key prefix: %s", prefix);
    }
    /* List returns keys strictly after after_key: start just below prefix000...0. */
    int zero = 1;
    for (int i = LKV_KEY_BYTES - 1; i >= 0 && zero; i--) {
        zero = lo[i] == 0;
        lo[i]--;
    }
    lkv_list_filter f;
    memset(&f, 0, sizeof(f));
    f.limit = 2;
    f.after_key = zero ? NULL : lo; /* All zeros: begin at the first key. */
    lkv_doc_status *docs = NULL;
    size_t n = 0;
    int more = 0;
    int rc = lkv_client_list(x->c, &f, x->timeout_ms, &docs, &n, NULL, &more);
    if (rc != 0) {
        return rpc_fail("evict", rc);
    }
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        char h[KEY_HEX + 1];
        lkv_key_to_hex(docs[i].key, h);
        if (hex_prefix_match(h, prefix, len)) {
            if (found == 0) {
                memcpy(key, docs[i].key, LKV_KEY_BYTES);
            }
            found++;
        }
    }
    free(docs);
    if (found == 0) {
        fprintf(stderr, "lazykv evict: no cached document has a key starting with %s\n", prefix);
        return EXIT_MISS;
    }
    if (found > 1) {
        fprintf(stderr, "lazykv evict: key prefix %s is ambiguous; give more digits\n", prefix);
        return EXIT_USAGE;
    }
    return EXIT_OK;
}

static int is_hex(const char *s)
{
    for (; *s; s++) {
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') || (*s >= 'A' && *s <= 'F'))) {
            return 0;
        }
    }
    return 1;
}

static int cmd_evict(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv evict KEY...\n\n"
               "Moves each document out of the hot tier now (lazykv.v1.Admin/Evict; admin role):\n"
               "it stays in the cold tier (persisted first if needed). KEY is 64 hex digits or a\n"
               "unique prefix of at least %d (as `lazykv ls` prints). Prints \"evicted KEY\" per\n"
               "document. Every key is tried; the exit code is that of the first failure other\n"
               "than not-found (a pinned document: 3; unavailable: 4; ...), else 1 if a key was\n"
               "not cached or not hot (or a prefix matched nothing), else 0.\n\n%s",
               MIN_PREFIX_HEX, exit_codes_help);
        return EXIT_OK;
    }
    if (argc == 0) {
        return usage_err("evict", "name at least one KEY", NULL);
    }
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(argv[i]);
        if (argv[i][0] == '-') {
            return usage_err("evict", "unknown option %s", argv[i]);
        }
        if (!is_hex(argv[i]) || len < MIN_PREFIX_HEX || len > KEY_HEX) {
            return usage_err("evict", "not a key or key prefix (8..64 hex digits): %s", argv[i]);
        }
    }
    int ex = EXIT_OK, missed = 0;
    for (int i = 0; i < argc; i++) {
        uint8_t key[LKV_KEY_BYTES];
        int e = EXIT_OK;
        if (strlen(argv[i]) == KEY_HEX) {
            lkv_key_from_hex(argv[i], key);
        } else {
            e = resolve_prefix(x, argv[i], key);
        }
        if (e == EXIT_OK) {
            int rc = lkv_client_evict(x->c, key, x->timeout_ms);
            if (rc != 0) {
                e = rpc_fail("evict", rc);
            } else {
                char hex[KEY_HEX + 1];
                lkv_key_to_hex(key, hex);
                printf("evicted %s\n", hex);
            }
        }
        if (e == EXIT_MISS) {
            missed = 1;
        } else if (e != EXIT_OK && ex == EXIT_OK) {
            ex = e;
        }
    }
    return ex != EXIT_OK ? ex : missed ? EXIT_MISS : EXIT_OK;
}

/* ---- attach, release ---- */

static void bytes_to_hex(const uint8_t *b, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[2 * n] = '\0';
}

static int lease_from_hex(const char *s, uint8_t *id)
{
    if (strlen(s) != 2 * LKV_LEASE_ID_BYTES || !is_hex(s)) {
        return -1;
    }
    for (int i = 0; i < LKV_LEASE_ID_BYTES; i++) {
        char two[3] = {s[2 * i], s[2 * i + 1], '\0'};
        id[i] = (uint8_t)strtoul(two, NULL, 16);
    }
    return 0;
}

/* Prints pages as ranges: "3-5,9". */
static void print_pages(const uint32_t *p, uint32_t n)
{
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i;
        while (j + 1 < n && p[j + 1] == p[j] + 1) {
            j++;
        }
        printf("%s%u", i ? "," : "", p[i]);
        if (j > i) {
            printf("-%u", p[j]);
        }
        i = j + 1;
    }
}

static void print_lease(const lkv_lease *l, int json)
{
    char id[2 * LKV_LEASE_ID_BYTES + 1], hex[KEY_HEX + 1], sz[32];
    bytes_to_hex(l->id, LKV_LEASE_ID_BYTES, id);
    if (json) {
        printf("{\"lease_id\": \"%s\", \"ttl_ms\": %u, \"expires_unix_ms\": %" PRIu64
               ", \"lease_docs\": %u, \"arena\": {\"backend\": ",
               id, l->ttl_ms, l->expires_unix_ms, l->lease_docs);
        json_str(l->arena.backend);
        printf(", \"shm_name\": ");
        json_str(l->arena.shm_name);
        printf(", \"page_bytes\": %" PRIu64 ", \"n_pages\": %u, \"cuda_device\": %d}, \"docs\": [",
               l->arena.page_bytes, l->arena.n_pages, l->arena.cuda_device);
        for (size_t i = 0; i < l->n_docs; i++) {
            const lkv_attached_doc *d = &l->docs[i];
            lkv_key_to_hex(d->key, hex);
            printf("%s{\"key\": \"%s\", \"profile\": ", i ? ", " : "", hex);
            json_str(d->profile);
            printf(", \"tokens\": %" PRIu64 ", \"n_layers\": %u, \"n_kv_heads\": %u, "
                   "\"head_dim\": %u, \"dtype\": ",
                   d->n_tokens, d->n_layers, d->n_kv_heads, d->head_dim);
            json_str(d->dtype);
            printf(", \"block_tokens\": %u, \"block_bytes\": %" PRIu64 ", \"pages\": [",
                   d->block_tokens, d->block_bytes);
            for (uint32_t k = 0; k < d->n_pages; k++) {
                printf("%s%u", k ? ", " : "", d->pages[k]);
            }
            printf("]}");
        }
        printf("]}\n");
        return;
    }
    printf("lease %s ttl_ms=%u expires_unix_ms=%" PRIu64 " docs=%u\n", id, l->ttl_ms,
           l->expires_unix_ms, l->lease_docs);
    printf("arena backend=%s shm=%s page_bytes=%" PRIu64 " pages=%u (%s)", l->arena.backend,
           l->arena.shm_name[0] ? l->arena.shm_name : "-", l->arena.page_bytes, l->arena.n_pages,
           human_bytes((double)l->arena.page_bytes * l->arena.n_pages, sz, sizeof(sz)));
    if (l->arena.cuda_device >= 0) {
        printf(" cuda_device=%d", l->arena.cuda_device);
    }
    printf("\n");
    for (size_t i = 0; i < l->n_docs; i++) {
        const lkv_attached_doc *d = &l->docs[i];
        lkv_key_to_hex(d->key, hex);
        printf("%s profile=%s tokens=%" PRIu64 " layout=%ux%ux%u/%s block_tokens=%u "
               "block_bytes=%" PRIu64 " pages=",
               hex, d->profile, d->n_tokens, d->n_layers, d->n_kv_heads, d->head_dim, d->dtype,
               d->block_tokens, d->block_bytes);
        print_pages(d->pages, d->n_pages);
        printf("\n");
    }
}

static int cmd_attach(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv attach [--ttl MS] [--lease ID] [--json] DOC...\n\n"
               "Debugging aid (lazykv.v1.Cache/Attach; worker role): pins the documents in the\n"
               "hot tier under a new lease (or renews lease ID, 32 hex digits) for MS\n"
               "milliseconds (default %d; at most the daemon's max_lease_ttl), and prints the\n"
               "lease id, the arena mapping (backend, shm name, page size) and each document's\n"
               "layout and arena pages (block i at byte pages[i] * page_bytes). The lease\n"
               "outlives this command: end it with `lazykv release ID` or let it expire.\n\n%s",
               ATTACH_DEFAULT_MS, exit_codes_help);
        return EXIT_OK;
    }
    long ttl = ATTACH_DEFAULT_MS;
    int json = 0, has_lease = 0;
    uint8_t lease_id[LKV_LEASE_ID_BYTES];
    char **rest = lkv_xcalloc((size_t)argc + 1, sizeof(*rest));
    int nrest = 0, ex = EXIT_OK;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--ttl") == 0 || strcmp(argv[i], "--lease") == 0) {
            if (i + 1 >= argc) {
                ex = usage_err("attach", "%s needs a value", argv[i]);
                goto out;
            }
            const char *v = argv[++i];
            if (argv[i - 1][2] == 't' && parse_count(v, 86400000L, &ttl) != 0) {
                ex = usage_err("attach", "bad --ttl %s (milliseconds, >= 1)", v);
                goto out;
            }
            if (argv[i - 1][2] == 'l') {
                if (lease_from_hex(v, lease_id) != 0) {
                    ex = usage_err("attach", "bad --lease %s (32 hex digits)", v);
                    goto out;
                }
                has_lease = 1;
            }
        } else {
            rest[nrest++] = argv[i];
        }
    }
    docarg *docs = lkv_xcalloc((size_t)nrest + 1, sizeof(*docs));
    int n = 0;
    if (nrest > 0 || !has_lease) {
        n = parse_docs("attach", nrest, rest, docs, nrest + 1, NULL);
    }
    if (n < 0) {
        free(docs);
        ex = EXIT_USAGE;
        goto out;
    }
    lkv_docref *refs = lkv_xcalloc((size_t)n + 1, sizeof(*refs));
    for (int i = 0; i < n; i++) {
        docarg_ref(&docs[i], &refs[i]);
    }
    lkv_lease l;
    int rc = lkv_client_attach(x->c, refs, (size_t)n, has_lease ? lease_id : NULL, (uint32_t)ttl,
                               x->timeout_ms, &l);
    if (rc != 0) {
        ex = rpc_fail("attach", rc);
    } else {
        print_lease(&l, json);
        lkv_lease_free(&l);
    }
    for (int i = 0; i < n; i++) {
        docarg_free(&docs[i]);
    }
    free(refs);
    free(docs);
out:
    free(rest);
    return ex;
}

static int cmd_release(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv release LEASE_ID\n\n"
               "Ends a lease made by `lazykv attach` (lazykv.v1.Cache/Release; worker role): its\n"
               "documents are unpinned. Prints \"released LEASE_ID docs=N\". Exit 1 if the lease\n"
               "is unknown, released or expired.\n\n%s",
               exit_codes_help);
        return EXIT_OK;
    }
    if (argc != 1) {
        return usage_err("release", "expected exactly one LEASE_ID", NULL);
    }
    uint8_t id[LKV_LEASE_ID_BYTES];
    if (lease_from_hex(argv[0], id) != 0) {
        return usage_err("release", "not a lease id (32 hex digits): %s", argv[0]);
    }
    uint32_t released = 0;
    int rc = lkv_client_release(x->c, id, x->timeout_ms, &released);
    if (rc != 0) {
        return rpc_fail("release", rc);
    }
    printf("released %s docs=%u\n", argv[0], released);
    return EXIT_OK;
}

/* ---- cluster ---- */

/* A handle to member addr with the CLI's options (caller destroys), or NULL. */
static lkv_client_t *member_client(const cli *x, const char *addr)
{
    lkv_client_options o = {0};
    o.default_deadline_ms = x->timeout_ms;
    o.bearer_token = x->token;
    lkv_client_t *c = NULL;
    return lkv_client_create(addr, &o, &c) == 0 ? c : NULL;
}

static int cmd_cluster(cli *x, int argc, char **argv)
{
    if (want_help(argc, argv)) {
        printf("usage: lazykv cluster [--json]\n\n"
               "Shows the cluster as the daemon at --addr sees it (lazykv.v1.Cache/Cluster; data\n"
               "role): every member with its state (up, down, joining), version, hot and cold\n"
               "bytes and documents (asked of each up member itself) and its expected share of\n"
               "the key space; then the membership mode, the view's epoch and, with etcd, whether\n"
               "the answering member's etcd session is up. A member that cannot be asked shows\n"
               "'?' for its tiers.\n\n%s",
               exit_codes_help);
        return EXIT_OK;
    }
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            return usage_err("cluster", "unknown argument %s", argv[i]);
        }
    }
    lkv_cluster_info ci;
    int rc = lkv_client_cluster(x->c, x->timeout_ms, &ci);
    if (rc != 0) {
        return rpc_fail("cluster", rc);
    }
    /* Each up member reports its own tiers. */
    int *known = lkv_xcalloc(ci.n_members + 1, sizeof(*known));
    for (size_t i = 0; i < ci.n_members; i++) {
        lkv_cluster_member *m = &ci.members[i];
        if (m->self) {
            known[i] = 1;
            continue;
        }
        if (strcmp(m->state, "up") != 0) {
            continue;
        }
        lkv_client_t *c = member_client(x, m->addr);
        lkv_cluster_info mi;
        if (c != NULL && lkv_client_cluster(c, x->timeout_ms, &mi) == 0) {
            for (size_t j = 0; j < mi.n_members; j++) {
                if (mi.members[j].self) {
                    m->hot_used_bytes = mi.members[j].hot_used_bytes;
                    m->cold_used_bytes = mi.members[j].cold_used_bytes;
                    m->hot_docs = mi.members[j].hot_docs;
                    m->cold_docs = mi.members[j].cold_docs;
                    known[i] = 1;
                }
            }
            lkv_cluster_info_free(&mi);
        }
        lkv_client_destroy(c);
    }
    if (json) {
        printf("{\"mode\": \"%s\", \"epoch\": %" PRIu64 ", \"etcd_up\": %s, \"members\": [",
               ci.mode, ci.epoch, ci.etcd_up ? "true" : "false");
        for (size_t i = 0; i < ci.n_members; i++) {
            const lkv_cluster_member *m = &ci.members[i];
            printf("%s{\"id\": ", i ? ", " : "");
            json_str(m->id);
            printf(", \"addr\": ");
            json_str(m->addr);
            printf(", \"state\": \"%s\", \"version\": ", m->state);
            json_str(m->version);
            printf(", \"self\": %s, \"hot_bytes\": %" PRIu64 ", \"share\": %.6f",
                   m->self ? "true" : "false", m->hot_bytes, m->share);
            if (known[i]) {
                printf(", \"hot_used_bytes\": %" PRIu64 ", \"cold_used_bytes\": %" PRIu64
                       ", \"hot_docs\": %" PRIu64 ", \"cold_docs\": %" PRIu64,
                       m->hot_used_bytes, m->cold_used_bytes, m->hot_docs, m->cold_docs);
            }
            printf("}");
        }
        printf("]}\n");
    } else {
        printf("%-20s %-22s %-7s %-8s %10s %10s %10s %8s %8s %6s\n", "ID", "ADDR", "STATE",
               "VERSION", "HOT CAP", "HOT USED", "COLD", "HOT DOC", "COLD DOC", "SHARE");
        for (size_t i = 0; i < ci.n_members; i++) {
            const lkv_cluster_member *m = &ci.members[i];
            char cap[32], hu[32], cu[32], hd[24], cd[24];
            human_bytes((double)m->hot_bytes, cap, sizeof(cap));
            if (known[i]) {
                human_bytes((double)m->hot_used_bytes, hu, sizeof(hu));
                human_bytes((double)m->cold_used_bytes, cu, sizeof(cu));
                snprintf(hd, sizeof(hd), "%" PRIu64, m->hot_docs);
                snprintf(cd, sizeof(cd), "%" PRIu64, m->cold_docs);
            } else {
                snprintf(hu, sizeof(hu), "?");
                snprintf(cu, sizeof(cu), "?");
                snprintf(hd, sizeof(hd), "?");
                snprintf(cd, sizeof(cd), "?");
            }
            printf("%-20s %-22s %-7s %-8s %10s %10s %10s %8s %8s %5.1f%%%s\n", m->id, m->addr,
                   m->state, m->version[0] ? m->version : "?", cap, hu, cu, hd, cd,
                   100.0 * m->share, m->self ? "  (answered)" : "");
        }
        printf("mode %s, view %" PRIu64 "%s\n", ci.mode, ci.epoch,
               strcmp(ci.mode, "etcd") == 0
                   ? (ci.etcd_up ? ", etcd session up" : ", etcd session DOWN")
                   : "");
    }
    free(known);
    lkv_cluster_info_free(&ci);
    return EXIT_OK;
}

/* stats --member ID|ADDR: the address of that member (id or address), from Cluster at --addr. */
static int member_addr(cli *x, const char *want, char *addr, size_t len)
{
    lkv_cluster_info ci;
    int rc = lkv_client_cluster(x->c, x->timeout_ms, &ci);
    if (rc != 0) {
        return rpc_fail("stats --member", rc);
    }
    int found = 0;
    for (size_t i = 0; i < ci.n_members && !found; i++) {
        if (strcmp(ci.members[i].id, want) == 0 || strcmp(ci.members[i].addr, want) == 0) {
            snprintf(addr, len, "%s", ci.members[i].addr);
            found = 1;
        }
    }
    lkv_cluster_info_free(&ci);
    if (!found) {
        fprintf(stderr, "lazykv stats: no member %s in the cluster (see lazykv cluster)\n", want);
        return EXIT_MISS;
    }
    return EXIT_OK;
}

/* ---- main ---- */

typedef struct command {
    const char *name;               /* Command word. */
    int (*fn)(cli *, int, char **); /* Handler: args after the command word. */
} command;

static const command commands[] = {
    {"ping", cmd_ping},       {"put", cmd_put},         {"get", cmd_get},
    {"lookup", cmd_lookup},   {"rm", cmd_rm},           {"ls", cmd_ls},
    {"evict", cmd_evict},     {"stats", cmd_stats},     {"attach", cmd_attach},
    {"release", cmd_release}, {"cluster", cmd_cluster},
};

static const command *find_command(const char *name)
{
    for (size_t k = 0; k < sizeof(commands) / sizeof(commands[0]); k++) {
        if (strcmp(name, commands[k].name) == 0) {
            return &commands[k];
        }
    }
    return NULL;
}

/* Global options seen on the command line. */
typedef struct globals {
    const char *addr;   /* --addr, or NULL. */
    const char *token;  /* --token, or NULL. */
    int timeout_ms;     /* --timeout, or 0. */
    const char *tls[4]; /* --tls-ca, --tls-cert, --tls-key, --tls-server-name, or NULL. */
} globals;

/* If argv[*i] is a global option (--addr/--token/--timeout, with "=VALUE" or the next word),
 * records it, advances *i past its value and returns 1; returns 0 if it is not one, or -1 after
 * printing a usage error. */
static int take_global(int argc, char **argv, int *i, globals *g)
{
    const char *a = argv[*i];
    static const char *names[] = {"--addr",     "--token",   "--timeout",        "--tls-ca",
                                  "--tls-cert", "--tls-key", "--tls-server-name"};
    size_t klen = strcspn(a, "=");
    int which = -1;
    for (int k = 0; k < 7; k++) {
        if (strlen(names[k]) == klen && strncmp(a, names[k], klen) == 0) {
            which = k;
        }
    }
    if (which < 0) {
        return 0;
    }
    const char *v = NULL;
    if (a[klen] == '=') {
        v = a + klen + 1;
    } else if (*i + 1 < argc) {
        v = argv[++*i];
    } else {
        usage_err(NULL, "%s needs a value", names[which]);
        return -1;
    }
    if (which == 0) {
        if (v[0] == '\0') {
            usage_err(NULL, "empty --addr", NULL);
            return -1;
        }
        g->addr = v;
    } else if (which == 1) {
        g->token = v;
    } else if (which >= 3) {
        g->tls[which - 3] = v;
    } else {
        long t = 0;
        if (parse_count(v, 86400000L, &t) != 0) {
            usage_err(NULL, "bad --timeout %s (milliseconds, > 0)", v);
            return -1;
        }
        g->timeout_ms = (int)t;
    }
    return 1;
}

int main(int argc, char **argv)
{
    globals g = {NULL, NULL, 0, {NULL, NULL, NULL, NULL}};
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("%s%s", main_help, exit_codes_help);
            return EXIT_OK;
        }
        int t = take_global(argc, argv, &i, &g);
        if (t < 0) {
            return EXIT_USAGE;
        }
        if (t == 0) {
            return usage_err(NULL, "unknown option %s", argv[i]);
        }
    }
    if (i >= argc) {
        fprintf(stderr, "%s%s", main_help, exit_codes_help);
        return EXIT_USAGE;
    }
    if (strcmp(argv[i], "help") == 0) {
        if (i + 1 >= argc) {
            printf("%s%s", main_help, exit_codes_help);
            return EXIT_OK;
        }
        const command *hc = find_command(argv[i + 1]);
        if (hc == NULL) {
            return usage_err(NULL, "unknown command %s", argv[i + 1]);
        }
        char *hv[] = {"--help", NULL};
        return hc->fn(NULL, 1, hv);
    }
    const command *cmd = find_command(argv[i]);
    if (cmd == NULL) {
        return usage_err(NULL, "unknown command %s", argv[i]);
    }
    /* Global options after the command word are taken out; the rest goes to the command. */
    int nargs = 0;
    char **args = lkv_xcalloc((size_t)argc + 1, sizeof(*args));
    for (int k = i + 1; k < argc; k++) {
        int t = take_global(argc, argv, &k, &g);
        if (t < 0) {
            free(args);
            return EXIT_USAGE;
        }
        if (t == 0) {
            args[nargs++] = argv[k];
        }
    }
    const char *addr = g.addr, *token = g.token;
    if (addr == NULL) {
        addr = getenv("LAZYKV_ADDR");
    }
    if (addr == NULL || addr[0] == '\0') {
        addr = DEFAULT_ADDR;
    }
    if (token == NULL) {
        token = getenv("LAZYKV_TOKEN");
    }
    if (token != NULL && token[0] == '\0') {
        token = NULL;
    }
    int timeout_ms = g.timeout_ms > 0 ? g.timeout_ms : LKV_CLIENT_DEFAULT_DEADLINE_MS;
    int ex = EXIT_OK;
    cli x = {NULL, timeout_ms, token};
    if (!want_help(nargs, args)) {
        lkv_client_options o = {0};
        o.default_deadline_ms = timeout_ms;
        o.bearer_token = token;
        static const char *const tls_env[4] = {"LAZYKV_TLS_CA", "LAZYKV_TLS_CERT", "LAZYKV_TLS_KEY",
                                               "LAZYKV_TLS_SERVER_NAME"};
        const char *tv[4];
        for (int k = 0; k < 4; k++) {
            tv[k] = g.tls[k] != NULL ? g.tls[k] : getenv(tls_env[k]);
            tv[k] = tv[k] != NULL && tv[k][0] != '\0' ? tv[k] : NULL;
        }
        o.tls_ca_file = tv[0];
        o.tls_cert_file = tv[1];
        o.tls_key_file = tv[2];
        o.tls_server_name = tv[3];
        if (lkv_client_create(addr, &o, &x.c) != 0) {
            fprintf(stderr, "lazykv: %s\n", lkv_client_last_error());
            free(args);
            return EXIT_USAGE;
        }
    }
    ex = cmd->fn(&x, nargs, args);
    lkv_client_destroy(x.c);
    free(args);
    return ex;
}
