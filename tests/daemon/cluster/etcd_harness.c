/* etcd_harness.c: a real etcd for tests (see etcd_harness.h). */
#include "etcd_harness.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int lkv_etcd_available(void)
{
    return access("/usr/bin/etcd", X_OK) == 0 && access("/usr/bin/etcdctl", X_OK) == 0;
}

int lkv_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    int port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static int spawn(lkv_etcd *e)
{
    char cu[64], pu[64], ic[96], dd[300], logp[300];
    snprintf(cu, sizeof(cu), "http://127.0.0.1:%d", e->client_port);
    snprintf(pu, sizeof(pu), "http://127.0.0.1:%d", e->peer_port);
    snprintf(ic, sizeof(ic), "t=%s", pu);
    snprintf(dd, sizeof(dd), "%s/data", e->dir);
    snprintf(logp, sizeof(logp), "%s/etcd.log", e->dir);
    pid_t pid = fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        FILE *f = freopen(logp, "a", stderr);
        (void)f;
        f = freopen("/dev/null", "w", stdout);
        (void)f;
        execl("/usr/bin/etcd", "etcd", "--name", "t", "--data-dir", dd, "--listen-client-urls", cu,
              "--advertise-client-urls", cu, "--listen-peer-urls", pu,
              "--initial-advertise-peer-urls", pu, "--initial-cluster", ic, (char *)NULL);
        _exit(127);
    }
    e->pid = (int)pid;
    for (int i = 0; i < 200; i++) {
        char out[256];
        if (lkv_etcdctl(e, "endpoint health", out, sizeof(out)) == 0) {
            return 0;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "etcd did not come up (log: %s)\n", logp);
    return -1;
}

int lkv_etcd_start(lkv_etcd *e)
{
    memset(e, 0, sizeof(*e));
    snprintf(e->dir, sizeof(e->dir), "/tmp/lkv_etcd_XXXXXX");
    if (mkdtemp(e->dir) == NULL) {
        return -1;
    }
    e->client_port = lkv_free_port();
    e->peer_port = lkv_free_port();
    while (e->peer_port == e->client_port) {
        e->peer_port = lkv_free_port();
    }
    snprintf(e->endpoint, sizeof(e->endpoint), "127.0.0.1:%d", e->client_port);
    return spawn(e);
}

int lkv_etcd_restart(lkv_etcd *e)
{
    return spawn(e);
}

void lkv_etcd_stop(lkv_etcd *e, int sig)
{
    if (e->pid > 0) {
        kill(e->pid, sig);
        waitpid(e->pid, NULL, 0);
        e->pid = 0;
    }
}

void lkv_etcd_destroy(lkv_etcd *e)
{
    lkv_etcd_stop(e, SIGKILL);
    if (e->dir[0] != '\0') {
        char cmd[320];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->dir);
        int rc = system(cmd);
        (void)rc;
    }
}

int lkv_etcdctl(const lkv_etcd *e, const char *args, char *out, int len)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "ETCDCTL_API=3 /usr/bin/etcdctl --dial-timeout=1s --command-timeout=2s "
             "--endpoints %s %s 2>/dev/null",
             e->endpoint, args);
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return -1;
    }
    int n = (int)fread(out, 1, (size_t)(len - 1), p);
    out[n > 0 ? n : 0] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
