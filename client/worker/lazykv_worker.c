/*
 * lazykv_worker.c: the `lazykv-worker` binary: the co-located decode worker (lkv_worker.h) on
 * the command line.
 *
 *   lazykv-worker [options] --requests FILE|-        JSON lines (lkv_request.h), one per line
 *   lazykv-worker [options] --doc TEXT ... --question TEXT
 *
 * Each request's result is printed as text (default) or as one JSON line (--json). Blank lines
 * and lines starting with '#' in a request file are skipped. A bad line is answered with an
 * error result and the next line is read. Exit status: 0 every request was served, 1 one or
 * more failed, 2 usage or start-up errors (bad option, unreadable model).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_request.h"
#include "lkv_worker.h"

#ifndef LKV_DEFAULT_MODEL_DIR
#define LKV_DEFAULT_MODEL_DIR "tests/data/models"
#endif

#define MAX_CLI_DOCS 256

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lazykv-worker [options] (--requests FILE|- | --doc TEXT ... --question TEXT)\n"
            "  --daemon HOST:PORT    lazykvd to use (default: none: compute everything locally)\n"
            "  --profile NAME        model profile (default stories260k)\n"
            "  --model PATH          llama2.c checkpoint (default %s/stories260K.bin)\n"
            "  --tokenizer PATH      tokenizer (default %s/tok512.bin)\n"
            "  --model-id REV        the revision to confirm when the profile's model_id is not\n"
            "                        a blake2b: hash of the checkpoint\n"
            "  --token TOKEN         bearer token for the daemon\n"
            "  --requests FILE|-     JSON-line requests (lkv_request.h), '-' for stdin\n"
            "  --doc TEXT            a document (repeat, in prompt order)\n"
            "  --question TEXT       the question\n"
            "  --max-tokens N        tokens to generate (default 64)\n"
            "  --temperature T       0 = greedy (default 0)\n"
            "  --top-p P             nucleus mass (default 1)\n"
            "  --seed N              sampling seed (default 0)\n"
            "  --mode lazy|materialise   attention over cached pages, or the Block-Attention\n"
            "                        baseline (re-rotated copies)\n"
            "  --json                print results as JSON lines\n"
            "  --local-fallback      if the daemon is unreachable, compute locally (and say so)\n"
            "  --deadline-ms N       deadline of a request's daemon calls (default 10000)\n"
            "  --lease-ttl-ms N      lease TTL (default 30000)\n"
            "  --local-pages N       worker KV pages (default 2048)\n"
            "  --block-tokens N      the profile's block size (default 16)\n"
            "  --threads N           attention threads (default: all CPUs)\n"
            "  --stats               print the worker's totals to stderr at the end\n"
            "  --help\n",
            LKV_DEFAULT_MODEL_DIR, LKV_DEFAULT_MODEL_DIR);
}

/* Runs one parsed request and prints its result. Returns the run's status. */
static int serve(lkv_worker *w, lkv_request *r, int json)
{
    lkv_rag_result res;
    int rc = lkv_worker_run(w, &r->rag, &res);
    if (json) {
        char *s = lkv_result_json(r->id, rc, &res, NULL);
        printf("%s\n", s);
        free(s);
    } else {
        lkv_result_text(stdout, r->id, rc, &res, NULL);
    }
    fflush(stdout);
    lkv_rag_result_free(&res);
    return rc;
}

