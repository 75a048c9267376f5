/*
 * lkv_sim.c: trace generation, trace files and the four cache models (see lkv_sim.h).
 *
 * Every model is a loop over requests that turns each document use into policy calls
 * (record, contains, touch, would_admit, admit, pin, unpin, remove) on one lkv_policy. Key
 * spaces never collide:
 *   agnostic, copy   document index (< 2^32);
 *   exact            (token offset << 32) | document index, offsets < 2^30;
 *   prefix           hash chain value with the top two bits cleared;
 *   copies           (1 << 63) | copy counter;
 *   request KV       (1 << 62) | request number (shared budget only).
 * In-flight requests live in a ring of `inflight` slots; a slot lists the ids to unpin and to
 * remove when its request leaves flight, which happens just before the slot is reused. KV a
 * request uses is pinned while it is in flight (as vLLM holds a running request's blocks and
 * a lazykv worker holds a lease): documents (agnostic, exact), prefix blocks, copies (copy;
 * the copy's source only while the copy is made).
 *
 * Drift generators draw ranks from the same Zipf table and map them to documents through a
 * rank -> document permutation that shifts and bursts rewrite; a stationary trace never
 * touches that code (its RNG sequence is the study's). Belady runs its own metadata (one
 * max-heap on next use per power-of-two size class) and never calls lkv_policy. Residency
 * events of trace files are applied by the agnostic model before their request.
 */
#include "lkv_sim.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_policy.h"

#define COPY_BIT (1ull << 63)
#define REQ_BIT  (1ull << 62)
#define KEY_MASK (~(3ull << 62))

static const char *const model_names[LKV_SIM__COUNT] = {"prefix",   "exact",  "copy",
                                                        "agnostic", "oracle", "belady"};

/* ---- RNG (splitmix64) ---- */

typedef struct rng {
    uint64_t s; /* State. */
} rng;

