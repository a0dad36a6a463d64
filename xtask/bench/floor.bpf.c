/* The bench's empty raw tracepoint program: what one hook on every syscall costs at
 * least, where the kernel runs raw tracepoint programs without the perf path of a
 * classic tracepoint. Built by `cargo xtask bench` (clang -target bpf) and attached to
 * `sys_enter` by xtask/src/bench/floor.rs. */
__attribute__((section("raw_tp/sys_enter"), used)) int floor_rawtp(void *ctx)
{
	return 0;
}

char LICENSE[] __attribute__((section("license"), used)) = "GPL";
