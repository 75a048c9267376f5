/*
 * lkv_sim.h: trace-driven hit-rate simulator over the real eviction policy (storage/lkv_policy).
 *
 * A trace is a list of RAG requests, each an ordered list of documents (dense indices into a
 * pool with a token length each). A cache model decides what a lookup is keyed on and what
 * occupies the byte budget; every model drives lkv_policy, the code lazykvd runs, in-process and
 * metadata only (no arena, RocksDB, gRPC or GPU).
 *
 * Models (all under the same budget and trace):
 *   prefix    vLLM automatic prefix caching: the prompt (documents concatenated, then the
 *             question) is cut into block_tokens-token blocks keyed by a hash chain from
 *             position 0; a block hits only if every block before it hit. Only full blocks of
 *             document tokens are cached (a block with question tokens is unique).
 *   exact     position-aware, exact offset (CacheBlend / Prompt Cache): a document's KV is keyed
 *             by (document, token offset in the prompt); another offset is another copy.
 *   copy      position-aware, copy per use (Block-Attention in vLLM): stored once keyed by
 *             document, but every hit makes a rotated copy of the same size that is pinned in
 *             the budget while its request is in flight (inflight requests at a time); a hit
 *             whose copy cannot get room is served as a miss (recomputed).
 *   agnostic  lazykv / LazyAttention: stored once keyed by document, reused at any offset.
 *   oracle    a reference, not a cache: position-agnostic, holding from the start (pinned)
 *             the documents the whole trace uses most, greedily by use count until the budget
 *             is full (the static top-C optimum when requests are independent draws and
 *             documents are equal-sized). It ignores the policy.
 *   belady    a reference, not a cache: Belady's offline optimum, position-agnostic. On a miss
 *             it knows every document's next use; it caches the document unless that use is
 *             farther than its first victim's (bypass), and evicts the resident, unpinned
 *             document with the largest (time to next use) x size / cost. With equal sizes (or
 *             cost = bytes, a byte hit rate) that is farthest-next-use, the exact optimum with
 *             bypass for equal sizes; with variable sizes the optimum is NP-hard and this is a
 *             size-aware HEURISTIC (the largest score is searched among the farthest-next-use
 *             document of each power-of-two size class), not a proven bound. It ignores the
 *             policy and the residency events. O(log n) per use.
 * Document KV is right-padded to whole blocks (as LazyAttention stores it) in every model but
 * prefix, whose blocks span document boundaries.
 *
 * In use = pinned: KV an in-flight request uses (its documents, prefix blocks or copies) is
 * pinned until the request leaves flight (inflight requests at a time, the oldest leaves when
 * a new one arrives), as vLLM holds a running request's blocks. What cannot get room is
 * computed but not cached (queueing is not modelled).
 * Shared budget (optional): the budget is one GPU's KV memory, so each in-flight request also
 * holds its question + output tokens of KV.
 *
 * Metrics: block hit rate = document KV tokens served from cache / document KV tokens asked
 * for (equivalently 16-token blocks, up to padding); document hit rate = documents served
 * entirely from cache / documents asked for. Requests before warmup are run but not counted.
 */
#ifndef LKV_SIM_H
#define LKV_SIM_H

#include <stdint.h>

enum lkv_sim_model {
    LKV_SIM_PREFIX = 0,
    LKV_SIM_EXACT = 1,
    LKV_SIM_COPY = 2,
    LKV_SIM_AGNOSTIC = 3,
    LKV_SIM_ORACLE = 4,
    LKV_SIM_BELADY = 5,
    LKV_SIM__COUNT
};

enum lkv_sim_len {
    LKV_SIM_LEN_FIXED = 0,     /* Every document a tokens. */
    LKV_SIM_LEN_UNIFORM = 1,   /* Uniform integer in [a, b]. */
    LKV_SIM_LEN_LOGNORMAL = 2, /* Median a, sigma b, clamped to [16, max_tokens]. */
};

