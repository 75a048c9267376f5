/*
 * hitrate.c: command line of the hit-rate simulator (see README.md in this folder).
 *
 *   hitrate run      [workload] [cache]   one or more models/policies on one trace, a table
 *   hitrate study    [workload] --out DIR the full study: the paper-shaped table, budget and
 *                                         skew sweeps (TSV for plot.gp), the analytic ratio
 *   hitrate analytic [--d D --c C ...]    the paper's capacity ratio against simulations
 *
 * Every number comes from lkv_sim_run / lkv_sim_*_topc, i.e. from storage/lkv_policy.c.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lkv_err.h"
#include "lkv_policy.h"
#include "lkv_sim.h"

#define GIB        (1024.0 * 1024.0 * 1024.0)
#define MAX_SERIES 32

typedef struct series {
    int model;  /* enum lkv_sim_model. */
    int policy; /* enum lkv_policy_kind. */
} series;

typedef struct opts {
    lkv_sim_gen gen;        /* Synthetic workload. */
    lkv_sim_cfg cfg;        /* Cache configuration. */
    const char *trace;      /* Trace file, or NULL for a synthetic trace. */
    uint32_t doc_tokens;    /* Default length for trace-file documents without one. */
    const char *out;        /* Study output folder. */
    series ser[MAX_SERIES]; /* Models x policies to run. */
    int nser;               /* Entries in ser. */
    uint64_t d, c;          /* Analytic model. */
    double a_alpha;         /* Analytic model skew. */
    uint64_t draws;         /* Analytic model draws. */
    int quick;              /* Study: fewer points and requests. */
} opts;

static void usage(FILE *f)
{
    char names[256];
    lkv_policy_names(names, sizeof(names));
    fprintf(f,
            "usage: hitrate run|study|policies|analytic|trace [options]\n"
            "workload:\n"
            "  --ndocs N          pool size (10000)\n"
            "  --len SPEC         fixed:T | uniform:A:B | lognormal:MEDIAN:SIGMA (fixed:2048)\n"
            "  --max-tokens T     clamp for lognormal lengths (32768)\n"
            "  --k K              distinct documents a request, random order (5)\n"
            "  --alpha A          Zipf exponent over document rank, 0 = uniform (1.5)\n"
            "  --requests R       requests (100000)\n"
            "  --seed S           RNG seed (1)\n"
            "  --trace FILE       replay a trace file instead (see README.md)\n"
            "  --doc-tokens T     length of trace documents given without one (2048)\n"
            "  --workload W       zipf|shift|burst|session|mix: drift presets (zipf)\n"
            "  --shift-every N --shift-frac F --shift-hot H   hot-set replacement\n"
            "  --burst-every N --burst-len L                  bursts of a cold document\n"
            "  --session-p P --sessions S --session-reuse R   follow-up sessions\n"
            "  --mix M            fraction of stationary requests in a drifting trace\n"
            "cache:\n"
            "  --model LIST       prefix,exact,copy,agnostic,oracle,belady or all (all)\n"
            "  --policy LIST      %s or all (lru)\n"
            "  --budget-gib G     budget in GiB, 'inf' for no limit (1)\n"
            "  --bytes-per-token B  KV bytes a token (131072, Llama-3.1-8B bf16)\n"
            "  --block-tokens T   block size (16)\n"
            "  --inflight F       requests in flight (1)\n"
            "  --shared           budget shared with in-flight request KV\n"
            "  --question-tokens Q, --output-tokens O   per request (32, 16)\n"
            "  --cost docs|bytes  gdsf cost: document or byte hit rate (docs)\n"
            "  --warmup W         requests run but not counted (0)\n"
            "study, policies: --out DIR (bench/out), --quick\n"
            "trace: --out FILE: the workload's trace written in the trace-file format\n"
            "analytic: --d D (20) --c C (100) --analytic-alpha A (0.85) --draws N (2000000)\n",
            names);
}

static int parse_list(const char *s, int (*parse)(const char *, int *), int count, int *out, int *n)
{
    *n = 0;
    if (strcmp(s, "all") == 0) {
        for (int i = 0; i < count; i++) {
            out[(*n)++] = i;
        }
        return 0;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
        if (*n >= MAX_SERIES || parse(tok, &out[*n]) != 0) {
            fprintf(stderr, "hitrate: unknown name '%s'\n", tok);
            return LKV_EINVAL;
        }
        (*n)++;
    }
    return 0;
}

static int parse_len(const char *s, lkv_sim_gen *g)
{
    if (sscanf(s, "fixed:%lf", &g->len_a) == 1) {
        g->len_kind = LKV_SIM_LEN_FIXED;
        return 0;
    }
    if (sscanf(s, "uniform:%lf:%lf", &g->len_a, &g->len_b) == 2) {
        g->len_kind = LKV_SIM_LEN_UNIFORM;
        return 0;
    }
    if (sscanf(s, "lognormal:%lf:%lf", &g->len_a, &g->len_b) == 2) {
        g->len_kind = LKV_SIM_LEN_LOGNORMAL;
        return 0;
    }
    fprintf(stderr, "hitrate: bad --len '%s'\n", s);
    return LKV_EINVAL;
}

