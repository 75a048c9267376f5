/*
 * lazykv_worker.c: the `lazykv-worker` binary: the co-located decode worker (lkv_worker.h) on
 * the command line.
 *
 *   lazykv-worker [options] --requests FILE|-        JSON lines (lkv_request.h), one per line
 *   lazykv-worker [options] --doc TEXT ... --question TEXT
 *   lazykv-worker [options] --serve ADDR                  the lazykv.v1.Worker gRPC service
 *   lazykv-worker [options] --engine --requests FILE|-   every request in flight at once
 *
 * --serve runs the serving engine (lkv_engine.h: continuous batching, --max-batch, --kv-pages)
 * behind lazykv.v1.Worker (lkv_worker_svc.h) on ADDR (port 0: any free one), prints
 * "lazykv-worker: serving lazykv.v1.Worker on HOST:PORT" on stdout once it listens, and drains
 * on SIGTERM or SIGINT. --engine submits every request of the file to the same engine at once
 * and prints the results in file order.
 *
 * Each request's result is printed as text (default) or as one JSON line (--json). Blank lines
 * and lines starting with '#' in a request file are skipped. A bad line is answered with an
 * error result and the next line is read. Exit status: 0 every request was served, 1 one or
 * more failed, 2 usage or start-up errors (bad option, unreadable model).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LKV_WORKER_HAVE_CUDA
#include "lkv_backend_cuda.h"
#endif
#include "lkv_engine.h"
#include "lkv_err.h"
#include "lkv_pagespace.h"
#include "lkv_log.h"
#include "lkv_policy.h"
#include "lkv_request.h"
#include "lkv_server.h"
#include "lkv_worker.h"
#include "lkv_worker_svc.h"

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
            "  --token TOKEN         bearer token for the daemon (default $LAZYKV_TOKEN)\n"
            "  --tls-ca FILE         talk TLS to the daemon, verifying it against this CA (PEM)\n"
            "                        (default $LAZYKV_TLS_CA)\n"
            "  --tls-cert FILE       client certificate (PEM) for a daemon that requires one\n"
            "                        (default $LAZYKV_TLS_CERT)\n"
            "  --tls-key FILE        its private key (PEM) (default $LAZYKV_TLS_KEY)\n"
            "  --tls-server-name N   name to check in the daemon's certificate\n"
            "                        (default $LAZYKV_TLS_SERVER_NAME, else the --daemon host)\n"
            "  --requests FILE|-     JSON-line requests (lkv_request.h), '-' for stdin\n"
            "  --doc TEXT            a document (repeat, in prompt order)\n"
            "  --question TEXT       the question\n"
            "  --max-tokens N        tokens to generate (default 64)\n"
            "  --temperature T       0 = greedy (default 0)\n"
            "  --top-p P             nucleus mass (default 1)\n"
            "  --seed N              sampling seed (default 0)\n"
            "  --mode lazy|materialise|prefix   attention over cached pages, the Block-Attention\n"
            "                        baseline (re-rotated copies) or the prefix-caching baseline\n"
            "  --prefix-pages N      worker pages of the prefix pool (mode prefix; the last N of\n"
            "                        --local-pages)\n"
            "  --copy-budget         Block-Attention copies take the daemon's budget (Reserve)\n"
            "  --json                print results as JSON lines\n"
            "  --local-fallback      if the daemon is unreachable, compute locally (and say so)\n"
            "  --no-inplace          store misses by Put (default: compute them into pages\n"
            "                        reserved in the daemon's arena and commit them)\n"
            "  --deadline-ms N       deadline of a request's daemon calls (default 10000)\n"
            "  --lease-ttl-ms N      lease TTL (default 30000)\n"
            "  --local-pages N       worker KV pages (default 2048)\n"
            "  --block-tokens N      the profile's block size (default 16)\n"
            "  --threads N           attention threads (default: all CPUs)\n"
            "  --stats               print the worker's totals to stderr at the end\n"
            "  --serve ADDR          serve lazykv.v1.Worker on ADDR (host:port, port 0: any)\n"
            "  --engine              with --requests: run every request at once through the\n"
            "                        serving engine (continuous batching)\n"
            "  --max-batch N         requests running at once in the engine (default 16)\n"
            "  --kv-pages N          worker pages for in-flight KV (default: --local-pages)\n"
            "  --rpc-threads N       gRPC polling threads of --serve (default 2)\n"
            "  --backend cpu|cuda    compute backend (default cpu; cuda reads and writes a\n"
            "                        hot_backend=cuda daemon's HBM arena in place)\n"
            "  --cuda-weights bf16|f32   weights on the GPU (default bf16)\n"
            "  --dtype f32|f16|bf16  element type of stored KV (default f32; cuda: bf16/f16)\n"
            "  --bf16-weights        round the checkpoint's weights to bf16 values on load\n"
            "  --hash-kv             each document's JSON gets kv_hash: its KV bytes read back\n"
            "                        from the pages used (a hit must match the miss)\n"
            "  --synth PRESET[:SEED] random-weight model instead of --model (llama3-8b,\n"
            "                        llama3-mini; lkv_synth.h); requests give token ids\n"
            "  --dump-logits FILE    write the first request's logits (fp32, [n_out][vocab])\n"
            "  --help\n",
            LKV_DEFAULT_MODEL_DIR, LKV_DEFAULT_MODEL_DIR);
}

/* Runs one parsed request and prints its result. Returns the run's status. */
static const char *dump_logits; /* --dump-logits FILE, or NULL. */
static int dumped;              /* 1 once written. */

