/*
 * plegwatch overhead loop: `loop MODE ITER` prints the mean ns per iteration.
 *
 *   unix   send() + recvfrom() of a 64-byte message on an AF_UNIX SOCK_DGRAM
 *          socketpair (syscalls sendto and recvfrom)
 *   unixrw write() + read() of 64 bytes on an AF_UNIX SOCK_STREAM socketpair:
 *          the ordinary unix-socket traffic (not D-Bus) every node is full of
 *   fsync  pwrite() of 64 bytes to a file in /dev/shm (tmpfs), then fsync()
 *
 * Built by `cargo xtask bench` with `cc -O2`. Only the loop itself is timed
 * (CLOCK_MONOTONIC), after a short warm-up.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

static double now_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        die("clock_gettime");
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s unix|unixrw|fsync ITER\n", argv[0]);
        return 2;
    }
    char *end = NULL;
    long iter = strtol(argv[2], &end, 10);
    if (*argv[2] == '\0' || *end != '\0' || iter <= 0) {
        fprintf(stderr, "loop: ITER must be a positive integer, got '%s'\n", argv[2]);
        return 2;
    }
    memset(buf, 'x', sizeof buf);

    int is_unix = strcmp(argv[1], "unix") == 0;
    int is_unixrw = strcmp(argv[1], "unixrw") == 0;
    int sv[2] = {-1, -1};
    int fd = -1;
    if (is_unix) {
        if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) != 0)
            die("socketpair");
    } else if (is_unixrw) {
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
            die("socketpair");
    } else if (strcmp(argv[1], "fsync") == 0) {
        char path[] = "/dev/shm/plegwatch-bench-XXXXXX";
        fd = mkstemp(path);
        if (fd < 0)
            die("mkstemp /dev/shm/plegwatch-bench-XXXXXX");
        unlink(path); /* the open fd keeps it alive; nothing is left behind */
    } else {
        fprintf(stderr, "loop: unknown mode '%s' (want unix, unixrw or fsync)\n", argv[1]);
        return 2;
    }

#define ONCE() (is_unix ? unix_once(sv) : is_unixrw ? unixrw_once(sv) : fsync_once(fd))
    for (long i = 0; i < WARMUP; i++)
        if (ONCE() != 0)
            die(argv[1]);

    double start = now_ns();
    for (long i = 0; i < iter; i++)
        if (ONCE() != 0)
            die(argv[1]);
    double elapsed = now_ns() - start;

    printf("%.1f\n", elapsed / (double)iter);
    return 0;
}