static uint64_t gib_to_bytes(double g)
{
    return isinf(g) ? UINT64_MAX : (uint64_t)(g * GIB);
}

static int parse_opts(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {{"ndocs", 1, 0, 'n'},
                                       {"len", 1, 0, 'l'},
                                       {"max-tokens", 1, 0, 'X'},
                                       {"k", 1, 0, 'k'},
                                       {"alpha", 1, 0, 'a'},
                                       {"requests", 1, 0, 'r'},
                                       {"seed", 1, 0, 's'},
                                       {"trace", 1, 0, 't'},
                                       {"doc-tokens", 1, 0, 'T'},
                                       {"model", 1, 0, 'm'},
                                       {"policy", 1, 0, 'p'},
                                       {"budget-gib", 1, 0, 'b'},
                                       {"bytes-per-token", 1, 0, 'B'},
                                       {"block-tokens", 1, 0, 'K'},
                                       {"inflight", 1, 0, 'f'},
                                       {"shared", 0, 0, 'S'},
                                       {"question-tokens", 1, 0, 'q'},
                                       {"output-tokens", 1, 0, 'o'},
                                       {"cost", 1, 0, 'c'},
                                       {"warmup", 1, 0, 'w'},
                                       {"out", 1, 0, 'O'},
                                       {"quick", 0, 0, 'Q'},
                                       {"d", 1, 0, 'D'},
                                       {"c", 1, 0, 'C'},
                                       {"analytic-alpha", 1, 0, 'A'},
                                       {"draws", 1, 0, 'N'},
                                       {"workload", 1, 0, 'W'},
                                       {"shift-every", 1, 0, 1000},
                                       {"shift-frac", 1, 0, 1001},
                                       {"shift-hot", 1, 0, 1002},
                                       {"burst-every", 1, 0, 1003},
                                       {"burst-len", 1, 0, 1004},
                                       {"session-p", 1, 0, 1005},
                                       {"sessions", 1, 0, 1006},
                                       {"session-reuse", 1, 0, 1007},
                                       {"mix", 1, 0, 1008},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    int models[MAX_SERIES], nm = 0, pols[MAX_SERIES], np = 0;
    models[nm++] = -1;
    pols[np++] = LKV_POLICY_LRU;
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'n':
            o->gen.ndocs = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'l':
            if (parse_len(optarg, &o->gen) != 0)
                return LKV_EINVAL;
            break;
        case 'X':
            o->gen.max_tokens = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'k':
            o->gen.k = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'a':
            o->gen.alpha = strtod(optarg, NULL);
            break;
        case 'r':
            o->gen.nreq = strtoull(optarg, NULL, 10);
            break;
        case 's':
            o->gen.seed = strtoull(optarg, NULL, 10);
            break;
        case 't':
            o->trace = optarg;
            break;
        case 'T':
            o->doc_tokens = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'm':
            if (parse_list(optarg, lkv_sim_model_parse, LKV_SIM__COUNT, models, &nm) != 0) {
                return LKV_EINVAL;
            }
            break;
        case 'p':
            if (parse_list(optarg, lkv_policy_parse, LKV_POLICY__COUNT, pols, &np) != 0) {
                return LKV_EINVAL;
            }
            break;
        case 'b':
            o->cfg.budget = gib_to_bytes(strtod(optarg, NULL));
            break;
        case 'B':
            o->cfg.bytes_per_token = strtoull(optarg, NULL, 10);
            break;
        case 'K':
            o->cfg.block_tokens = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'f':
            o->cfg.inflight = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'S':
            o->cfg.shared = 1;
            break;
        case 'q':
            o->cfg.question_tokens = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'o':
            o->cfg.output_tokens = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'c':
            if (strcmp(optarg, "bytes") != 0 && strcmp(optarg, "docs") != 0) {
                fprintf(stderr, "hitrate: --cost docs|bytes\n");
                return LKV_EINVAL;
            }
            o->cfg.cost_bytes = strcmp(optarg, "bytes") == 0;
            break;
        case 'w':
            o->cfg.warmup = strtoull(optarg, NULL, 10);
            break;
        case 'O':
            o->out = optarg;
            break;
        case 'Q':
            o->quick = 1;
            break;
        case 'D':
            o->d = strtoull(optarg, NULL, 10);
            break;
        case 'C':
            o->c = strtoull(optarg, NULL, 10);
            break;
        case 'A':
            o->a_alpha = strtod(optarg, NULL);
            break;
        case 'N':
            o->draws = strtoull(optarg, NULL, 10);
            break;
        case 'W':
            if (lkv_sim_workload(optarg, &o->gen) != 0) {
                fprintf(stderr, "hitrate: --workload zipf|shift|burst|session|mix\n");
                return LKV_EINVAL;
            }
            break;
        case 1000:
            o->gen.shift_every = strtoull(optarg, NULL, 10);
            break;
        case 1001:
            o->gen.shift_frac = strtod(optarg, NULL);
            break;
        case 1002:
            o->gen.shift_hot = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 1003:
            o->gen.burst_every = strtoull(optarg, NULL, 10);
            break;
        case 1004:
            o->gen.burst_len = strtoull(optarg, NULL, 10);
            break;
        case 1005:
            o->gen.session_p = strtod(optarg, NULL);
            break;
        case 1006:
            o->gen.sessions = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 1007:
            o->gen.session_reuse = strtod(optarg, NULL);
            break;
        case 1008:
            o->gen.mix = strtod(optarg, NULL);
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return LKV_EINVAL;
        }
    }
    if (models[0] == -1) {
        nm = 0;
        for (int m = 0; m < LKV_SIM__COUNT; m++) {
            models[nm++] = m;
        }
    }
    o->nser = 0;
    for (int i = 0; i < nm; i++) {
        for (int j = 0; j < np && o->nser < MAX_SERIES; j++) {
            if ((models[i] == LKV_SIM_ORACLE || models[i] == LKV_SIM_BELADY) && j > 0) {
                break; /* The references ignore the policy. */
            }
            o->ser[o->nser++] = (series){models[i], pols[j]};
        }
    }
    return 0;
}