static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t rng_next(rng *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    uint64_t x = r->s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline double rng_unit(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static double rng_normal(rng *r)
{
    double u = rng_unit(r), v = rng_unit(r);
    if (u < 1e-300) {
        u = 1e-300;
    }
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* ---- Zipf ---- */

typedef struct zipf {
    double *cdf; /* [n] cumulative mass, cdf[n-1] = total; NULL for uniform. */
    uint32_t n;  /* Ranks. */
} zipf;

static void zipf_init(zipf *z, uint32_t n, double alpha)
{
    z->n = n;
    z->cdf = NULL;
    if (alpha <= 0) {
        return;
    }
    z->cdf = lkv_xmalloc((size_t)n * sizeof(double));
    double s = 0;
    for (uint32_t i = 0; i < n; i++) {
        s += pow((double)(i + 1), -alpha);
        z->cdf[i] = s;
    }
}

/* Returns a rank in [0, n): rank 0 is the most popular. */
static uint32_t zipf_draw(const zipf *z, rng *r)
{
    if (z->cdf == NULL) {
        return (uint32_t)(rng_unit(r) * z->n);
    }
    double u = rng_unit(r) * z->cdf[z->n - 1];
    uint32_t lo = 0, hi = z->n - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (z->cdf[mid] > u) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

double lkv_sim_zipf_sum(uint64_t n, double alpha)
{
    double s = 0;
    for (uint64_t i = n; i >= 1; i--) { /* Smallest terms first: less rounding. */
        s += pow((double)i, -alpha);
    }
    return s;
}

double lkv_sim_capacity_ratio(uint64_t d, uint64_t c, double alpha)
{
    uint64_t top = d > 0 ? c / d : 0;
    if (top == 0) {
        return INFINITY;
    }
    return lkv_sim_zipf_sum(c, alpha) / lkv_sim_zipf_sum(top, alpha);
}

/* ---- traces ---- */

void lkv_sim_gen_default(lkv_sim_gen *g)
{
    memset(g, 0, sizeof(*g));
    g->ndocs = 10000;
    g->len_kind = LKV_SIM_LEN_FIXED;
    g->len_a = 2048;
    g->len_b = 0;
    g->max_tokens = 32768;
    g->k = 5;
    g->alpha = 1.5;
    g->nreq = 100000;
    g->seed = 1;
}

void lkv_sim_cfg_default(lkv_sim_cfg *c)
{
    memset(c, 0, sizeof(*c));
    c->model = LKV_SIM_AGNOSTIC;
    c->policy = LKV_POLICY_LRU;
    c->budget = 1ull << 30;
    c->bytes_per_token = 131072;
    c->block_tokens = 16;
    c->inflight = 1;
    c->question_tokens = 32;
    c->output_tokens = 16;
}

int lkv_sim_trace_write(const lkv_sim_trace *t, const char *path, char *err, int errlen)
{
    if (t->nev > 0) {
        snprintf(err, (size_t)errlen, "%s: traces with residency events are not written", path);
        return LKV_EINVAL;
    }
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, (size_t)errlen, "%s: %s", path, strerror(errno));
        return LKV_EIO;
    }
    uint8_t *seen = lkv_xcalloc(t->ndocs ? t->ndocs : 1, 1);
    fprintf(f, "# %llu requests over %u documents (bench/hitrate lkv_sim_trace_write)\n",
            (unsigned long long)t->nreq, t->ndocs);
    for (uint64_t q = 0; q < t->nreq; q++) {
        for (uint64_t i = t->req_off[q]; i < t->req_off[q + 1]; i++) {
            uint32_t d = t->docs[i];
            fprintf(f, i > t->req_off[q] ? " d%u" : "d%u", d);
            if (!seen[d]) {
                seen[d] = 1;
                fprintf(f, ":%u", t->doc_tokens[d]);
            }
        }
        fputc('\n', f);
    }
    free(seen);
    if (ferror(f) | (fclose(f) != 0)) {
        snprintf(err, (size_t)errlen, "%s: write failed", path);
        return LKV_EIO;
    }
    return 0;
}

void lkv_sim_trace_free(lkv_sim_trace *t)
{
    if (t == NULL) {
        return;
    }
    free(t->doc_tokens);
    free(t->req_off);
    free(t->docs);
    free(t->ev);
    memset(t, 0, sizeof(*t));
}

int lkv_sim_workload(const char *name, lkv_sim_gen *g)
{
    lkv_sim_gen d = *g;
    d.shift_every = d.burst_every = d.burst_len = 0;
    d.shift_frac = d.session_p = d.session_reuse = d.mix = 0;
    d.shift_hot = d.sessions = 0;
    if (strcmp(name, "zipf") == 0) {
    } else if (strcmp(name, "shift") == 0) {
        d.shift_every = 1000;
        d.shift_frac = 0.25;
        d.shift_hot = 100;
    } else if (strcmp(name, "burst") == 0) {
        d.burst_every = 500;
        d.burst_len = 250;
    } else if (strcmp(name, "session") == 0) {
        d.session_p = 0.6;
        d.sessions = 32;
        d.session_reuse = 0.6;
    } else if (strcmp(name, "mix") == 0) {
        d.mix = 0.5;
        d.shift_every = 2000;
        d.shift_frac = 0.25;
        d.shift_hot = 100;
        d.burst_every = 1000;
        d.burst_len = 300;
        d.session_p = 0.5;
        d.sessions = 32;
        d.session_reuse = 0.6;
    } else {
        return LKV_EINVAL;
    }
    *g = d;
    return 0;
}

static int has_drift(const lkv_sim_gen *g)
{
    return g->shift_every > 0 || g->burst_every > 0 || g->session_p > 0;
}

/* Draws k distinct documents into d (k slots; the first `kept` already set), through perm. */
static void draw_docs(const zipf *z, rng *r, const uint32_t *perm, uint32_t burst_doc, int burst,
                      uint32_t *d, uint32_t kept, uint32_t k)
{
    for (uint32_t j = kept; j < k; j++) {
        for (;;) {
            uint32_t rank = zipf_draw(z, r), x;
            if (perm == NULL) {
                x = rank;
            } else if (burst) {
                x = rank == 0 ? burst_doc : perm[rank - 1];
            } else {
                x = perm[rank];
            }
            uint32_t i = 0;
            while (i < j && d[i] != x) {
                i++;
            }
            if (i == j) {
                d[j] = x;
                break;
            }
        }
    }
    for (uint32_t j = k - 1; j > 0; j--) { /* Random order (Fisher-Yates). */
        uint32_t i = (uint32_t)(rng_unit(r) * (j + 1));
        uint32_t tmp = d[i];
        d[i] = d[j];
        d[j] = tmp;
    }
}

/* The drifting requests of g into t (documents and lengths already set up). */
static void generate_drift(const lkv_sim_gen *g, const zipf *z, rng *r, lkv_sim_trace *t)
{
    uint32_t n = g->ndocs, k = g->k;
    uint32_t hot = g->shift_hot ? g->shift_hot : 100;
    hot = hot < n ? hot : n;
    uint32_t *perm = lkv_xmalloc((size_t)n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        perm[i] = i;
    }
    uint32_t ns = g->sessions ? g->sessions : 32;
    uint32_t *sess = lkv_xcalloc((size_t)ns * k, sizeof(uint32_t));
    uint8_t *live = lkv_xcalloc(ns, 1);
    uint32_t burst_doc = 0;
    uint64_t burst_until = 0;
    for (uint64_t q = 0; q < g->nreq; q++) {
        if (g->shift_every > 0 && q > 0 && q % g->shift_every == 0 && hot < n) {
            uint32_t nrep = (uint32_t)(g->shift_frac * hot + 0.5);
            for (uint32_t j = 0; j < nrep; j++) {
                uint32_t a = (uint32_t)(rng_unit(r) * hot);
                uint32_t b = hot + (uint32_t)(rng_unit(r) * (n - hot));
                uint32_t tmp = perm[a];
                perm[a] = perm[b];
                perm[b] = tmp;
            }
        }
        if (g->burst_every > 0 && q % g->burst_every == 0 && hot < n) {
            burst_doc = perm[hot + (uint32_t)(rng_unit(r) * (n - hot))];
            burst_until = q + g->burst_len;
        }
        int burst = q < burst_until;
        uint32_t *d = t->docs + q * k;
        t->req_off[q] = q * k;
        if (g->mix > 0 && rng_unit(r) < g->mix) {
            draw_docs(z, r, NULL, 0, 0, d, 0, k);
            continue;
        }
        uint32_t kept = 0;
        uint32_t sl = (uint32_t)(rng_unit(r) * ns);
        if (g->session_p > 0 && live[sl] && rng_unit(r) < g->session_p) {
            for (uint32_t j = 0; j < k; j++) {
                if (rng_unit(r) < g->session_reuse) {
                    d[kept++] = sess[(size_t)sl * k + j];
                }
            }
        }
        draw_docs(z, r, perm, burst_doc, burst, d, kept, k);
        if (g->session_p > 0) {
            memcpy(sess + (size_t)sl * k, d, k * sizeof(uint32_t));
            live[sl] = 1;
        }
    }
    free(perm);
    free(sess);
    free(live);
}

int lkv_sim_trace_generate(const lkv_sim_gen *g, lkv_sim_trace *t)
{
    if (g->ndocs == 0 || g->k == 0 || g->k > g->ndocs || g->nreq == 0 || g->alpha < 0) {
        return LKV_EINVAL;
    }
    if (g->len_a < 1 || (g->len_kind == LKV_SIM_LEN_UNIFORM && g->len_b < g->len_a) ||
        g->len_kind < LKV_SIM_LEN_FIXED || g->len_kind > LKV_SIM_LEN_LOGNORMAL) {
        return LKV_EINVAL;
    }
    memset(t, 0, sizeof(*t));
    rng r = {g->seed * 0x2545f4914f6cdd1dull + 17};
    t->ndocs = g->ndocs;
    t->doc_tokens = lkv_xmalloc((size_t)g->ndocs * sizeof(uint32_t));
    for (uint32_t i = 0; i < g->ndocs; i++) {
        double len = g->len_a;
        if (g->len_kind == LKV_SIM_LEN_UNIFORM) {
            len = g->len_a + floor(rng_unit(&r) * (g->len_b - g->len_a + 1));
        } else if (g->len_kind == LKV_SIM_LEN_LOGNORMAL) {
            len = g->len_a * exp(g->len_b * rng_normal(&r));
            len = len < 16 ? 16 : len;
            len = len > g->max_tokens ? g->max_tokens : len;
        }
        t->doc_tokens[i] = (uint32_t)len;
    }
    t->nreq = g->nreq;
    t->req_off = lkv_xmalloc((size_t)(g->nreq + 1) * sizeof(uint64_t));
    t->docs = lkv_xmalloc((size_t)(g->nreq * g->k) * sizeof(uint32_t));
    zipf z;
    zipf_init(&z, g->ndocs, g->alpha);
    if (has_drift(g)) {
        generate_drift(g, &z, &r, t);
        t->req_off[g->nreq] = g->nreq * g->k;
        free(z.cdf);
        return 0;
    }
    for (uint64_t q = 0; q < g->nreq; q++) {
        uint32_t *d = t->docs + q * g->k;
        t->req_off[q] = q * g->k;
        for (uint32_t j = 0; j < g->k; j++) {
            for (;;) { /* Distinct documents: redraw a duplicate. */
                uint32_t x = zipf_draw(&z, &r);
                uint32_t i = 0;
                while (i < j && d[i] != x) {
                    i++;
                }
                if (i == j) {
                    d[j] = x;
                    break;
                }
            }
        }
        for (uint32_t j = g->k - 1; j > 0; j--) { /* Random order (Fisher-Yates). */
            uint32_t i = (uint32_t)(rng_unit(&r) * (j + 1));
            uint32_t tmp = d[i];
            d[i] = d[j];
            d[j] = tmp;
        }
    }
    t->req_off[g->nreq] = g->nreq * g->k;
    free(z.cdf);
    return 0;
}

/* String id -> dense index map for trace files (open addressing on a 64-bit FNV-1a hash). */
typedef struct idmap {
    uint64_t *keys; /* Hash of each id string (0 = empty slot; a zero hash is remapped to 1). */
    uint32_t *vals; /* Dense index. */
    uint64_t mask;  /* Slots - 1. */
    uint32_t n;     /* Ids. */
} idmap;

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    }
    return h ? h : 1;
}