static int serve(lkv_worker *w, lkv_request *r, int json)
{
    lkv_rag_result res;
    int dump = dump_logits != NULL && !dumped;
    if (dump) {
        r->rag.keep_logits = 1;
    }
    int rc = lkv_worker_run(w, &r->rag, &res);
    if (dump && rc == 0) {
        FILE *f = fopen(dump_logits, "wb");
        if (f == NULL || fwrite(res.logits, sizeof(float), (size_t)res.n_out * res.vocab, f) !=
                             (size_t)res.n_out * res.vocab) {
            fprintf(stderr, "lazykv-worker: cannot write %s\n", dump_logits);
        }
        if (f != NULL) {
            fclose(f);
        }
        dumped = 1;
    }
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

/* A request submitted to the engine (--engine). */
typedef struct pending {
    char id[128];
    int rc;            /* Submit's status. */
    char msg[512];     /* Submit's message. */
    lkv_engine_req *r; /* NULL if submit failed. */
} pending;

/* Waits for every submitted request in order and prints its result. Returns the failures. */
static int drain_batch(pending *b, int n, int json)
{
    int failed = 0;
    for (int i = 0; i < n; i++) {
        if (b[i].r == NULL) {
            report_bad(b[i].id, b[i].rc, b[i].msg, json);
            failed++;
            continue;
        }
        lkv_engine_event ev;
        int rc = 0;
        while (lkv_engine_wait(b[i].r, &ev, -1)) {
            if (ev.kind == LKV_ENGINE_END) {
                rc = ev.rc;
                break;
            }
        }
        lkv_engine_result er;
        lkv_engine_result_get(b[i].r, &er);
        if (json) {
            char *s = lkv_result_json(b[i].id, rc, er.res, NULL);
            printf("%s\n", s);
            free(s);
        } else {
            lkv_result_text(stdout, b[i].id, rc, er.res, NULL);
        }
        fflush(stdout);
        failed += rc != 0;
        lkv_engine_release(b[i].r);
    }
    return failed;
}

/* --serve: the Worker service until SIGTERM / SIGINT. */
static int serve_grpc(const lkv_worker_opts *wo, const lkv_engine_opts *eo,
                      const lkv_request_defaults *def, const char *addr, int rpc_threads)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* Every thread made from here on inherits it. */
    char err[512];
    lkv_worker *w;
    int rc = lkv_worker_create(wo, &w, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "lazykv-worker: %s\n", err);
        return 2;
    }
    lkv_engine *eng;
    if (lkv_engine_create(w, eo, &eng) != 0) {
        fprintf(stderr, "lazykv-worker: bad engine options\n");
        lkv_worker_destroy(w);
        return 2;
    }
    lkv_worker_svc svc = {.engine = eng, .worker = w, .default_max_tokens = def->max_tokens};
    lkv_method methods[LKV_WORKER_SVC_METHODS];
    int nm = lkv_worker_svc_methods(&svc, methods);
    lkv_server_opts so = {
        .listen = addr, .threads = rpc_threads, .max_message_bytes = 64u << 20, .pool_threads = 0};
    lkv_server *srv;
    rc = lkv_server_create(&so, methods, nm, &srv, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "lazykv-worker: cannot serve on %s: %s\n", addr, err);
        lkv_engine_destroy(eng);
        lkv_worker_destroy(w);
        return 2;
    }
    printf("lazykv-worker: serving lazykv.v1.Worker on %s\n", lkv_server_address(srv));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    LKV_LOGI("signal %d: draining", sig);
    lkv_server_shutdown(srv, 2000);
    lkv_engine_destroy(eng);
    lkv_server_destroy(srv);
    lkv_worker_destroy(w);
    return 0;
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
        O_NO_INPLACE,
        O_PREFIX_PAGES,
        O_COPY_BUDGET,
        O_DEADLINE,
        O_TTL,
        O_PAGES,
        O_BLOCK,
        O_THREADS,
        O_STATS,
        O_SERVE,
        O_ENGINE,
        O_MAX_BATCH,
        O_KV_PAGES,
        O_RPC_THREADS,
        O_BACKEND,
        O_CUDA_WEIGHTS,
        O_DTYPE,
        O_BF16W,
        O_HASH_KV,
        O_SYNTH,
        O_DUMP,
        O_TLS_CA,
        O_TLS_CERT,
        O_TLS_KEY,
        O_TLS_NAME,
        O_HELP
    };
    static const struct option opts[] = {
        {"daemon", required_argument, NULL, O_DAEMON},
        {"profile", required_argument, NULL, O_PROFILE},
        {"model", required_argument, NULL, O_MODEL},
        {"tokenizer", required_argument, NULL, O_TOK},
        {"model-id", required_argument, NULL, O_MODEL_ID},
        {"token", required_argument, NULL, O_TOKEN},
        {"tls-ca", required_argument, NULL, O_TLS_CA},
        {"tls-cert", required_argument, NULL, O_TLS_CERT},
        {"tls-key", required_argument, NULL, O_TLS_KEY},
        {"tls-server-name", required_argument, NULL, O_TLS_NAME},
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
        {"no-inplace", no_argument, NULL, O_NO_INPLACE},
        {"prefix-pages", required_argument, NULL, O_PREFIX_PAGES},
        {"copy-budget", no_argument, NULL, O_COPY_BUDGET},
        {"deadline-ms", required_argument, NULL, O_DEADLINE},
        {"lease-ttl-ms", required_argument, NULL, O_TTL},
        {"local-pages", required_argument, NULL, O_PAGES},
        {"block-tokens", required_argument, NULL, O_BLOCK},
        {"threads", required_argument, NULL, O_THREADS},
        {"stats", no_argument, NULL, O_STATS},
        {"serve", required_argument, NULL, O_SERVE},
        {"engine", no_argument, NULL, O_ENGINE},
        {"max-batch", required_argument, NULL, O_MAX_BATCH},
        {"kv-pages", required_argument, NULL, O_KV_PAGES},
        {"rpc-threads", required_argument, NULL, O_RPC_THREADS},
        {"backend", required_argument, NULL, O_BACKEND},
        {"cuda-weights", required_argument, NULL, O_CUDA_WEIGHTS},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"bf16-weights", no_argument, NULL, O_BF16W},
        {"hash-kv", no_argument, NULL, O_HASH_KV},
        {"synth", required_argument, NULL, O_SYNTH},
        {"dump-logits", required_argument, NULL, O_DUMP},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    lkv_worker_opts wo = {0};
    lkv_request_defaults def = {.max_tokens = 64, .mode = LKV_RAG_LAZY};
    const char *requests = NULL, *question = NULL;
    const char *docs[MAX_CLI_DOCS];
    int n_docs = 0, json = 0, stats = 0, c, use_engine = 0, rpc_threads = 2;
    const char *serve_addr = NULL;
    int use_cuda = 0, cuda_f32 = 0;
    uint32_t prefix_pages = 0;
    lkv_engine_opts eo = {0};
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
        case O_TLS_CA:
            wo.tls_ca_file = optarg;
            break;
        case O_TLS_CERT:
            wo.tls_cert_file = optarg;
            break;
        case O_TLS_KEY:
            wo.tls_key_file = optarg;
            break;
        case O_TLS_NAME:
            wo.tls_server_name = optarg;
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
        case O_MAX_BATCH:
        case O_KV_PAGES:
        case O_RPC_THREADS:
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
            } else if (c == O_MAX_BATCH) {
                eo.max_batch = (int)v;
            } else if (c == O_KV_PAGES) {
                eo.kv_pages = (uint32_t)v;
            } else if (c == O_RPC_THREADS) {
                rpc_threads = v > 0 ? (int)v : 1;
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
            } else if (strcmp(optarg, "prefix") == 0) {
                def.mode = LKV_RAG_PREFIX;
            } else {
                fprintf(stderr, "lazykv-worker: --mode: '%s' is not lazy, materialise or prefix\n",
                        optarg);
                return 2;
            }
            break;
        case O_JSON:
            json = 1;
            break;
        case O_FALLBACK:
            wo.local_fallback = 1;
            break;
        case O_NO_INPLACE:
            wo.no_inplace = 1;
            break;
        case O_PREFIX_PAGES:
            prefix_pages = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case O_COPY_BUDGET:
            wo.copy_budget = 1;
            break;
        case O_STATS:
            stats = 1;
            break;
        case O_SERVE:
            serve_addr = optarg;
            break;
        case O_ENGINE:
            use_engine = 1;
            break;
        case O_BACKEND:
            if (strcmp(optarg, "cpu") == 0) {
                use_cuda = 0;
            } else if (strcmp(optarg, "cuda") == 0) {
                use_cuda = 1;
            } else {
                fprintf(stderr, "lazykv-worker: --backend: '%s' is not cpu or cuda\n", optarg);
                return 2;
            }
            break;
        case O_CUDA_WEIGHTS:
            if (strcmp(optarg, "bf16") == 0 || strcmp(optarg, "f32") == 0) {
                cuda_f32 = strcmp(optarg, "f32") == 0;
            } else {
                fprintf(stderr, "lazykv-worker: --cuda-weights: '%s' is not bf16 or f32\n", optarg);
                return 2;
            }
            break;
        case O_DTYPE:
            if (strcmp(optarg, "f32") == 0) {
                wo.dtype = LKV_DTYPE_F32;
            } else if (strcmp(optarg, "f16") == 0) {
                wo.dtype = LKV_DTYPE_F16;
            } else if (strcmp(optarg, "bf16") == 0) {
                wo.dtype = LKV_DTYPE_BF16;
            } else {
                fprintf(stderr, "lazykv-worker: --dtype: '%s' is not f32, f16 or bf16\n", optarg);
                return 2;
            }
            break;
        case O_BF16W:
            wo.round_weights_bf16 = 1;
            break;
        case O_HASH_KV:
            wo.hash_kv = 1;
            break;
        case O_SYNTH:
            wo.synth = optarg;
            wo.tokenizer_path = NULL;
            break;
        case O_DUMP:
            dump_logits = optarg;
            break;
        case O_HELP:
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    /* The daemon's credentials default to the CLI's environment (deploy/: the sidecar's
     * ConfigMap and Secret set LAZYKV_TOKEN and LAZYKV_TLS_*). */
    const char **envopt[5] = {&wo.bearer_token, &wo.tls_ca_file, &wo.tls_cert_file,
                              &wo.tls_key_file, &wo.tls_server_name};
    static const char *const envname[5] = {"LAZYKV_TOKEN", "LAZYKV_TLS_CA", "LAZYKV_TLS_CERT",
                                           "LAZYKV_TLS_KEY", "LAZYKV_TLS_SERVER_NAME"};
    for (int k = 0; k < 5; k++) {
        if (*envopt[k] == NULL) {
            const char *v = getenv(envname[k]);
            *envopt[k] = v != NULL && v[0] != '\0' ? v : NULL;
        }
    }
    if (use_cuda) {
#ifdef LKV_WORKER_HAVE_CUDA
        const lkv_backend *cb;
        if (lkv_backend_cuda_create(cuda_f32 ? LKV_CUDA_WEIGHTS_F32 : LKV_CUDA_WEIGHTS_BF16, &cb) !=
            0) {
            fprintf(stderr, "lazykv-worker: no usable GPU for --backend cuda\n");
            return 2;
        }
        wo.backend = cb; /* Lives until exit. */
#else
        (void)cuda_f32;
        fprintf(stderr, "lazykv-worker: built without CUDA (--backend cuda)\n");
        return 2;
#endif
    }
    if (serve_addr != NULL) {
        if (optind < argc || requests != NULL || question != NULL || n_docs > 0) {
            fprintf(stderr, "lazykv-worker: --serve takes no requests of its own\n");
            usage(stderr);
            return 2;
        }
        return serve_grpc(&wo, &eo, &def, serve_addr, rpc_threads);
    }
    if (use_engine && requests == NULL) {
        fprintf(stderr, "lazykv-worker: --engine needs --requests FILE\n");
        return 2;
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
    if (prefix_pages > 0 && lkv_worker_prefix_setup(w, prefix_pages, LKV_POLICY_ADAPTIVE) != 0) {
        fprintf(stderr, "lazykv-worker: --prefix-pages %u must be below --local-pages\n",
                prefix_pages);
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
        lkv_engine *eng = NULL;
        pending *batch = NULL;
        int n_batch = 0;
        if (use_engine && lkv_engine_create(w, &eo, &eng) != 0) {
            fprintf(stderr, "lazykv-worker: bad engine options\n");
            lkv_worker_destroy(w);
            return 2;
        }
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
            } else if (eng != NULL) {
                lkv_request *hr = lkv_xmalloc(sizeof(*hr));
                *hr = r;
                memset(&r, 0, sizeof(r));
                batch = lkv_xrealloc(batch, (size_t)(n_batch + 1) * sizeof(*batch));
                batch[n_batch].rc =
                    lkv_engine_submit(eng, hr, 0, NULL, NULL, &batch[n_batch].r, batch[n_batch].msg,
                                      sizeof(batch[n_batch].msg));
                snprintf(batch[n_batch].id, sizeof(batch[n_batch].id), "%s", hr->id);
                n_batch++;
                continue;
            } else {
                rc = serve(w, &r, json);
            }
            failed += rc != 0;
            lkv_request_free(&r);
        }
        failed += drain_batch(batch, n_batch, json);
        free(batch);
        lkv_engine_destroy(eng);
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
                "renewals %llu; reconnects %llu; misses stored in place %llu, by Put %llu; "
                "worker pages %s\n",
                (unsigned long long)st.requests, (unsigned long long)st.failed,
                (unsigned long long)st.hit_docs, (unsigned long long)docs,
                docs ? 100.0 * (double)st.hit_docs / (double)docs : 0.0,
                (unsigned long long)st.hit_tokens, (unsigned long long)toks,
                toks ? 100.0 * (double)st.hit_tokens / (double)toks : 0.0,
                (unsigned long long)st.arena_maps, (unsigned long long)st.leases,
                (unsigned long long)st.renewals, (unsigned long long)st.reconnects,
                (unsigned long long)st.inplace_docs, (unsigned long long)st.put_docs,
                lkv_ps_placement_name(st.placement));
    }
    lkv_worker_destroy(w);
    return failed ? 1 : 0;
}