static int load_trace(const opts *o, lkv_sim_trace *t)
{
    if (o->trace != NULL) {
        char err[512];
        int rc = lkv_sim_trace_load(o->trace, o->doc_tokens, t, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "hitrate: %s\n", err);
        }
        return rc;
    }
    int rc = lkv_sim_trace_generate(&o->gen, t);
    if (rc != 0) {
        fprintf(stderr, "hitrate: bad workload (k <= ndocs, lengths >= 1)\n");
    }
    return rc;
}

static double pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0.0;
}

static void series_name(const series *s, char *buf, size_t n)
{
    if (s->model == LKV_SIM_ORACLE) {
        snprintf(buf, n, "oracle/static");
        return;
    }
    if (s->model == LKV_SIM_BELADY) {
        snprintf(buf, n, "belady/size-heur");
        return;
    }
    snprintf(buf, n, "%s/%s", lkv_sim_model_name(s->model), lkv_policy_name(s->policy));
}

/* trace: writes the workload's trace (synthetic, or --trace re-written) to --out FILE, in the
 * trace-file format (the serving benchmark's trace:FILE workload reads it). */
static int cmd_trace(opts *o)
{
    lkv_sim_trace t;
    int rc = load_trace(o, &t);
    if (rc != 0) {
        return rc;
    }
    char err[512];
    rc = lkv_sim_trace_write(&t, o->out, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "hitrate: trace: %s\n", err);
    } else {
        printf("hitrate: %llu requests over %u documents written to %s\n",
               (unsigned long long)t.nreq, t.ndocs, o->out);
    }
    lkv_sim_trace_free(&t);
    return rc;
}

static int cmd_run(opts *o)
{
    lkv_sim_trace t;
    int rc = load_trace(o, &t);
    if (rc != 0) {
        return rc;
    }
    uint64_t tok = 0;
    for (uint32_t i = 0; i < t.ndocs; i++) {
        tok += t.doc_tokens[i];
    }
    printf("# trace: %llu requests, %llu document uses, pool %u documents (%.1f GiB of KV)\n",
           (unsigned long long)t.nreq, (unsigned long long)t.req_off[t.nreq], t.ndocs,
           (double)tok * (double)o->cfg.bytes_per_token / GIB);
    printf("%-20s %10s %10s %10s %12s %12s %8s\n", "model/policy", "block_hit%", "doc_hit%",
           "dropped", "evictions", "req/s", "window");
    for (int i = 0; i < o->nser; i++) {
        lkv_sim_cfg c = o->cfg;
        c.model = o->ser[i].model;
        c.policy = o->ser[i].policy;
        lkv_sim_result r;
        rc = lkv_sim_run(&t, &c, &r);
        if (rc != 0) {
            fprintf(stderr, "hitrate: run: %s\n", lkv_strerror(rc));
            break;
        }
        char name[64];
        series_name(&o->ser[i], name, sizeof(name));
        printf("%-20s %10.2f %10.2f %10llu %12llu %12.0f %8.3f\n", name,
               pct(r.hit_tokens, r.tokens), pct(r.doc_hits, r.docs), (unsigned long long)r.dropped,
               (unsigned long long)r.evictions, (double)t.nreq / (r.seconds > 0 ? r.seconds : 1e-9),
               r.window);
    }
    lkv_sim_trace_free(&t);
    return rc;
}

/* ---- analytic ---- */