static uint32_t idmap_get(idmap *m, uint64_t h, int *fresh)
{
    if ((uint64_t)(m->n + 1) * 2 > m->mask + 1) {
        uint64_t old_size = m->mask + 1;
        uint64_t *ok = m->keys;
        uint32_t *ov = m->vals;
        m->mask = old_size * 2 - 1;
        m->keys = lkv_xcalloc(m->mask + 1, sizeof(uint64_t));
        m->vals = lkv_xcalloc(m->mask + 1, sizeof(uint32_t));
        for (uint64_t i = 0; i < old_size; i++) {
            if (ok[i] != 0) {
                uint64_t j = mix64(ok[i]) & m->mask;
                while (m->keys[j] != 0) {
                    j = (j + 1) & m->mask;
                }
                m->keys[j] = ok[i];
                m->vals[j] = ov[i];
            }
        }
        free(ok);
        free(ov);
    }
    uint64_t j = mix64(h) & m->mask;
    while (m->keys[j] != 0 && m->keys[j] != h) {
        j = (j + 1) & m->mask;
    }
    *fresh = m->keys[j] == 0;
    if (*fresh) {
        m->keys[j] = h;
        m->vals[j] = m->n++;
    }
    return m->vals[j];
}

/* The dense index of the id s[0..n), growing the token array for a new one. */
static uint32_t doc_index(idmap *m, lkv_sim_trace *t, uint64_t *tok_cap, const char *s, size_t n)
{
    int fresh;
    uint32_t idx = idmap_get(m, fnv1a(s, n), &fresh);
    if (idx >= *tok_cap) {
        t->doc_tokens = lkv_xrealloc(t->doc_tokens, *tok_cap * 2 * sizeof(uint32_t));
        memset(t->doc_tokens + *tok_cap, 0, *tok_cap * sizeof(uint32_t));
        *tok_cap *= 2;
    }
    return idx;
}

/* Parses one '!' directive (s after the '!') into a new event before request t->nreq. */
static int parse_event(char *s, idmap *m, lkv_sim_trace *t, uint64_t *tok_cap, uint64_t *ev_cap)
{
    static const char *const ops[] = {"hold", "release",    "class",         "prio",
                                      "ttl",  "hold-class", "release-class", "evict-class"};
    char *tok[4];
    int nt = 0;
    for (char *x = strtok(s, " \t\r\n,"); x != NULL && nt < 4; x = strtok(NULL, " \t\r\n,")) {
        tok[nt++] = x;
    }
    if (nt == 0) {
        return LKV_EINVAL;
    }
    int op = -1;
    for (int i = 0; i < (int)(sizeof(ops) / sizeof(ops[0])); i++) {
        if (strcmp(tok[0], ops[i]) == 0) {
            op = i;
        }
    }
    lkv_sim_event e = {t->nreq, op, 0, 0};
    int doc_op = op >= LKV_SIM_EV_HOLD && op <= LKV_SIM_EV_TTL;
    int want = doc_op ? (op <= LKV_SIM_EV_RELEASE ? 2 : 3) : 2;
    if (op < 0 || nt != want) {
        return LKV_EINVAL;
    }
    if (doc_op) {
        e.doc = doc_index(m, t, tok_cap, tok[1], strlen(tok[1]));
    }
    if (want == 3 || !doc_op) {
        char *end;
        errno = 0;
        e.arg = strtoll(tok[want - 1], &end, 10);
        if (*end != '\0' || errno != 0 || (op == LKV_SIM_EV_PRIO && (e.arg < -1 || e.arg > 1)) ||
            (op == LKV_SIM_EV_TTL && e.arg < 1)) {
            return LKV_EINVAL;
        }
    }
    if (t->nev == *ev_cap) {
        *ev_cap = *ev_cap ? *ev_cap * 2 : 16;
        t->ev = lkv_xrealloc(t->ev, *ev_cap * sizeof(lkv_sim_event));
    }
    t->ev[t->nev++] = e;
    return 0;
}