/* Residency events a trace file can carry (lines starting with '!', see README.md). */
enum lkv_sim_ev {
    LKV_SIM_EV_HOLD = 0,          /* Hold doc hot (now if cached, else from its admission). */
    LKV_SIM_EV_RELEASE = 1,       /* Release doc's hold. */
    LKV_SIM_EV_CLASS = 2,         /* doc's class id is arg (from its next admission). */
    LKV_SIM_EV_PRIO = 3,          /* doc's priority is arg (-1, 0, 1; from its next admission). */
    LKV_SIM_EV_TTL = 4,           /* doc expires arg requests after its next admission. */
    LKV_SIM_EV_HOLD_CLASS = 5,    /* Hold class arg (present and future documents). */
    LKV_SIM_EV_RELEASE_CLASS = 6, /* Release class arg. */
    LKV_SIM_EV_EVICT_CLASS = 7,   /* Evict every unpinned document of class arg. */
};

typedef struct lkv_sim_event {
    uint64_t before; /* Applied just before this request index. */
    int op;          /* enum lkv_sim_ev. */
    uint32_t doc;    /* Document index (document events). */
    int64_t arg;     /* Class id, priority or TTL. */
} lkv_sim_event;

/* A trace: requests of documents. All arrays are owned by the trace (lkv_sim_trace_free). */
typedef struct lkv_sim_trace {
    uint32_t ndocs;       /* Documents in the pool (dense indices 0..ndocs-1). */
    uint32_t *doc_tokens; /* [ndocs] token length of each document. */
    uint64_t nreq;        /* Requests. */
    uint64_t *req_off;    /* [nreq + 1] request r is docs[req_off[r] .. req_off[r+1]). */
    uint32_t *docs;       /* Document indices of all requests, in prompt order. */
    uint64_t nev;         /* Residency events (trace files only; 0 for synthetic traces). */
    lkv_sim_event *ev;    /* [nev] in order of before. */
} lkv_sim_trace;

/* A synthetic workload. */
typedef struct lkv_sim_gen {
    uint32_t ndocs;      /* Pool size. */
    int len_kind;        /* enum lkv_sim_len. */
    double len_a;        /* See enum lkv_sim_len. */
    double len_b;        /* See enum lkv_sim_len. */
    uint32_t max_tokens; /* Clamp for lognormal lengths. */
    uint32_t k;          /* Distinct documents a request (<= ndocs), in random order. */
    double alpha;        /* Zipf exponent over document rank; 0 = uniform. */
    uint64_t nreq;       /* Requests. */
    uint64_t seed;       /* RNG seed (lengths and draws). */
    /* Drift (all zero: stationary Zipf, the trace is exactly that of the fields above). */
    uint64_t shift_every; /* Every N requests, replace shift_frac of the hot set ... */
    double shift_frac;    /* ... by documents from outside it (their ranks swapped) ... */
    uint32_t shift_hot;   /* ... the hot set being the top shift_hot ranks (0: 100). */
    uint64_t burst_every; /* Every N requests a cold document becomes the most popular ... */
    uint64_t burst_len;   /* ... for burst_len requests (the others move one rank down). */
    double session_p;     /* Probability that a request follows up a live session ... */
    uint32_t sessions;    /* ... one of this many (0: 32), chosen uniformly ... */
    double session_reuse; /* ... reusing each of its previous request's documents with this
                           * probability; others (and new sessions) are drawn. */
    double mix;           /* Fraction of requests drawn from the stationary ranking instead,
                           * outside any session (0: none). */
} lkv_sim_gen;

/* One simulation's configuration. */
typedef struct lkv_sim_cfg {
    int model;                /* enum lkv_sim_model. */
    int policy;               /* enum lkv_policy_kind. */
    uint64_t budget;          /* Bytes (UINT64_MAX: no limit). */
    uint64_t bytes_per_token; /* KV bytes a token (Llama-3.1-8B bf16: 131072). */
    uint32_t block_tokens;    /* Page / prefix block size in tokens (16). */
    uint32_t inflight;        /* Requests in flight at once (>= 1). */
    int shared;               /* 1: question + output KV of in-flight requests counts too. */
    uint32_t question_tokens; /* Per request, after the documents. */
    uint32_t output_tokens;   /* Per request (shared budget only). */
    int cost_bytes;           /* gdsf cost: 1 = bytes (byte hit rate), 0 = 1 (doc hit rate). */
    uint64_t warmup;          /* Leading requests not counted. */
} lkv_sim_cfg;