static int cmd_analytic(const opts *o, FILE *md)
{
    static const double alphas[] = {0.85, 1.1, 1.5, 2.1};
    static const double paper[] = {2.86, 1.99, 1.37, 1.09};
    fprintf(md, "| alpha | analytic (formula) | paper | static top-C sim (real policy) | "
                "sim/analytic | LRU agn/aware | tlfu-gdsf agn/aware |\n");
    fprintf(md, "|---|---|---|---|---|---|---|\n");
    for (int i = -1; i < 4; i++) {
        double a = i < 0 ? o->a_alpha : alphas[i];
        if (i >= 0 && a == o->a_alpha) {
            continue;
        }
        double ratio = lkv_sim_capacity_ratio(o->d, o->c, a);
        double ha, hw, la, lw, ga, gw;
        int rc = lkv_sim_static_topc(o->d, o->c, a, 1000, o->draws, 7, &ha, &hw);
        rc = rc ? rc
                : lkv_sim_dynamic_topc(o->d, o->c, a, 1000, o->draws, 7, LKV_POLICY_LRU, &la, &lw);
        rc = rc ? rc
                : lkv_sim_dynamic_topc(o->d, o->c, a, 1000, o->draws, 7, LKV_POLICY_TLFU_GDSF, &ga,
                                       &gw);
        if (rc != 0) {
            fprintf(stderr, "hitrate: analytic: %s\n", lkv_strerror(rc));
            return rc;
        }
        char pap[16] = "n/a";
        for (int j = 0; j < 4; j++) {
            if (fabs(alphas[j] - a) < 1e-9) {
                snprintf(pap, sizeof(pap), "%.2f", paper[j]);
            }
        }
        fprintf(md,
                "| %.2f | %.3f | %s | %.3f (%.1f%% / %.1f%%) | %.4f | %.3f (%.1f%% / %.1f%%) | "
                "%.3f (%.1f%% / %.1f%%) |\n",
                a, ratio, pap, ha / hw, 100 * ha, 100 * hw, (ha / hw) / ratio, la / lw, 100 * la,
                100 * lw, ga / gw, 100 * ga, 100 * gw);
    }
    return 0;
}

/* ---- study ---- */

/* The series every study table and plot shows. */
static const series study_series[] = {
    {LKV_SIM_PREFIX, LKV_POLICY_LRU},       {LKV_SIM_EXACT, LKV_POLICY_LRU},
    {LKV_SIM_COPY, LKV_POLICY_LRU},         {LKV_SIM_AGNOSTIC, LKV_POLICY_LRU},
    {LKV_SIM_AGNOSTIC, LKV_POLICY_GDSF},    {LKV_SIM_AGNOSTIC, LKV_POLICY_LFUDA},
    {LKV_SIM_AGNOSTIC, LKV_POLICY_TINYLFU}, {LKV_SIM_AGNOSTIC, LKV_POLICY_TLFU_GDSF},
    {LKV_SIM_EXACT, LKV_POLICY_TLFU_GDSF},  {LKV_SIM_COPY, LKV_POLICY_TLFU_GDSF},
    {LKV_SIM_ORACLE, LKV_POLICY_LRU},       {LKV_SIM_AGNOSTIC, LKV_POLICY_ADAPTIVE},
    {LKV_SIM_BELADY, LKV_POLICY_LRU},
};
#define NSTUDY ((int)(sizeof(study_series) / sizeof(study_series[0])))

/* Runs every study series on one trace at one budget; writes block and doc hit rates (%). */
static int run_point(const opts *o, const lkv_sim_trace *t, uint64_t budget, double *blk,
                     double *doc, double *reqs, double *secs)
{
    for (int i = 0; i < NSTUDY; i++) {
        lkv_sim_cfg c = o->cfg;
        c.model = study_series[i].model;
        c.policy = study_series[i].policy;
        c.budget = budget;
        lkv_sim_result r;
        int rc = lkv_sim_run(t, &c, &r);
        if (rc != 0) {
            return rc;
        }
        blk[i] = pct(r.hit_tokens, r.tokens);
        doc[i] = pct(r.doc_hits, r.docs);
        *reqs += (double)t->nreq;
        *secs += r.seconds;
    }
    return 0;
}

static FILE *open_out(const opts *o, const char *name)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", o->out, name);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "hitrate: %s: %s\n", path, strerror(errno));
    }
    return f;
}

static void tsv_header(FILE *f, const char *x)
{
    fprintf(f, "%s", x);
    for (int i = 0; i < NSTUDY; i++) {
        char name[64];
        series_name(&study_series[i], name, sizeof(name));
        fprintf(f, "\t%s", name);
    }
    fprintf(f, "\n");
}