int lkv_sim_trace_load(const char *path, uint32_t default_tokens, lkv_sim_trace *t, char *err,
                       int errlen)
{
    int rc = 0;
    memset(t, 0, sizeof(*t));
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, (size_t)errlen, "%s: %s", path, strerror(errno));
        return LKV_EIO;
    }
    idmap m = {lkv_xcalloc(1024, sizeof(uint64_t)), lkv_xcalloc(1024, sizeof(uint32_t)), 1023, 0};
    uint64_t docs_cap = 1024, reqs_cap = 1024, ndocs_used = 0, tok_cap = 1024, ev_cap = 0;
    t->docs = lkv_xmalloc(docs_cap * sizeof(uint32_t));
    t->req_off = lkv_xmalloc(reqs_cap * sizeof(uint64_t));
    t->doc_tokens = lkv_xcalloc(tok_cap, sizeof(uint32_t));
    char *line = NULL;
    size_t cap = 0;
    uint64_t lineno = 0;
    while (getline(&line, &cap, f) != -1) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        uint64_t start = ndocs_used;
        char *s = line;
        while (isspace((unsigned char)*s)) {
            s++;
        }
        if (*s == '!') {
            if (parse_event(s + 1, &m, t, &tok_cap, &ev_cap) != 0) {
                snprintf(err, (size_t)errlen, "%s:%llu: bad directive (see README.md)", path,
                         (unsigned long long)lineno);
                rc = LKV_EINVAL;
                goto out;
            }
            continue;
        }
        for (;;) {
            while (*s != '\0' && (isspace((unsigned char)*s) || *s == ',')) {
                s++;
            }
            if (*s == '\0') {
                break;
            }
            char *e = s;
            while (*e != '\0' && !isspace((unsigned char)*e) && *e != ',' && *e != ':') {
                e++;
            }
            size_t idlen = (size_t)(e - s);
            long long tokens = 0;
            if (*e == ':') {
                char *end;
                errno = 0;
                tokens = strtoll(e + 1, &end, 10);
                if (end == e + 1 || errno != 0 || tokens < 1 || tokens > (1 << 30) ||
                    (*end != '\0' && !isspace((unsigned char)*end) && *end != ',')) {
                    snprintf(err, (size_t)errlen, "%s:%llu: bad token count after '%.*s'", path,
                             (unsigned long long)lineno, (int)(e - s), s);
                    rc = LKV_EINVAL;
                    goto out;
                }
                e = end;
            }
            uint32_t idx = doc_index(&m, t, &tok_cap, s, idlen);
            if (t->doc_tokens[idx] == 0 && tokens > 0) {
                t->doc_tokens[idx] = (uint32_t)tokens;
            }
            if (ndocs_used == docs_cap) {
                docs_cap *= 2;
                t->docs = lkv_xrealloc(t->docs, docs_cap * sizeof(uint32_t));
            }
            t->docs[ndocs_used++] = idx;
            s = e;
        }
        if (ndocs_used == start) {
            continue;
        }
        if (t->nreq + 1 >= reqs_cap) {
            reqs_cap *= 2;
            t->req_off = lkv_xrealloc(t->req_off, reqs_cap * sizeof(uint64_t));
        }
        t->req_off[t->nreq++] = start;
    }
    if (t->nreq == 0) {
        snprintf(err, (size_t)errlen, "%s: no requests", path);
        rc = LKV_EINVAL;
        goto out;
    }
    t->req_off[t->nreq] = ndocs_used;
    t->ndocs = m.n;
    for (uint32_t i = 0; i < m.n; i++) {
        if (t->doc_tokens[i] == 0) {
            t->doc_tokens[i] = default_tokens;
        }
    }
out:
    free(line);
    free(m.keys);
    free(m.vals);
    fclose(f);
    if (rc != 0) {
        lkv_sim_trace_free(t);
    }
    return rc;
}

/* ---- simulation ---- */

typedef struct idlist {
    uint64_t *v; /* Ids, owned. */
    uint32_t n;  /* Used. */
    uint32_t cap;
} idlist;

static void idlist_push(idlist *l, uint64_t id)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = lkv_xrealloc(l->v, (size_t)l->cap * sizeof(uint64_t));
    }
    l->v[l->n++] = id;
}

typedef struct slot {
    idlist unpin;  /* Ids pinned by the request, unpinned when it leaves flight. */
    idlist remove; /* Ids (copies, request KV) removed when it leaves flight. */
} slot;

typedef struct sim {
    const lkv_sim_trace *t;
    const lkv_sim_cfg *c;
    lkv_policy *p;
    slot *slots;        /* [inflight] */
    uint64_t copy_next; /* Copy id counter. */
    lkv_sim_result *r;
    uint64_t *keys;     /* Scratch: block keys of the current prompt (prefix). */
    uint64_t scratch_n; /* Scratch capacity. */
    /* Residency events (agnostic model; NULL arrays when the trace has none). */
    uint64_t *cls;      /* [ndocs] class id given at the next admission. */
    int8_t *prio;       /* [ndocs] priority given at the next admission. */
    uint64_t *ttl;      /* [ndocs] TTL in requests from the next admission, 0 = none. */
    uint8_t *want_hold; /* [ndocs] 1: hold the document while cached. */
    uint64_t evi;       /* Next event to apply. */
    int has_ttl;        /* 1: sweep expired documents before each request. */
} sim;

static inline uint64_t doc_bytes(const sim *s, uint32_t d)
{
    uint64_t bt = s->c->block_tokens;
    uint64_t blocks = (s->t->doc_tokens[d] + bt - 1) / bt;
    return blocks * bt * s->c->bytes_per_token;
}

static inline double cost_of(const sim *s, uint64_t bytes)
{
    return s->c->cost_bytes ? (double)bytes : 1.0;
}

static void retire(sim *s, slot *sl)
{
    for (uint32_t i = sl->unpin.n; i-- > 0;) { /* Reverse: the first use ends most recent. */
        int rc = lkv_policy_unpin(s->p, sl->unpin.v[i]);
        assert(rc == 0);
        (void)rc;
    }
    for (uint32_t i = 0; i < sl->remove.n; i++) {
        int rc = lkv_policy_remove(s->p, sl->remove.v[i]);
        assert(rc == 0);
        (void)rc;
    }
    sl->unpin.n = sl->remove.n = 0;
}

static void pin_in_flight(sim *s, slot *sl, uint64_t key)
{
    if (lkv_policy_pin(s->p, key) == 0) {
        idlist_push(&sl->unpin, key);
    }
}

/* Looks key up; on a miss admits it if the policy wants it. Returns 1 on a hit. */
static int lookup_admit(sim *s, uint64_t key, uint64_t bytes)
{
    lkv_policy_record(s->p, key);
    if (lkv_policy_touch(s->p, key) == 0) {
        return 1;
    }
    double cost = cost_of(s, bytes);
    if (lkv_policy_would_admit(s->p, key, bytes, cost)) {
        (void)lkv_policy_admit(s->p, key, bytes, cost, NULL, NULL); /* ENOSPC: not cached. */
    }
    return 0;
}

