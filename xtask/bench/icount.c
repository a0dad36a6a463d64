/*
 * icount: a QEMU TCG plugin that counts the guest instructions each vCPU
 * executes, for `cargo xtask bench --kernel K`.
 *
 * Wall time in a TCG guest swings 2-3x between two runs of the same loop
 * (docs/overhead.md), so ratios of it say little. The instructions a loop's
 * vCPU executes do not depend on the emulator's speed: the loop (loop.c)
 * marks the start and the end of its timed part with two marker
 * instructions, and at the end marker this plugin writes the instructions its
 * vCPU executed since the start marker (user and kernel, BPF programs and
 * trampolines included, interrupts too) to the file named by its `out=PATH`
 * argument, where the bench inside the guest reads it through the shared
 * target directory.
 *
 * The markers are 7-byte NOPs no compiler emits: `nopl 0x53474c50(%rax)` and
 * `nopl 0x45474c50(%rax)`,
 * bytes 0f 1f 80 50 4c 47 XX, XX = 'S' (start) or 'E' (end).
 *
 * Why the declarations below are written here: Debian's QEMU (7.2) is built
 * with plugin support (`-plugin`) but packages no qemu-plugin.h. These are
 * the few entry points this plugin uses, as QEMU 7.2 declares them (plugin
 * API version 1); newer QEMUs keep them (some deprecated from 9.0 on).
 *
 * Build: cc -O2 -shared -fPIC -o icount.so icount.c
 * Use:   qemu-system-x86_64 ... -plugin /path/icount.so,out=/path/count
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;

enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS };

typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);

#define EXPORT __attribute__((visibility("default")))

EXPORT int qemu_plugin_version = 1;

#define MAX_VCPUS 64

/* Single-threaded TCG (-accel tcg,thread=single) runs every vCPU on one host
 * thread, so plain counters are enough. */
static uint64_t executed[MAX_VCPUS];
static uint64_t started[MAX_VCPUS];
static const char *out_path;

static const unsigned char MARKER[6] = {0x0f, 0x1f, 0x80, 0x50, 0x4c, 0x47};

static void tb_executed(unsigned int vcpu, void *n_insns) {
    if (vcpu < MAX_VCPUS)
        executed[vcpu] += (uintptr_t)n_insns;
}

static void marker_executed(unsigned int vcpu, void *kind) {
    if (vcpu >= MAX_VCPUS)
        return;
    if ((uintptr_t)kind == 'S') {
        started[vcpu] = executed[vcpu];
        return;
    }
    char line[64];
    int len = snprintf(line, sizeof line, "%" PRIu64 " %u\n", executed[vcpu] - started[vcpu], vcpu);
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror("icount plugin: open");
        return;
    }
    if (write(fd, line, (size_t)len) != len)
        perror("icount plugin: write");
    close(fd);
}

static void tb_translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_cb(tb, tb_executed, QEMU_PLUGIN_CB_NO_REGS, (void *)(uintptr_t)n);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        const unsigned char *bytes = qemu_plugin_insn_data(insn);
        if (qemu_plugin_insn_size(insn) == 7 && memcmp(bytes, MARKER, sizeof MARKER) == 0 &&
            (bytes[6] == 'S' || bytes[6] == 'E'))
            qemu_plugin_register_vcpu_insn_exec_cb(insn, marker_executed, QEMU_PLUGIN_CB_NO_REGS,
                                                   (void *)(uintptr_t)bytes[6]);
    }
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "out=", 4) == 0)
            out_path = argv[i] + 4;
    if (out_path == NULL) {
        fprintf(stderr, "icount plugin: no out=PATH argument\n");
        return -1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_translated);
    return 0;
}