static int cmd_study(opts *o)
{
    if (mkdir(o->out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "hitrate: mkdir %s: %s\n", o->out, strerror(errno));
        return LKV_EIO;
    }
    FILE *md = open_out(o, "study.md");
    if (md == NULL) {
        return LKV_EIO;
    }
    int rc = 0;
    double reqs = 0, secs = 0;
    double blk[NSTUDY], doc[NSTUDY];
    const lkv_sim_gen g0 = o->gen;
    fprintf(md,
            "Workload: pool %u documents, lengths %s %.0f %.0f, k=%u a request, %llu requests, "
            "seed %llu, %llu B/token, %u-token blocks, %u in flight, %s budget, warmup %llu.\n\n",
            g0.ndocs,
            g0.len_kind == LKV_SIM_LEN_FIXED     ? "fixed"
            : g0.len_kind == LKV_SIM_LEN_UNIFORM ? "uniform"
                                                 : "lognormal",
            g0.len_a, g0.len_b, g0.k, (unsigned long long)g0.nreq, (unsigned long long)g0.seed,
            (unsigned long long)o->cfg.bytes_per_token, o->cfg.block_tokens, o->cfg.inflight,
            o->cfg.shared ? "shared" : "cache-only", (unsigned long long)o->cfg.warmup);

    /* 1. The paper-shaped table: every row run once, then printed per metric. */
    static const double rows_gib[] = {1, 1, 10, 50, INFINITY};
    static const double rows_alpha[] = {2.1, 1.1, 1.5, 1.5, 1.5};
    static const double paper[5][4] = {{0.00, 5.96, 7.27, 13.57},
                                       {0.00, 1.51, 1.84, 3.47},
                                       {0.55, 17.33, 21.13, 23.89},
                                       {1.95, 21.87, 26.67, 28.44},
                                       {2.16, 22.45, 27.38, 29.09}};
    double tb[5][NSTUDY], td[5][NSTUDY];
    for (int row = 0; row < 5; row++) {
        lkv_sim_gen g = g0;
        g.alpha = rows_alpha[row];
        lkv_sim_trace t;
        rc = lkv_sim_trace_generate(&g, &t);
        if (rc != 0) {
            goto out;
        }
        rc = run_point(o, &t, gib_to_bytes(rows_gib[row]), tb[row], td[row], &reqs, &secs);
        lkv_sim_trace_free(&t);
        if (rc != 0) {
            goto out;
        }
    }
    for (int metric = 0; metric < 2; metric++) {
        fprintf(md, "\n%s hit rate, %%:\n\n| budget | alpha |", metric ? "Document" : "Block");
        for (int i = 0; i < NSTUDY; i++) {
            char name[64];
            series_name(&study_series[i], name, sizeof(name));
            fprintf(md, " %s |", name);
        }
        fprintf(md, " agn-lru/copy | agn-lru/exact | best/lru | best/copy | best/exact |"
                    " best/copy-best | belady - best | belady - adaptive |\n|---|---|");
        for (int i = 0; i < NSTUDY + 8; i++) {
            fprintf(md, "---|");
        }
        fprintf(md, "\n");
        for (int row = 0; row < 5; row++) {
            double *v = metric ? td[row] : tb[row];
            double best = v[4];
            for (int i = 4; i < 8; i++) {
                best = v[i] > best ? v[i] : best;
            }
            if (isinf(rows_gib[row])) {
                fprintf(md, "| no limit | %.1f |", rows_alpha[row]);
            } else {
                fprintf(md, "| %.0f GiB | %.1f |", rows_gib[row], rows_alpha[row]);
            }
            for (int i = 0; i < NSTUDY; i++) {
                fprintf(md, " %.2f |", v[i]);
            }
            fprintf(md, " %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2f | %.2f |\n",
                    v[3] / v[2], v[3] / v[1], best / v[3], best / v[2], best / v[1], best / v[9],
                    v[12] - best, v[12] - v[11]);
            if (metric == 0) {
                fprintf(md,
                        "| paper | | %.2f | %.2f | %.2f | %.2f | | | | | | | | | | %.2fx | %.2fx "
                        "| | | | | | |\n",
                        paper[row][0], paper[row][1], paper[row][2], paper[row][3],
                        paper[row][3] / paper[row][2], paper[row][3] / paper[row][1]);
            }
        }
    }

    /* 1b. Sensitivity: the 1 GiB / alpha 2.1 and 10 GiB / alpha 1.5 rows under variants. */
    fprintf(md, "\nSensitivity, block hit rate %%:\n\n| variant | budget | alpha |");
    for (int i = 0; i < NSTUDY; i++) {
        char name[64];
        series_name(&study_series[i], name, sizeof(name));
        fprintf(md, " %s |", name);
    }
    fprintf(md, " agn-lru/copy | best/copy | best/lru | belady - best |\n|---|---|---|");
    for (int i = 0; i < NSTUDY + 4; i++) {
        fprintf(md, "---|");
    }
    fprintf(md, "\n");
    for (int var = 0; var < 7 && !o->quick; var++) {
        static const char *const names[] = {"as above",
                                            "pool 100 (paper's benchmark)",
                                            "lognormal lengths 1024, 1.0",
                                            "shared budget",
                                            "4 requests in flight",
                                            "k = 10 documents",
                                            "pool 100, uniform (paper's scripts)"};
        for (int row = 0; row < 2; row++) {
            lkv_sim_gen g = g0;
            opts ov = *o;
            double gib = row == 0 ? 1 : 10;
            g.alpha = row == 0 ? 2.1 : 1.5;
            switch (var) {
            case 1:
                g.ndocs = 100;
                break;
            case 2:
                g.len_kind = LKV_SIM_LEN_LOGNORMAL;
                g.len_a = 1024;
                g.len_b = 1.0;
                break;
            case 3:
                ov.cfg.shared = 1;
                break;
            case 4:
                ov.cfg.inflight = 4;
                break;
            case 5:
                g.k = 10;
                break;
            case 6:
                g.ndocs = 100;
                g.alpha = 0;
                break;
            default:
                break;
            }
            lkv_sim_trace t;
            rc = lkv_sim_trace_generate(&g, &t);
            if (rc != 0) {
                goto out;
            }
            rc = run_point(&ov, &t, gib_to_bytes(gib), blk, doc, &reqs, &secs);
            lkv_sim_trace_free(&t);
            if (rc != 0) {
                goto out;
            }
            double best = blk[4];
            for (int i = 4; i < 8; i++) {
                best = blk[i] > best ? blk[i] : best;
            }
            fprintf(md, "| %s | %.0f GiB | %.1f |", names[var], gib, g.alpha);
            for (int i = 0; i < NSTUDY; i++) {
                fprintf(md, " %.2f |", blk[i]);
            }
            fprintf(md, " %.2fx | %.2fx | %.2fx | %.2f |\n", blk[3] / blk[2], best / blk[2],
                    best / blk[3], blk[12] - best);
        }
    }

    /* 2. Budget sweep at alpha 1.5, and 3. skew sweep at 1 GiB and 10 GiB. */
    static const double budgets[] = {0.5, 1, 2, 5, 10, 20, 50, 100, 200, INFINITY};
    static const double alphas[] = {0, 0.6, 0.8, 1.0, 1.1, 1.3, 1.5, 1.8, 2.1, 2.5};
    int nb = o->quick ? 4 : (int)(sizeof(budgets) / sizeof(budgets[0]));
    int na = o->quick ? 4 : (int)(sizeof(alphas) / sizeof(alphas[0]));
    FILE *fb = open_out(o, "budget.tsv");
    if (fb == NULL) {
        rc = LKV_EIO;
        goto out;
    }
    tsv_header(fb, "budget_gib");
    lkv_sim_trace t;
    rc = lkv_sim_trace_generate(&g0, &t);
    for (int i = 0; i < nb && rc == 0; i++) {
        rc = run_point(o, &t, gib_to_bytes(budgets[i]), blk, doc, &reqs, &secs);
        fprintf(fb, "%g", isinf(budgets[i]) ? 1000.0 : budgets[i]);
        for (int j = 0; j < NSTUDY; j++) {
            fprintf(fb, "\t%.3f", blk[j]);
        }
        fprintf(fb, "\n");
    }
    lkv_sim_trace_free(&t);
    fclose(fb);
    static const double skew_gib[] = {1, 10};
    for (int s = 0; s < 2 && rc == 0; s++) {
        char name[64];
        snprintf(name, sizeof(name), "skew_%.0fgib.tsv", skew_gib[s]);
        FILE *fs = open_out(o, name);
        if (fs == NULL) {
            rc = LKV_EIO;
            goto out;
        }
        tsv_header(fs, "alpha");
        for (int i = 0; i < na && rc == 0; i++) {
            lkv_sim_gen g = g0;
            g.alpha = alphas[i];
            rc = lkv_sim_trace_generate(&g, &t);
            if (rc == 0) {
                rc = run_point(o, &t, gib_to_bytes(skew_gib[s]), blk, doc, &reqs, &secs);
                lkv_sim_trace_free(&t);
            }
            fprintf(fs, "%g", alphas[i]);
            for (int j = 0; j < NSTUDY; j++) {
                fprintf(fs, "\t%.3f", blk[j]);
            }
            fprintf(fs, "\n");
        }
        fclose(fs);
    }
    if (rc != 0) {
        goto out;
    }

    /* 4. The analytic capacity ratio. */
    fprintf(md,
            "\nAnalytic capacity ratio, D=%llu positions, C=%llu entries, pool 1000, %llu "
            "draws:\n\n",
            (unsigned long long)o->d, (unsigned long long)o->c, (unsigned long long)o->draws);
    rc = cmd_analytic(o, md);
    fprintf(md, "\nSimulated %.0f requests in %.1f s: %.2f M requests/s overall (all models).\n",
            reqs, secs, reqs / secs / 1e6);
out:
    fclose(md);
    if (rc != 0) {
        fprintf(stderr, "hitrate: study: %s\n", lkv_strerror(rc));
    }
    return rc;
}

