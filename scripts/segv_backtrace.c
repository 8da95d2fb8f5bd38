/* A native backtrace on a fatal signal, for machines without gdb (scripts/aot_debug.py).
 * gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so scripts/segv_backtrace.c; LD_PRELOAD it.
 * Python's faulthandler prints the Python stack first, then re-raises into this handler. */
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fatal(int sig) {
    void *frames[64];
    const char head[] = "\n=== native backtrace (segv_backtrace.so) ===\n";
    write(2, head, sizeof head - 1);
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc's unwinder now, not inside the handler */
    signal(SIGSEGV, on_fatal);
    signal(SIGBUS, on_fatal);
    signal(SIGABRT, on_fatal);
    signal(SIGILL, on_fatal);
}