typedef struct lkv_sim_result {
    uint64_t requests;   /* Requests counted. */
    uint64_t docs;       /* Document uses counted. */
    uint64_t doc_hits;   /* Uses served entirely from cache. */
    uint64_t tokens;     /* Document tokens counted. */
    uint64_t hit_tokens; /* Document tokens served from cache. */
    uint64_t evictions;  /* Victims chosen by the policy (whole run). */
    uint64_t dropped;    /* Copy-per-use hits downgraded to misses for lack of room. */
    uint64_t bulk;       /* Evicted by residency events (class eviction, expiry). */
    double window;       /* Adaptive policy: window share at the end (else 0). */
    double seconds;      /* Wall time of the run. */
} lkv_sim_result;

/* Fills *c with the defaults: agnostic, lru, 1 GiB, 131072 B/token, 16-token blocks, 1 in
 * flight, not shared, 32 question and 16 output tokens, cost 1, no warmup. */
void lkv_sim_cfg_default(lkv_sim_cfg *c);

/* Fills *g with the defaults used by the study (see bench/hitrate/README.md). */
void lkv_sim_gen_default(lkv_sim_gen *g);

/* Generates a trace from *g into *t (owned by the caller, freed with lkv_sim_trace_free).
 * LKV_EINVAL on a bad workload (k > ndocs, k == 0, ndocs == 0, bad lengths). */
int lkv_sim_trace_generate(const lkv_sim_gen *g, lkv_sim_trace *t);

/* Loads a trace file (one request a line: document ids separated by blanks or commas, each
 * optionally "id:tokens"; '#' starts a comment; blank lines are skipped). Ids are any strings
 * without blanks, commas or ':'; a document's length is its first given token count, else
 * default_tokens. On error returns LKV_EINVAL or LKV_EIO and writes a message naming the line
 * into err (errlen bytes). *t is owned by the caller. */
int lkv_sim_trace_load(const char *path, uint32_t default_tokens, lkv_sim_trace *t, char *err,
                       int errlen);

/* Writes *t to path in the format lkv_sim_trace_load reads: one request a line, document d
 * named "d<d>", its length given at its first use ("d<d>:<tokens>"), a '#' header line. Loading
 * the file gives the same requests (documents renumbered in order of first use, lengths and
 * reuse kept). Traces with residency events are refused (LKV_EINVAL). Returns 0, LKV_EINVAL or
 * LKV_EIO, with a message in err (errlen bytes). */
int lkv_sim_trace_write(const lkv_sim_trace *t, const char *path, char *err, int errlen);

void lkv_sim_trace_free(lkv_sim_trace *t);

/* Runs *c over *t and writes the counters into *r. LKV_EINVAL on a bad configuration. */
int lkv_sim_run(const lkv_sim_trace *t, const lkv_sim_cfg *c, lkv_sim_result *r);

/* Sets the drift fields of *g to a named workload: "zipf" (stationary, all drift off), "shift",
 * "burst", "session" or "mix" (half stationary, half shift + burst + session); see README.md.
 * LKV_EINVAL on an unknown name. */
int lkv_sim_workload(const char *name, lkv_sim_gen *g);

/* Parses "prefix", "exact", "copy", "agnostic", "oracle", "belady" into *model. */
int lkv_sim_model_parse(const char *name, int *model);
const char *lkv_sim_model_name(int model);

/* Zipf(alpha) mass of ranks 1..n, unnormalised: sum_{i<=n} i^-alpha. */
double lkv_sim_zipf_sum(uint64_t n, double alpha);

/* The paper's analytic capacity ratio: zipf_sum(C) / zipf_sum(floor(C/D)). */
double lkv_sim_capacity_ratio(uint64_t d, uint64_t c, double alpha);

/* Simulates the analytic model with the real policy: documents drawn Zipf(alpha) over ndocs,
 * each at one of d positions uniformly; a static cache of c entries pinned with the top c
 * documents (agnostic) or the top floor(c/d) documents at all d positions (aware). Writes
 * both hit rates; their ratio estimates lkv_sim_capacity_ratio. */
int lkv_sim_static_topc(uint64_t d, uint64_t c, double alpha, uint32_t ndocs, uint64_t draws,
                        uint64_t seed, double *hit_agnostic, double *hit_aware);

/* The same model with a dynamic policy (kind) of c equal-size entries instead of the static
 * top c: entries keyed by document (agnostic) or (document, position) (aware). */
int lkv_sim_dynamic_topc(uint64_t d, uint64_t c, double alpha, uint32_t ndocs, uint64_t draws,
                         uint64_t seed, int kind, double *hit_agnostic, double *hit_aware);

#endif