/* ---- policy study: every policy against Belady on stationary and drifting workloads ---- */

typedef struct pworkload {
    const char *name;   /* Row label. */
    const char *preset; /* lkv_sim_workload name. */
    double alpha;       /* Zipf exponent. */
} pworkload;

static const pworkload pworkloads[] = {
    {"zipf-2.1", "zipf", 2.1},   {"zipf-1.5", "zipf", 1.5},   {"zipf-1.1", "zipf", 1.1},
    {"shift-1.1", "shift", 1.1}, {"burst-1.1", "burst", 1.1}, {"session-1.1", "session", 1.1},
    {"mix-1.1", "mix", 1.1},
};
#define NPW ((int)(sizeof(pworkloads) / sizeof(pworkloads[0])))

static const double pbudgets[] = {0.25, 1, 4, 16, 32};
#define NPB ((int)(sizeof(pbudgets) / sizeof(pbudgets[0])))

/* Policies of the study, then the two references (oracle, belady) as models. */
static const series pseries[] = {
    {LKV_SIM_AGNOSTIC, LKV_POLICY_LRU},       {LKV_SIM_AGNOSTIC, LKV_POLICY_TINYLFU},
    {LKV_SIM_AGNOSTIC, LKV_POLICY_LFUDA},     {LKV_SIM_AGNOSTIC, LKV_POLICY_GDSF},
    {LKV_SIM_AGNOSTIC, LKV_POLICY_TLFU_GDSF}, {LKV_SIM_AGNOSTIC, LKV_POLICY_ADAPTIVE},
    {LKV_SIM_ORACLE, LKV_POLICY_LRU},         {LKV_SIM_BELADY, LKV_POLICY_LRU},
};
#define NPS       ((int)(sizeof(pseries) / sizeof(pseries[0])))
#define PS_LRU    0
#define PS_TLFU   1
#define PS_ADAPT  5
#define PS_BELADY 7