static void report_bad(const char *id, int rc, const char *msg, int json)
{
    if (json) {
        char *s = lkv_result_json(id, rc, NULL, msg);
        printf("%s\n", s);
        free(s);
    } else {
        lkv_result_text(stdout, id, rc, NULL, msg);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    enum {
        O_DAEMON = 256,
        O_PROFILE,
        O_MODEL,
        O_TOK,
        O_MODEL_ID,
        O_TOKEN,
        O_REQUESTS,
        O_DOC,
        O_QUESTION,
        O_MAX_TOKENS,
        O_TEMP,
        O_TOP_P,
        O_SEED,
        O_MODE,
        O_JSON,
        O_FALLBACK,
        O_DEADLINE,
        O_TTL,
        O_PAGES,
        O_BLOCK,
        O_THREADS,
        O_STATS,
        O_HELP
    };
    static const struct option opts[] = {
        {"daemon", required_argument, NULL, O_DAEMON},
        {"profile", required_argument, NULL, O_PROFILE},
        {"model", required_argument, NULL, O_MODEL},
        {"tokenizer", required_argument, NULL, O_TOK},
        {"model-id", required_argument, NULL, O_MODEL_ID},
        {"token", required_argument, NULL, O_TOKEN},
        {"requests", required_argument, NULL, O_REQUESTS},
        {"doc", required_argument, NULL, O_DOC},
        {"question", required_argument, NULL, O_QUESTION},
        {"max-tokens", required_argument, NULL, O_MAX_TOKENS},
        {"temperature", required_argument, NULL, O_TEMP},
        {"top-p", required_argument, NULL, O_TOP_P},
        {"seed", required_argument, NULL, O_SEED},
        {"mode", required_argument, NULL, O_MODE},
        {"json", no_argument, NULL, O_JSON},
        {"local-fallback", no_argument, NULL, O_FALLBACK},
        {"deadline-ms", required_argument, NULL, O_DEADLINE},
        {"lease-ttl-ms", required_argument, NULL, O_TTL},
        {"local-pages", required_argument, NULL, O_PAGES},
        {"block-tokens", required_argument, NULL, O_BLOCK},
        {"threads", required_argument, NULL, O_THREADS},
        {"stats", no_argument, NULL, O_STATS},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    lkv_worker_opts wo = {0};
    lkv_request_defaults def = {.max_tokens = 64, .mode = LKV_RAG_LAZY};
    const char *requests = NULL, *question = NULL;
    const char *docs[MAX_CLI_DOCS];
    int n_docs = 0, json = 0, stats = 0, c;
    char model[4096], tokp[4096];
    snprintf(model, sizeof(model), "%s/stories260K.bin", LKV_DEFAULT_MODEL_DIR);
    snprintf(tokp, sizeof(tokp), "%s/tok512.bin", LKV_DEFAULT_MODEL_DIR);
    wo.model_path = model;
    wo.tokenizer_path = tokp;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        errno = 0;
        switch (c) {
        case O_DAEMON:
            wo.target = optarg;
            break;
        case O_PROFILE:
            wo.profile = optarg;
            break;
        case O_MODEL:
            wo.model_path = optarg;
            break;
        case O_TOK:
            wo.tokenizer_path = optarg;
            break;
        case O_MODEL_ID:
            wo.model_id = optarg;
            break;
        case O_TOKEN:
            wo.bearer_token = optarg;
            break;
        case O_REQUESTS:
            requests = optarg;
            break;
        case O_DOC:
            if (n_docs == MAX_CLI_DOCS) {
                fprintf(stderr, "lazykv-worker: at most %d --doc\n", MAX_CLI_DOCS);
                return 2;
            }
            docs[n_docs++] = optarg;
            break;
        case O_QUESTION:
            question = optarg;
            break;
        case O_MAX_TOKENS:
        case O_SEED:
        case O_DEADLINE:
        case O_TTL:
        case O_PAGES:
        case O_BLOCK:
        case O_THREADS: {
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno != 0 || end == optarg || *end != '\0' || optarg[0] == '-' ||
                (c != O_SEED && v > 0x7fffffffull)) {
                fprintf(stderr, "lazykv-worker: --%s: '%s' is not a non-negative integer\n",
                        opts[c - O_DAEMON].name, optarg);
                return 2;
            }
            if (c == O_MAX_TOKENS) {
                def.max_tokens = (int)v;
            } else if (c == O_SEED) {
                def.sampling.seed = v;
            } else if (c == O_DEADLINE) {
                wo.deadline_ms = (int)v;
            } else if (c == O_TTL) {
                wo.lease_ttl_ms = (uint32_t)v;
            } else if (c == O_PAGES) {
                wo.local_pages = (uint32_t)v;
            } else if (c == O_BLOCK) {
                wo.block_tokens = (int)v;
            } else {
                wo.threads = (int)v;
            }
            break;
        }
        case O_TEMP:
        case O_TOP_P: {
            double v = strtod(optarg, &end);
            if (errno != 0 || end == optarg || *end != '\0' || !(v >= 0) ||
                (c == O_TOP_P && v > 1)) {
                fprintf(stderr, "lazykv-worker: --%s: '%s' is not a number in range\n",
                        opts[c - O_DAEMON].name, optarg);
                return 2;
            }
            if (c == O_TEMP) {
                def.sampling.temperature = (float)v;
            } else {
                def.sampling.top_p = (float)v;
            }
            break;
        }
        case O_MODE:
            if (strcmp(optarg, "lazy") == 0) {
                def.mode = LKV_RAG_LAZY;
            } else if (strcmp(optarg, "materialise") == 0 || strcmp(optarg, "materialize") == 0) {
                def.mode = LKV_RAG_MATERIALISE;
            } else {
                fprintf(stderr, "lazykv-worker: --mode: '%s' is not lazy or materialise\n", optarg);
                return 2;
            }
            break;
        case O_JSON:
            json = 1;
            break;
        case O_FALLBACK:
            wo.local_fallback = 1;
            break;
        case O_STATS:
            stats = 1;
            break;
        case O_HELP:
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || (requests == NULL) == (question == NULL) ||
        (requests != NULL && n_docs > 0)) {
        fprintf(stderr, "lazykv-worker: give either --requests FILE or --question (with "
                        "--doc ...), not both\n");
        usage(stderr);
        return 2;
    }
    char err[512];
    lkv_worker *w;
    int rc = lkv_worker_create(&wo, &w, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "lazykv-worker: %s\n", err);
        return 2;
    }
    int failed = 0;
    if (question != NULL) {
        lkv_request r;
        rc = lkv_request_from_text(docs, n_docs, question, lkv_worker_tokenizer(w), &def, "1", &r,
                                   err, sizeof(err));
        if (rc != 0) {
            report_bad("1", rc, err, json);
        } else {
            rc = serve(w, &r, json);
        }
        failed = rc != 0;
        lkv_request_free(&r);
    } else {
        FILE *f = strcmp(requests, "-") == 0 ? stdin : fopen(requests, "r");
        if (f == NULL) {
            fprintf(stderr, "lazykv-worker: %s: %s\n", requests, strerror(errno));
            lkv_worker_destroy(w);
            return 2;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        long lineno = 0;
        while ((len = getline(&line, &cap, f)) >= 0) {
            lineno++;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) {
                line[--len] = '\0';
            }
            const char *p = line + strspn(line, " \t");
            if (*p == '\0' || *p == '#') {
                continue;
            }
            char id[32];
            snprintf(id, sizeof(id), "%ld", lineno);
            lkv_request r;
            rc = lkv_request_parse(p, lkv_worker_tokenizer(w), &def, id, &r, err, sizeof(err));
            if (rc != 0) {
                char msg[600];
                snprintf(msg, sizeof(msg), "line %ld: %s", lineno, err);
                report_bad(r.id, rc, msg, json);
            } else {
                rc = serve(w, &r, json);
            }
            failed += rc != 0;
            lkv_request_free(&r);
        }
        free(line);
        if (f != stdin) {
            fclose(f);
        }
    }
    if (stats) {
        lkv_worker_stats st;
        lkv_worker_stats_get(w, &st);
        uint64_t docs = st.hit_docs + st.miss_docs, toks = st.hit_tokens + st.miss_tokens;
        fprintf(stderr,
                "# worker: %llu requests (%llu failed); documents %llu hit / %llu (%.1f%%), "
                "tokens %llu hit / %llu (%.1f%%); arena mapped %llu time(s); leases %llu, "
                "renewals %llu; reconnects %llu\n",
                (unsigned long long)st.requests, (unsigned long long)st.failed,
                (unsigned long long)st.hit_docs, (unsigned long long)docs,
                docs ? 100.0 * (double)st.hit_docs / (double)docs : 0.0,
                (unsigned long long)st.hit_tokens, (unsigned long long)toks,
                toks ? 100.0 * (double)st.hit_tokens / (double)toks : 0.0,
                (unsigned long long)st.arena_maps, (unsigned long long)st.leases,
                (unsigned long long)st.renewals, (unsigned long long)st.reconnects);
    }
    lkv_worker_destroy(w);
    return failed ? 1 : 0;
}