/* lookup_admit for a document under residency events: admits with its attributes, holds. */
static int lookup_admit_doc(sim *s, uint32_t d, uint64_t bytes, uint64_t q)
{
    if (s->cls == NULL) {
        return lookup_admit(s, d, bytes);
    }
    lkv_policy_record(s->p, d);
    if (lkv_policy_touch(s->p, d) == 0) {
        return 1;
    }
    double cost = cost_of(s, bytes);
    if (lkv_policy_would_admit(s->p, d, bytes, cost)) {
        lkv_policy_attrs a = {s->cls[d], s->prio[d], s->ttl[d] ? q + s->ttl[d] : 0};
        if (lkv_policy_admit_ex(s->p, d, bytes, cost, &a, NULL, NULL) == 0 && s->want_hold[d]) {
            int rc = lkv_policy_hold(s->p, d, 1);
            assert(rc == 0);
            (void)rc;
        }
    }
    return 0;
}

/* Applies the trace's residency events due before request q (agnostic model). */
static void apply_events(sim *s, uint64_t q)
{
    const lkv_sim_trace *t = s->t;
    if (s->has_ttl) {
        uint64_t n = 0;
        (void)lkv_policy_expire(s->p, q, NULL, NULL, &n);
        s->r->bulk += n;
    }
    for (; s->evi < t->nev && t->ev[s->evi].before <= q; s->evi++) {
        const lkv_sim_event *e = &t->ev[s->evi];
        uint64_t n = 0;
        switch (e->op) {
        case LKV_SIM_EV_HOLD:
        case LKV_SIM_EV_RELEASE:
            s->want_hold[e->doc] = e->op == LKV_SIM_EV_HOLD;
            (void)lkv_policy_hold(s->p, e->doc, e->op == LKV_SIM_EV_HOLD); /* ENOTFOUND: later. */
            break;
        case LKV_SIM_EV_CLASS:
            s->cls[e->doc] = (uint64_t)e->arg;
            break;
        case LKV_SIM_EV_PRIO:
            s->prio[e->doc] = (int8_t)e->arg;
            break;
        case LKV_SIM_EV_TTL:
            s->ttl[e->doc] = (uint64_t)e->arg;
            break;
        case LKV_SIM_EV_HOLD_CLASS:
        case LKV_SIM_EV_RELEASE_CLASS:
            (void)lkv_policy_hold_class(s->p, (uint64_t)e->arg, UINT64_MAX,
                                        e->op == LKV_SIM_EV_HOLD_CLASS);
            break;
        case LKV_SIM_EV_EVICT_CLASS:
            (void)lkv_policy_evict_class(s->p, (uint64_t)e->arg, UINT64_MAX, NULL, NULL, &n);
            s->r->bulk += n;
            break;
        default:
            break;
        }
    }
}

static void count_doc(sim *s, int counted, uint32_t tokens, uint32_t hit_tokens)
{
    if (!counted) {
        return;
    }
    s->r->docs++;
    s->r->tokens += tokens;
    s->r->hit_tokens += hit_tokens;
    s->r->doc_hits += hit_tokens == tokens;
}

static void run_docs(sim *s, uint64_t q, slot *sl, int counted)
{
    const lkv_sim_trace *t = s->t;
    uint64_t off = 0;
    for (uint64_t i = t->req_off[q]; i < t->req_off[q + 1]; i++) {
        uint32_t d = t->docs[i];
        uint32_t len = t->doc_tokens[d];
        uint64_t bytes = doc_bytes(s, d);
        int hit;
        switch (s->c->model) {
        case LKV_SIM_EXACT: {
            uint64_t key = ((off & ((1ull << 30) - 1)) << 32) | d;
            hit = lookup_admit(s, key, bytes);
            pin_in_flight(s, sl, key);
            break;
        }
        case LKV_SIM_COPY:
            lkv_policy_record(s->p, d);
            if (lkv_policy_touch(s->p, d) == 0) {
                /* The source must survive making room for its own copy. */
                int rc = lkv_policy_pin(s->p, d);
                assert(rc == 0);
                uint64_t cid = COPY_BIT | s->copy_next++;
                rc = lkv_policy_admit(s->p, cid, bytes, 0, NULL, NULL);
                if (rc == 0) {
                    rc = lkv_policy_pin(s->p, cid);
                    assert(rc == 0);
                    idlist_push(&sl->remove, cid);
                    hit = 1;
                } else {
                    s->r->dropped += counted;
                    hit = 0;
                }
                rc = lkv_policy_unpin(s->p, d);
                assert(rc == 0);
                (void)rc;
            } else {
                double cost = cost_of(s, bytes);
                if (lkv_policy_would_admit(s->p, d, bytes, cost)) {
                    (void)lkv_policy_admit(s->p, d, bytes, cost, NULL, NULL);
                }
                pin_in_flight(s, sl, d);
                hit = 0;
            }
            break;
        case LKV_SIM_ORACLE:
            hit = lkv_policy_contains(s->p, d);
            break;
        case LKV_SIM_AGNOSTIC:
        default:
            hit = lookup_admit_doc(s, d, bytes, q);
            pin_in_flight(s, sl, d);
            break;
        }
        count_doc(s, counted, len, hit ? len : 0);
        off += len;
    }
}