static const char *pseries_name(int i)
{
    static char names[NPS][32];
    if (names[i][0] == '\0') {
        if (pseries[i].model == LKV_SIM_AGNOSTIC) {
            snprintf(names[i], sizeof(names[i]), "%s", lkv_policy_name(pseries[i].policy));
        } else {
            series_name(&pseries[i], names[i], sizeof(names[i]));
        }
    }
    return names[i];
}

static int cmd_policies(opts *o)
{
    if (mkdir(o->out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "hitrate: mkdir %s: %s\n", o->out, strerror(errno));
        return LKV_EIO;
    }
    FILE *md = open_out(o, "policies.md");
    FILE *js = open_out(o, "policies.json");
    if (md == NULL || js == NULL) {
        return LKV_EIO;
    }
    static const char *const lens[] = {"long", "short"};
    int rc = 0;
    double cpu = 0, runs = 0;
    uint64_t nreq = o->quick ? 5000 : o->gen.nreq;
    double worst = INFINITY, close_sum = 0, rows = 0, met = 0;
    char worst_row[96] = "";
    fprintf(md,
            "Policy study: %llu requests a row, pool %u, seed %llu, cost %s, %u in flight; block "
            "hit rate %% (doc hit rate in policies.json). margin = adaptive - max(lru, "
            "tinylfu); closed = (adaptive - lru) / (belady - lru); to belady = belady - "
            "adaptive. belady is the size-aware heuristic (lkv_sim.h).\n",
            (unsigned long long)nreq, o->gen.ndocs, (unsigned long long)o->gen.seed,
            o->cfg.cost_bytes ? "bytes" : "docs", o->cfg.inflight);
    fprintf(js, "{\n  \"requests\": %llu, \"rows\": [\n", (unsigned long long)nreq);
    int first = 1;
    for (int li = 0; li < 2 && rc == 0; li++) {
        fprintf(md, "\n%s documents (%s):\n\n| workload | budget GiB |", lens[li],
                li == 0 ? "2048 tokens, k = 5" : "lognormal median 270, sigma 0.6, k = 6");
        for (int i = 0; i < NPS; i++) {
            fprintf(md, " %s |", pseries_name(i));
        }
        fprintf(md, " margin | closed | to belady |\n|---|---|");
        for (int i = 0; i < NPS + 3; i++) {
            fprintf(md, "---|");
        }
        fprintf(md, "\n");
        char tsvname[64];
        snprintf(tsvname, sizeof(tsvname), "policies_%s.tsv", lens[li]);
        FILE *tsv = open_out(o, tsvname);
        if (tsv == NULL) {
            rc = LKV_EIO;
            break;
        }
        for (int w = 0; w < NPW && rc == 0; w++) {
            if (o->quick && w != 1 && w != 6) {
                continue;
            }
            lkv_sim_gen g = o->gen;
            (void)lkv_sim_workload(pworkloads[w].preset, &g);
            g.alpha = pworkloads[w].alpha;
            g.nreq = nreq;
            if (li == 1) {
                g.len_kind = LKV_SIM_LEN_LOGNORMAL;
                g.len_a = 270;
                g.len_b = 0.6;
                g.k = 6;
            }
            lkv_sim_trace t;
            rc = lkv_sim_trace_generate(&g, &t);
            if (rc != 0) {
                break;
            }
            fprintf(tsv, "# %s\nbudget_gib", pworkloads[w].name);
            for (int i = 0; i < NPS; i++) {
                fprintf(tsv, "\t%s", pseries_name(i));
            }
            fprintf(tsv, "\n");
            for (int b = 0; b < NPB && rc == 0; b++) {
                if (o->quick && b != 1 && b != 3) {
                    continue;
                }
                double blk[NPS], doc[NPS], win = 0;
                for (int i = 0; i < NPS; i++) {
                    lkv_sim_cfg c = o->cfg;
                    c.model = pseries[i].model;
                    c.policy = pseries[i].policy;
                    c.budget = gib_to_bytes(pbudgets[b]);
                    lkv_sim_result r;
                    rc = lkv_sim_run(&t, &c, &r);
                    if (rc != 0) {
                        break;
                    }
                    blk[i] = pct(r.hit_tokens, r.tokens);
                    doc[i] = pct(r.doc_hits, r.docs);
                    win = i == PS_ADAPT ? r.window : win;
                    cpu += r.seconds;
                    runs++;
                }
                if (rc != 0) {
                    break;
                }
                double best = fmax(blk[PS_LRU], blk[PS_TLFU]), margin = blk[PS_ADAPT] - best;
                double gap = blk[PS_BELADY] - blk[PS_LRU];
                double closed = gap > 1e-9 ? (blk[PS_ADAPT] - blk[PS_LRU]) / gap : 1.0;
                rows++;
                close_sum += closed;
                met += margin >= -1.0;
                if (margin < worst) {
                    worst = margin;
                    snprintf(worst_row, sizeof(worst_row), "%s, %s, %g GiB", lens[li],
                             pworkloads[w].name, pbudgets[b]);
                }
                fprintf(md, "| %s | %g |", pworkloads[w].name, pbudgets[b]);
                fprintf(tsv, "%g", pbudgets[b]);
                fprintf(js,
                        "%s    {\"docs\": \"%s\", \"workload\": \"%s\", \"budget_gib\": %g, "
                        "\"window\": %.3f, \"block\": {",
                        first ? "" : ",\n", lens[li], pworkloads[w].name, pbudgets[b], win);
                first = 0;
                for (int i = 0; i < NPS; i++) {
                    fprintf(md, " %.2f |", blk[i]);
                    fprintf(tsv, "\t%.3f", blk[i]);
                    fprintf(js, "%s\"%s\": %.3f", i ? ", " : "", pseries_name(i), blk[i]);
                }
                fprintf(js, "}, \"doc\": {");
                for (int i = 0; i < NPS; i++) {
                    fprintf(js, "%s\"%s\": %.3f", i ? ", " : "", pseries_name(i), doc[i]);
                }
                fprintf(js, "}, \"margin\": %.3f, \"closed\": %.3f}", margin, closed);
                fprintf(md, " %+.2f%s | %.2f | %.2f |\n", margin, margin < -1.0 ? " **miss**" : "",
                        closed, blk[PS_BELADY] - blk[PS_ADAPT]);
                fprintf(tsv, "\n");
            }
            fprintf(tsv, "\n\n");
            lkv_sim_trace_free(&t);
        }
        fclose(tsv);
    }
    fprintf(md,
            "\nSummary: %.0f rows; adaptive within 1 point of max(lru, tinylfu) on %.0f "
            "(worst margin %+.2f: %s); average share of the LRU-to-Belady gap closed %.2f "
            "(target 0.33). %.0f simulations, %.1f s of simulation.\n",
            rows, met, worst, worst_row, rows > 0 ? close_sum / rows : 0, runs, cpu);
    fprintf(js,
            "\n  ],\n  \"summary\": {\"rows\": %.0f, \"within_1pt\": %.0f, \"worst_margin\": "
            "%.3f, \"mean_closed\": %.3f, \"seconds\": %.2f}\n}\n",
            rows, met, worst, rows > 0 ? close_sum / rows : 0, cpu);
    printf("rows %.0f, within 1 point %.0f, worst margin %+.2f (%s), mean closed %.3f, %.1f s\n",
           rows, met, worst, worst_row, rows > 0 ? close_sum / rows : 0, cpu);
    fclose(md);
    fclose(js);
    if (rc != 0) {
        fprintf(stderr, "hitrate: policies: %s\n", lkv_strerror(rc));
    }
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    opts o;
    memset(&o, 0, sizeof(o));
    lkv_sim_gen_default(&o.gen);
    lkv_sim_cfg_default(&o.cfg);
    o.doc_tokens = 2048;
    o.out = "bench/out";
    o.d = 20;
    o.c = 100;
    o.a_alpha = 0.85;
    o.draws = 2000000;
    const char *cmd = argv[1];
    if (parse_opts(argc - 1, argv + 1, &o) != 0) {
        return 2;
    }
    int rc;
    if (strcmp(cmd, "run") == 0) {
        rc = cmd_run(&o);
    } else if (strcmp(cmd, "study") == 0) {
        rc = cmd_study(&o);
    } else if (strcmp(cmd, "policies") == 0) {
        rc = cmd_policies(&o);
    } else if (strcmp(cmd, "analytic") == 0) {
        rc = cmd_analytic(&o, stdout);
    } else if (strcmp(cmd, "trace") == 0) {
        rc = cmd_trace(&o);
    } else {
        usage(stderr);
        return 2;
    }
    return rc == 0 ? 0 : 1;
}
