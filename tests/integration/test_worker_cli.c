/*
 * test_worker_cli.c: integration.worker_cli. The lazykv-worker binary against a real lazykvd:
 * JSON-line requests from a file (good, repeated, and bad lines each answered in order with a
 * clear error, the binary going on to the next line), results as JSON lines (parsed back with
 * libjansson), the command-line form with text output, usage errors, and an unreachable daemon
 * with and without --local-fallback.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lkv_daemon_harness.h"
#include "lkv_it_util.h"
#include "lkv_test.h"

static lkv_daemon dm;

/* Runs cmd (a shell line), returns its exit status and stdout (malloc'ed, *out). */
static int run_cmd(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    ASSERT_TRUE(p != NULL);
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (len + 1 == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[len] = '\0';
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *REQUESTS =
    "# a comment, then a blank line\n"
    "\n"
    "{\"id\": \"a\", \"docs\": [\"Lily went to the park.\", {\"text\": \"Tom had a red ball.\"}], "
    "\"question\": \"One day,\", \"max_tokens\": 16, \"stop\": false}\n"
    "{\"id\": \"b\", \"docs\": [\"Lily went to the park.\", {\"text\": \"Tom had a red ball.\"}], "
    "\"question\": \"One day,\", \"max_tokens\": 16, \"stop\": false}\n"
    "{\"id\": \"c\", \"docs\": [{\"text\": \"Tom had a red ball.\"}, \"Lily went to the park.\"], "
    "\"question\": {\"tokens\": [403, 378]}, \"max_tokens\": 16, \"temperature\": 0.9, "
    "\"top_p\": 0.8, \"seed\": 7}\n"
    "this is not json\n"
    "{\"id\": \"e\", \"question\": \"x\", \"foo\": 1}\n"
    "{\"id\": \"f\", \"docs\": [\"\"], \"question\": \"x\"}\n"
    "{\"id\": \"g\", \"docs\": [{\"tokens\": [1, 2, 3]}], \"question\": \"x\", \"max_tokens\": "
    "600}\n"
    "{\"id\": \"h\", \"docs\": [{\"tokens\": [1, 2, 9999]}], \"question\": \"x\"}\n";

static json_t *line_json(char **cursor)
{
    char *nl = strchr(*cursor, '\n');
    ASSERT_TRUE(nl != NULL);
    *nl = '\0';
    json_error_t e;
    json_t *j = json_loads(*cursor, 0, &e);
    if (j == NULL) {
        LKV_FAIL("not a JSON line: %s", *cursor);
    }
    *cursor = nl + 1;
    return j;
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s != NULL ? s : "";
}

static void test_requests_file(void)
{
    char path[] = "/tmp/lkv-worker-req-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0 && write(fd, REQUESTS, strlen(REQUESTS)) == (ssize_t)strlen(REQUESTS));
    close(fd);
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s --daemon %s --json --stats --requests %s 2>%s.err",
             LKV_WORKER_BIN, dm.addr, path, path);
    int st = run_cmd(cmd, &out);
    fprintf(stderr, "%s", out);
    ASSERT_EQ(st, 1); /* some requests failed */
    char *cur = out;
    json_t *a = line_json(&cur), *b = line_json(&cur), *c = line_json(&cur);
    ASSERT_TRUE(strcmp(str(a, "id"), "a") == 0 && json_is_true(json_object_get(a, "ok")));
    ASSERT_EQ(json_integer_value(json_object_get(a, "miss_docs")), 2);
    ASSERT_EQ(json_array_size(json_object_get(a, "tokens")), 16);
    json_t *d0 = json_array_get(json_object_get(a, "docs"), 0);
    ASSERT_TRUE(strcmp(str(d0, "tier"), "absent") == 0);
    ASSERT_EQ(json_integer_value(json_object_get(d0, "stored")), 1);
    /* The same request again: both documents hit in the hot tier, same text. */
    ASSERT_EQ(json_integer_value(json_object_get(b, "hit_docs")), 2);
    ASSERT_TRUE(strcmp(str(json_array_get(json_object_get(b, "docs"), 1), "tier"), "hot") == 0);
    ASSERT_TRUE(strcmp(str(a, "text"), str(b, "text")) == 0);
    ASSERT_TRUE(json_integer_value(json_object_get(b, "zero_copy_blocks")) >= 2);
    /* Another order (and sampling): still both hits, documents at new positions. */
    ASSERT_TRUE(json_is_true(json_object_get(c, "ok")));
    ASSERT_EQ(json_integer_value(json_object_get(c, "hit_docs")), 2);
    ASSERT_TRUE(json_integer_value(
                    json_object_get(json_array_get(json_object_get(c, "docs"), 1), "start")) > 0);
    /* Bad lines: each answered, in order, with a clear error. */
    static const struct {
        const char *id, *code, *msg;
    } bad[] = {{"6", "LKV_EINVAL", "not valid JSON"},
               {"7", "LKV_EINVAL", "unknown key \"foo\""},
               {"f", "LKV_EINVAL", "docs[0] is empty"},
               {"g", "LKV_EINVAL", "maximum position"},
               {"h", "LKV_EINVAL", "outside the vocabulary"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *x = line_json(&cur);
        if (!json_is_false(json_object_get(x, "ok")) || strcmp(str(x, "code"), bad[i].code) != 0 ||
            strstr(str(x, "error"), bad[i].msg) == NULL) {
            LKV_FAIL("bad line %zu: want %s '%s', got %s", i, bad[i].code, bad[i].msg,
                     json_dumps(x, 0));
        }
        if (i < 2) {
            ASSERT_TRUE(strcmp(str(x, "id"), bad[i].id) == 0); /* the line number */
        }
        json_decref(x);
    }
    ASSERT_TRUE(*cur == '\0');
    /* --stats: the totals on stderr (5 lines reached the worker, 2 of them refused there; the
     * other 3 bad lines were refused by the parser). */
    char errpath[64], line[512] = "";
    snprintf(errpath, sizeof errpath, "%s.err", path);
    FILE *ef = fopen(errpath, "r");
    ASSERT_TRUE(ef != NULL && fgets(line, sizeof line, ef) != NULL);
    fclose(ef);
    unlink(errpath);
    fprintf(stderr, "%s", line);
    ASSERT_TRUE(strstr(line, "5 requests (2 failed)") != NULL);
    ASSERT_TRUE(strstr(line, "documents 4 hit / 6") != NULL);
    ASSERT_TRUE(strstr(line, "arena mapped 1 time(s)") != NULL);
    json_decref(a);
    json_decref(b);
    json_decref(c);
    free(out);
    unlink(path);
}

static void test_command_line(void)
{
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd,
             "%s --daemon %s --doc 'Lily went to the park.' --doc 'Sue had a cat.' "
             "--question 'One day,' --max-tokens 8",
             LKV_WORKER_BIN, dm.addr);
    ASSERT_EQ(run_cmd(cmd, &out), 0);
    fprintf(stderr, "%s", out);
    ASSERT_TRUE(strstr(out, "1/2 documents hit") != NULL); /* Lily's is cached already */
    ASSERT_TRUE(strstr(out, "doc 1: miss (absent)") != NULL);
    ASSERT_TRUE(strstr(out, "text: ") != NULL);
    free(out);
    /* Requests on standard input ("-"). */
    snprintf(cmd, sizeof cmd,
             "printf '%%s\\n' '{\"docs\": [\"Sue had a cat.\"], \"question\": \"One day,\", "
             "\"max_tokens\": 3}' | %s --daemon %s --requests - --json",
             LKV_WORKER_BIN, dm.addr);
    ASSERT_EQ(run_cmd(cmd, &out), 0);
    ASSERT_TRUE(strstr(out, "\"ok\":true") != NULL && strstr(out, "\"hit_docs\":1") != NULL);
    free(out);
    /* Usage errors: exit 2 with a message. */
    snprintf(cmd, sizeof cmd, "%s --doc x 2>&1", LKV_WORKER_BIN);
    ASSERT_EQ(run_cmd(cmd, &out), 2);
    ASSERT_TRUE(strstr(out, "--question") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --question x --model /nonexistent 2>&1", LKV_WORKER_BIN);
    ASSERT_EQ(run_cmd(cmd, &out), 2);
    ASSERT_TRUE(strstr(out, "/nonexistent") != NULL);
    free(out);
    /* Unreachable daemon: a clear error, or with --local-fallback a local answer. */
    snprintf(cmd, sizeof cmd,
             "%s --daemon 127.0.0.1:1 --deadline-ms 1500 --doc 'Lily went to the park.' "
             "--question 'One day,' --max-tokens 4",
             LKV_WORKER_BIN);
    ASSERT_EQ(run_cmd(cmd, &out), 1);
    ASSERT_TRUE(strstr(out, "unavailable") != NULL && strstr(out, "127.0.0.1:1") != NULL);
    free(out);
    char cmd2[1100];
    snprintf(cmd2, sizeof cmd2, "%s --local-fallback", cmd);
    ASSERT_EQ(run_cmd(cmd2, &out), 0);
    ASSERT_TRUE(strstr(out, "local fallback") != NULL);
    free(out);
}

int main(void)
{
    const char *args[] = {"--set", "hot_bytes=64MiB", NULL};
    lkv_daemon_init(&dm, args);
    lkv_it_start(&dm);
    LKV_RUN(test_requests_file);
    LKV_RUN(test_command_line);
    lkv_daemon_cleanup(&dm);
    return 0;
}
