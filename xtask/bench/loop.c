/*
 * plegwatch overhead loop: `loop MODE ITER` prints the mean ns per iteration.
 *
 *   unix   send() + recvfrom() of a 64-byte message on an AF_UNIX SOCK_DGRAM
 *          socketpair (syscalls sendto and recvfrom)
 *   unixrw write() + read() of 64 bytes on an AF_UNIX SOCK_STREAM socketpair:
 *          the ordinary unix-socket traffic (not D-Bus) every node is full of
 *   fsync  pwrite() of 64 bytes to a file in /dev/shm (tmpfs), then fsync()
 *   netlink an RTM_GETLINK request for `lo` on a NETLINK_ROUTE socket and its
 *          reply: one netlink request plegwatch tracks to its answer
 *
 * `loop childwait SECONDS` is no loop: it forks a child that stops itself
 * (SIGSTOP) and waits for it in waitpid(), a wait that never ends by itself;
 * a second child sends SIGCONT after SECONDS, so the wait ends then. It is
 * the staged wait whose flagging `cargo xtask bench` times.
 *
 * Built by `cargo xtask bench` with `cc -O2`. Only the loop itself is timed
 * (CLOCK_MONOTONIC), after a short warm-up. The timed part is also bracketed
 * by two marker NOPs (`nopl 0x53474c50(%rax)`, `nopl 0x45474c50(%rax)`): in a
 * guest run with the icount plugin (icount.c), the emulator counts the
 * instructions the loop's vCPU executed between them. With LOOP_CPU=N set,
 * the loop first pins itself to CPU N, so that one vCPU runs all of it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG 64
#define WARMUP 1000

static unsigned char buf[MSG];

static void die(const char *what) {
    fprintf(stderr, "loop: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int unix_once(const int sv[2]) {
    if (send(sv[0], buf, MSG, 0) != MSG)
        return -1;
    if (recvfrom(sv[1], buf, MSG, 0, NULL, NULL) != MSG)
        return -1;
    return 0;
}

static int unixrw_once(const int sv[2]) {
    if (write(sv[0], buf, MSG) != MSG)
        return -1;
    if (read(sv[1], buf, MSG) != MSG)
        return -1;
    return 0;
}

static int fsync_once(int fd) {
    if (pwrite(fd, buf, MSG, 0) != MSG)
        return -1;
    return fsync(fd);
}

static unsigned nl_seq;

static int netlink_once(int fd) {
    struct {
        struct nlmsghdr h;
        struct ifinfomsg i;
    } req;
    memset(&req, 0, sizeof req);
    req.h.nlmsg_len = sizeof req;
    req.h.nlmsg_type = RTM_GETLINK;
    req.h.nlmsg_flags = NLM_F_REQUEST;
    req.h.nlmsg_seq = ++nl_seq;
    req.i.ifi_family = AF_UNSPEC;
    req.i.ifi_index = 1; /* lo */
    if (send(fd, &req, sizeof req, 0) != (ssize_t)sizeof req)
        return -1;
    static char reply[16384];
    ssize_t n = recv(fd, reply, sizeof reply, 0);
    if (n < (ssize_t)sizeof(struct nlmsghdr))
        return -1;
    return ((struct nlmsghdr *)reply)->nlmsg_seq == nl_seq ? 0 : -1;
}

static int childwait(const char *arg) {
    char *end = NULL;
    long seconds = strtol(arg, &end, 10);
    if (*arg == '\0' || *end != '\0' || seconds <= 0) {
        fprintf(stderr, "loop: SECONDS must be a positive integer, got '%s'\n", arg);
        return 2;
    }
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        raise(SIGSTOP);
        _exit(0);
    }
    pid_t waker = fork();
    if (waker < 0)
        die("fork");
    if (waker == 0) {
        sleep((unsigned)seconds);
        kill(child, SIGCONT);
        _exit(0);
    }
    int status;
    if (waitpid(child, &status, 0) != child) /* no WUNTRACED: the stop does not end it */
        die("waitpid");
    waitpid(waker, &status, 0);
    return 0;
}

#if defined(__x86_64__)
#define MARK(kind) __asm__ volatile(".byte 0x0f, 0x1f, 0x80, 0x50, 0x4c, 0x47, " kind ::: "memory")
#else
#define MARK(kind) ((void)0)
#endif

static void pin_from_env(void) {
    const char *cpu = getenv("LOOP_CPU");
    if (cpu == NULL)
        return;
    char *end = NULL;
    long n = strtol(cpu, &end, 10);
    if (*cpu == '\0' || *end != '\0' || n < 0 || n >= CPU_SETSIZE) {
        fprintf(stderr, "loop: LOOP_CPU must be a CPU number, got '%s'\n", cpu);
        exit(2);
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)n, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        die("sched_setaffinity(LOOP_CPU)");
}

static double now_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        die("clock_gettime");
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s unix|unixrw|fsync|netlink ITER | childwait SECONDS\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "childwait") == 0)
        return childwait(argv[2]);
    char *end = NULL;
    long iter = strtol(argv[2], &end, 10);
    if (*argv[2] == '\0' || *end != '\0' || iter <= 0) {
        fprintf(stderr, "loop: ITER must be a positive integer, got '%s'\n", argv[2]);
        return 2;
    }
    memset(buf, 'x', sizeof buf);
    pin_from_env();

    int is_unix = strcmp(argv[1], "unix") == 0;
    int is_unixrw = strcmp(argv[1], "unixrw") == 0;
    int is_netlink = strcmp(argv[1], "netlink") == 0;
    int sv[2] = {-1, -1};
    int fd = -1;
    if (is_unix) {
        if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) != 0)
            die("socketpair");
    } else if (is_unixrw) {
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
            die("socketpair");
    } else if (is_netlink) {
        fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
        if (fd < 0)
            die("socket(AF_NETLINK)");
    } else if (strcmp(argv[1], "fsync") == 0) {
        char path[] = "/dev/shm/plegwatch-bench-XXXXXX";
        fd = mkstemp(path);
        if (fd < 0)
            die("mkstemp /dev/shm/plegwatch-bench-XXXXXX");
        unlink(path); /* the open fd keeps it alive; nothing is left behind */
    } else {
        fprintf(stderr, "loop: unknown mode '%s' (want unix, unixrw, fsync, netlink or childwait)\n", argv[1]);
        return 2;
    }

#define ONCE() (is_unix ? unix_once(sv) : is_unixrw ? unixrw_once(sv) : is_netlink ? netlink_once(fd) : fsync_once(fd))
    for (long i = 0; i < WARMUP; i++)
        if (ONCE() != 0)
            die(argv[1]);

    double start = now_ns();
    MARK("0x53"); /* 'S' */
    for (long i = 0; i < iter; i++)
        if (ONCE() != 0)
            die(argv[1]);
    MARK("0x45"); /* 'E' */
    double elapsed = now_ns() - start;

    printf("%.1f\n", elapsed / (double)iter);
    return 0;
}