static void run_prefix(sim *s, uint64_t q, slot *sl, int counted)
{
    const lkv_sim_trace *t = s->t;
    const uint64_t bt = s->c->block_tokens;
    const uint64_t *off = t->req_off;
    uint64_t total = 0;
    for (uint64_t i = off[q]; i < off[q + 1]; i++) {
        total += t->doc_tokens[t->docs[i]];
    }
    uint64_t nb = total / bt; /* Full blocks of document tokens only. */
    if (nb > s->scratch_n) {
        s->scratch_n = nb * 2;
        s->keys = lkv_xrealloc(s->keys, s->scratch_n * sizeof(uint64_t));
    }
    uint64_t bytes = bt * s->c->bytes_per_token;
    double cost = cost_of(s, bytes);
    /* Pass 1: the hash chain and the longest cached prefix; hit blocks are in use (pinned)
     * from here until the request leaves flight. */
    uint64_t chain = 0x6c617a796b76ull, j = off[q], o = 0, hit_blocks = 0;
    int hitting = 1;
    for (uint64_t b = 0; b < nb; b++) {
        uint64_t h = chain, rem = bt;
        while (rem > 0) {
            uint32_t d = t->docs[j];
            uint64_t n = t->doc_tokens[d] - o;
            n = n < rem ? n : rem;
            h = mix64(h ^ mix64(((uint64_t)d << 32) | o));
            o += n;
            rem -= n;
            if (o == t->doc_tokens[d]) {
                j++;
                o = 0;
            }
        }
        chain = h;
        s->keys[b] = h & KEY_MASK;
        lkv_policy_record(s->p, s->keys[b]);
        hitting = hitting && lkv_policy_touch(s->p, s->keys[b]) == 0;
        if (hitting) {
            hit_blocks++;
            pin_in_flight(s, sl, s->keys[b]);
        }
    }
    /* Pass 2: admit the missed blocks last first, then pin them first to last. Retiring unpins
     * in reverse, so block 0 ends most recent and a chain is evicted from its tail (vLLM frees
     * a request's blocks in reverse order for the same reason). */
    for (uint64_t b = nb; b-- > hit_blocks;) {
        if (lkv_policy_touch(s->p, s->keys[b]) != 0 &&
            lkv_policy_would_admit(s->p, s->keys[b], bytes, cost)) {
            (void)lkv_policy_admit(s->p, s->keys[b], bytes, cost, NULL, NULL);
        }
    }
    for (uint64_t b = hit_blocks; b < nb; b++) {
        pin_in_flight(s, sl, s->keys[b]);
    }
    /* Per document: tokens inside the hit prefix. */
    uint64_t hit_tokens = hit_blocks * bt, pos = 0;
    for (uint64_t i = off[q]; i < off[q + 1]; i++) {
        uint32_t len = t->doc_tokens[t->docs[i]];
        uint64_t h = hit_tokens > pos ? hit_tokens - pos : 0;
        count_doc(s, counted, len, (uint32_t)(h < len ? h : len));
        pos += len;
    }
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Oracle: pins the most used documents of the whole trace, greedily, into the budget less
 * room for the request KV of a shared budget. */
static void oracle_fill(sim *s)
{
    const lkv_sim_trace *t = s->t;
    uint64_t *key = lkv_xcalloc(t->ndocs, sizeof(uint64_t));
    for (uint64_t i = 0; i < t->req_off[t->nreq]; i++) {
        key[t->docs[i]] += 1ull << 32;
    }
    for (uint32_t d = 0; d < t->ndocs; d++) {
        key[d] |= UINT32_MAX - d; /* Ties: lower index first. */
    }
    qsort(key, t->ndocs, sizeof(uint64_t), cmp_desc);
    uint64_t reserve = 0;
    if (s->c->shared) {
        uint64_t bt = s->c->block_tokens;
        uint64_t tok = s->c->question_tokens + s->c->output_tokens;
        reserve = (tok + bt - 1) / bt * bt * s->c->bytes_per_token * s->c->inflight;
    }
    uint64_t budget = lkv_policy_budget(s->p), room = budget > reserve ? budget - reserve : 0;
    for (uint32_t i = 0; i < t->ndocs && (key[i] >> 32) > 0; i++) {
        uint32_t d = UINT32_MAX - (uint32_t)key[i];
        uint64_t bytes = doc_bytes(s, d);
        if (bytes <= room && lkv_policy_admit(s->p, d, bytes, 1, NULL, NULL) == 0) {
            (void)lkv_policy_pin(s->p, d);
            room -= bytes;
        }
    }
    free(key);
}

/* ---- Belady (size-aware heuristic with bypass; see lkv_sim.h) ---- */

#define NEVER   UINT64_MAX
#define BEL_NIL UINT32_MAX

typedef struct bel {
    const sim *s;
    uint64_t *key;      /* [ndocs] next use (index into docs) of each document, NEVER if none. */
    uint32_t *pins;     /* [ndocs] in-flight uses. */
    uint8_t *res;       /* [ndocs] 1 if cached. */
    uint32_t *hpos;     /* [ndocs] position in its size class's heap, BEL_NIL if not there. */
    uint32_t *heap[64]; /* Per size class (floor(log2(bytes))): max-heap on key. */
    uint32_t hlen[64];
    uint32_t hcap[64];
    uint32_t *taken;     /* Scratch: victims taken out while deciding an admission. */
    uint64_t ntaken_cap; /* Its capacity. */
} bel;

static inline int bel_cls(const bel *b, uint32_t d)
{
    uint64_t x = doc_bytes(b->s, d);
    return 63 - __builtin_clzll(x | 1);
}

static inline int bel_above(const bel *b, uint32_t x, uint32_t y)
{
    return b->key[x] > b->key[y] || (b->key[x] == b->key[y] && x < y);
}

static void bel_sift(bel *b, int c, uint32_t pos)
{
    uint32_t *h = b->heap[c], n = b->hlen[c], d = h[pos];
    while (pos > 0 && bel_above(b, d, h[(pos - 1) / 2])) {
        h[pos] = h[(pos - 1) / 2];
        b->hpos[h[pos]] = pos;
        pos = (pos - 1) / 2;
    }
    for (;;) {
        uint32_t ch = 2 * pos + 1;
        if (ch >= n) {
            break;
        }
        if (ch + 1 < n && bel_above(b, h[ch + 1], h[ch])) {
            ch++;
        }
        if (!bel_above(b, h[ch], d)) {
            break;
        }
        h[pos] = h[ch];
        b->hpos[h[pos]] = pos;
        pos = ch;
    }
    h[pos] = d;
    b->hpos[d] = pos;
}

static void bel_push(bel *b, uint32_t d)
{
    int c = bel_cls(b, d);
    if (b->hlen[c] == b->hcap[c]) {
        b->hcap[c] = b->hcap[c] ? b->hcap[c] * 2 : 64;
        b->heap[c] = lkv_xrealloc(b->heap[c], (size_t)b->hcap[c] * sizeof(uint32_t));
    }
    b->heap[c][b->hlen[c]++] = d;
    bel_sift(b, c, b->hlen[c] - 1);
}

static void bel_erase(bel *b, uint32_t d)
{
    int c = bel_cls(b, d);
    uint32_t pos = b->hpos[d];
    assert(pos != BEL_NIL && b->heap[c][pos] == d);
    b->hpos[d] = BEL_NIL;
    uint32_t last = b->heap[c][--b->hlen[c]];
    if (last != d) {
        b->heap[c][pos] = last;
        b->hpos[last] = pos;
        bel_sift(b, c, pos);
    }
}

/* Eviction score at use index now: time to next use x size / cost (INFINITY: never used). */
static double bel_score(const bel *b, uint32_t d, uint64_t key, uint64_t now)
{
    if (key == NEVER) {
        return INFINITY;
    }
    uint64_t bytes = doc_bytes(b->s, d);
    return (double)(key - now) * (double)bytes / cost_of(b->s, bytes);
}

/* The unpinned cached document with the largest score, or BEL_NIL. */
static uint32_t bel_victim(const bel *b, uint64_t now)
{
    uint32_t best = BEL_NIL;
    double bs = -1;
    for (int c = 0; c < 64; c++) {
        if (b->hlen[c] > 0) {
            uint32_t d = b->heap[c][0];
            double sc = bel_score(b, d, b->key[d], now);
            if (sc > bs) {
                bs = sc;
                best = d;
            }
        }
    }
    return best;
}

static void run_belady(sim *s)
{
    const lkv_sim_trace *t = s->t;
    const lkv_sim_cfg *c = s->c;
    uint64_t nuse = t->req_off[t->nreq];
    uint64_t *nxt = lkv_xmalloc((nuse + 1) * sizeof(uint64_t));
    bel b = {.s = s};
    b.key = lkv_xmalloc((size_t)t->ndocs * sizeof(uint64_t));
    b.pins = lkv_xcalloc(t->ndocs, sizeof(uint32_t));
    b.res = lkv_xcalloc(t->ndocs, 1);
    b.hpos = lkv_xmalloc((size_t)t->ndocs * sizeof(uint32_t));
    for (uint32_t d = 0; d < t->ndocs; d++) {
        b.key[d] = NEVER;
        b.hpos[d] = BEL_NIL;
    }
    for (uint64_t i = nuse; i-- > 0;) { /* key[] is "last seen" here: the next use of i. */
        nxt[i] = b.key[t->docs[i]];
        b.key[t->docs[i]] = i;
    }
    uint64_t reserve = 0;
    if (c->shared) {
        uint64_t bt = c->block_tokens;
        uint64_t tok = c->question_tokens + c->output_tokens;
        reserve = (tok + bt - 1) / bt * bt * c->bytes_per_token * c->inflight;
    }
    uint64_t budget = c->budget > reserve ? c->budget - reserve : 0, used = 0, pinned = 0;
    for (uint64_t q = 0; q < t->nreq; q++) {
        slot *sl = &s->slots[q % c->inflight];
        for (uint32_t k = 0; k < sl->unpin.n; k++) {
            uint32_t d = (uint32_t)sl->unpin.v[k];
            if (--b.pins[d] == 0) {
                pinned -= doc_bytes(s, d);
                bel_push(&b, d);
            }
        }
        sl->unpin.n = 0;
        int counted = q >= c->warmup;
        s->r->requests += (uint64_t)counted;
        for (uint64_t i = t->req_off[q]; i < t->req_off[q + 1]; i++) {
            uint32_t d = t->docs[i];
            uint64_t bytes = doc_bytes(s, d);
            int hit = b.res[d];
            if (hit && b.pins[d] == 0) {
                bel_erase(&b, d);
            }
            b.key[d] = nxt[i];
            if (!hit && bytes <= budget - pinned) {
                /* Take victims, largest score first, while each scores above d; if they free
                 * enough, d is cached and they go, else they are put back (bypass). */
                int admit = budget - used >= bytes;
                uint64_t freed = budget - used, np = 0;
                double sd = bel_score(&b, d, nxt[i], i);
                while (!admit && nxt[i] != NEVER) {
                    uint32_t v = bel_victim(&b, i);
                    if (v == BEL_NIL || !(bel_score(&b, v, b.key[v], i) > sd)) {
                        break;
                    }
                    bel_erase(&b, v);
                    if (np == b.ntaken_cap) {
                        b.ntaken_cap = b.ntaken_cap ? 2 * b.ntaken_cap : 64;
                        b.taken = lkv_xrealloc(b.taken, b.ntaken_cap * sizeof(uint32_t));
                    }
                    b.taken[np++] = v;
                    freed += doc_bytes(s, v);
                    admit = freed >= bytes;
                }
                for (uint64_t k = 0; k < np; k++) {
                    uint32_t v = b.taken[k];
                    if (admit) {
                        b.res[v] = 0;
                        used -= doc_bytes(s, v);
                        s->r->evictions++;
                    } else {
                        bel_push(&b, v);
                    }
                }
                if (admit) {
                    b.res[d] = 1;
                    used += bytes;
                }
            }
            if (b.res[d]) {
                if (b.pins[d]++ == 0) {
                    pinned += bytes;
                }
                idlist_push(&sl->unpin, d);
            }
            uint32_t len = t->doc_tokens[d];
            count_doc(s, counted, len, hit ? len : 0);
        }
    }
    for (int k = 0; k < 64; k++) {
        free(b.heap[k]);
    }
    free(b.taken);
    free(b.key);
    free(b.pins);
    free(b.res);
    free(b.hpos);
    free(nxt);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int lkv_sim_run(const lkv_sim_trace *t, const lkv_sim_cfg *c, lkv_sim_result *r)
{
    if (t == NULL || c == NULL || r == NULL || c->model < 0 || c->model >= LKV_SIM__COUNT ||
        c->inflight == 0 || c->block_tokens == 0 || c->bytes_per_token == 0) {
        return LKV_EINVAL;
    }
    memset(r, 0, sizeof(*r));
    sim s = {.t = t, .c = c, .r = r};
    int rc = lkv_policy_create(c->policy, c->budget, &s.p);
    if (rc != 0) {
        return rc;
    }
    /* Sketch sized for the keys the model can produce. */
    uint64_t keys = t->ndocs;
    if (c->model == LKV_SIM_EXACT) {
        keys *= 8;
    } else if (c->model == LKV_SIM_PREFIX) {
        keys = 1u << 20;
    }
    (void)lkv_policy_sketch_size(s.p, keys);
    s.slots = lkv_xcalloc(c->inflight, sizeof(slot));
    if (t->nev > 0 && c->model == LKV_SIM_AGNOSTIC) {
        s.cls = lkv_xcalloc(t->ndocs, sizeof(uint64_t));
        s.prio = lkv_xcalloc(t->ndocs, sizeof(int8_t));
        s.ttl = lkv_xcalloc(t->ndocs, sizeof(uint64_t));
        s.want_hold = lkv_xcalloc(t->ndocs, 1);
        for (uint64_t i = 0; i < t->nev; i++) {
            s.has_ttl |= t->ev[i].op == LKV_SIM_EV_TTL;
        }
    }
    double t0 = now_s();
    if (c->model == LKV_SIM_ORACLE) {
        oracle_fill(&s);
    }
    for (uint64_t q = 0; q < t->nreq && c->model != LKV_SIM_BELADY; q++) {
        slot *sl = &s.slots[q % c->inflight];
        retire(&s, sl);
        if (s.cls != NULL) {
            apply_events(&s, q);
        }
        int counted = q >= c->warmup;
        r->requests += (uint64_t)counted;
        if (c->shared) {
            uint64_t bt = c->block_tokens;
            uint64_t tok = c->question_tokens + c->output_tokens;
            uint64_t bytes = (tok + bt - 1) / bt * bt * c->bytes_per_token;
            uint64_t id = REQ_BIT | q;
            if (bytes > 0 && lkv_policy_admit(s.p, id, bytes, 0, NULL, NULL) == 0) {
                (void)lkv_policy_pin(s.p, id);
                idlist_push(&sl->remove, id);
            }
        }
        if (c->model == LKV_SIM_PREFIX) {
            run_prefix(&s, q, sl, counted);
        } else {
            run_docs(&s, q, sl, counted);
        }
    }
    if (c->model == LKV_SIM_BELADY) {
        run_belady(&s);
    } else {
        r->evictions = lkv_policy_evictions(s.p);
        r->window = lkv_policy_window(s.p);
    }
    r->seconds = now_s() - t0;
    for (uint32_t i = 0; i < c->inflight; i++) {
        free(s.slots[i].unpin.v);
        free(s.slots[i].remove.v);
    }
    free(s.slots);
    free(s.keys);
    free(s.cls);
    free(s.prio);
    free(s.ttl);
    free(s.want_hold);
    lkv_policy_destroy(s.p);
    return 0;
}

int lkv_sim_model_parse(const char *name, int *model)
{
    for (int m = 0; m < LKV_SIM__COUNT; m++) {
        if (strcmp(name, model_names[m]) == 0) {
            *model = m;
            return 0;
        }
    }
    return LKV_EINVAL;
}

const char *lkv_sim_model_name(int model)
{
    return model >= 0 && model < LKV_SIM__COUNT ? model_names[model] : "unknown";
}

/* ---- the paper's analytic model ---- */

int lkv_sim_static_topc(uint64_t d, uint64_t c, double alpha, uint32_t ndocs, uint64_t draws,
                        uint64_t seed, double *hit_agnostic, double *hit_aware)
{
    if (d == 0 || c == 0 || c > ndocs || draws == 0) {
        return LKV_EINVAL;
    }
    lkv_policy *ag, *aw;
    int rc = lkv_policy_create(LKV_POLICY_LRU, c, &ag);
    if (rc != 0) {
        return rc;
    }
    rc = lkv_policy_create(LKV_POLICY_LRU, c, &aw);
    if (rc != 0) {
        lkv_policy_destroy(ag);
        return rc;
    }
    for (uint64_t i = 0; i < c; i++) {
        (void)lkv_policy_admit(ag, i, 1, 1, NULL, NULL);
        (void)lkv_policy_pin(ag, i);
    }
    for (uint64_t i = 0; i < c / d; i++) {
        for (uint64_t pos = 0; pos < d; pos++) {
            (void)lkv_policy_admit(aw, i * d + pos, 1, 1, NULL, NULL);
            (void)lkv_policy_pin(aw, i * d + pos);
        }
    }
    zipf z;
    zipf_init(&z, ndocs, alpha);
    rng r = {seed};
    uint64_t h1 = 0, h2 = 0;
    for (uint64_t i = 0; i < draws; i++) {
        uint64_t doc = zipf_draw(&z, &r);
        uint64_t pos = rng_next(&r) % d;
        h1 += (uint64_t)lkv_policy_contains(ag, doc);
        h2 += (uint64_t)lkv_policy_contains(aw, doc * d + pos);
    }
    *hit_agnostic = (double)h1 / (double)draws;
    *hit_aware = (double)h2 / (double)draws;
    free(z.cdf);
    lkv_policy_destroy(ag);
    lkv_policy_destroy(aw);
    return 0;
}

int lkv_sim_dynamic_topc(uint64_t d, uint64_t c, double alpha, uint32_t ndocs, uint64_t draws,
                         uint64_t seed, int kind, double *hit_agnostic, double *hit_aware)
{
    if (d == 0 || c == 0 || draws == 0 || ndocs == 0) {
        return LKV_EINVAL;
    }
    lkv_policy *ag, *aw;
    int rc = lkv_policy_create(kind, c, &ag);
    if (rc != 0) {
        return rc;
    }
    rc = lkv_policy_create(kind, c, &aw);
    if (rc != 0) {
        lkv_policy_destroy(ag);
        return rc;
    }
    (void)lkv_policy_sketch_size(ag, ndocs);
    (void)lkv_policy_sketch_size(aw, (uint64_t)ndocs * d);
    zipf z;
    zipf_init(&z, ndocs, alpha);
    rng r = {seed};
    uint64_t h1 = 0, h2 = 0;
    lkv_policy *ps[2] = {ag, aw};
    for (uint64_t i = 0; i < draws; i++) {
        uint64_t doc = zipf_draw(&z, &r);
        uint64_t pos = rng_next(&r) % d;
        uint64_t key[2] = {doc, doc * d + pos};
        for (int m = 0; m < 2; m++) {
            lkv_policy_record(ps[m], key[m]);
            if (lkv_policy_touch(ps[m], key[m]) == 0) {
                if (m == 0) {
                    h1++;
                } else {
                    h2++;
                }
            } else if (lkv_policy_would_admit(ps[m], key[m], 1, 1)) {
                (void)lkv_policy_admit(ps[m], key[m], 1, 1, NULL, NULL);
            }
        }
    }
    *hit_agnostic = (double)h1 / (double)draws;
    *hit_aware = (double)h2 / (double)draws;
    free(z.cdf);
    lkv_policy_destroy(ag);
    lkv_policy_destroy(aw);
    return 0;
}
