/* syscall_heavy: a workload that spends most of its time in the kernel.
 *
 *   main -> do_syscalls -> read(/dev/zero, 1 MiB)   (kernel zeroes the buffer)
 *
 * The read is issued with an inline `syscall` instruction from inside
 * do_syscalls, so do_syscalls is the innermost user frame of every kernel
 * stack. Through libc's read() wrapper (built without frame pointers) a
 * frame-pointer unwinder would skip do_syscalls.
 *
 * Usage: syscall_heavy [SECONDS]   (prints its pid first) */
#include <fcntl.h>
#include <sys/syscall.h>

#include "common.h"

#define CHUNK (1u << 20)

static char buffer[CHUNK];

static long raw_read(int fd, void *buf, unsigned long len)
{
#if defined(__x86_64__)
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"((long)SYS_read), "D"((long)fd), "S"(buf), "d"(len)
			 : "rcx", "r11", "memory");
	return ret;
#else
	return read(fd, buf, len);
#endif
}

__attribute__((noinline, noclone)) long do_syscalls(int fd, double deadline)
{
	long total = 0;
	KEEP_FRAME_POINTER();
	while (now_seconds() < deadline) {
		for (int k = 0; k < 8; k++) {
			long n = raw_read(fd, buffer, CHUNK);
			if (n < 0) {
				errno = (int)-n;
				perror("read /dev/zero");
				exit(1);
			}
			total += n;
		}
	}
	return total;
}

__attribute__((noinline)) int main(int argc, char **argv)
{
	double seconds = workload_seconds(argc, argv);
	int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		perror("open /dev/zero");
		return 1;
	}
	announce_pid();
	long total = do_syscalls(fd, now_seconds() + seconds);
	close(fd);
	return total > 0 ? 0 : 1;
}
