/* Fault guard: turns SIGBUS inside a guarded region (a read of a mapped file that was truncated under us) into an
 * error return. See qs_guard.h for the design; on Windows only the API's no-op shells are compiled. */
#include "qs_guard.h"

#include <stdlib.h>
#include <string.h>

#include "qs.h"
#include "qs_os.h"

#if QS_GUARD_ACTIVE
/* ---------------------------------------------------------------- POSIX: the SIGBUS handler */
#include <signal.h>
#include <unistd.h>

QS_TLS sigjmp_buf *qs_guard_jb;

static qs_mutex_t install_lock = QS_MUTEX_INIT;
static struct sigaction prev_act;          /* the handler we replaced: unguarded faults go there */
static volatile sig_atomic_t chaining;     /* an unguarded fault is on its way to prev_act */
static char fatal_msg[1024];               /* CLI mode: printed (and the process exits) on an unguarded fault */
static volatile sig_atomic_t fatal_len, fatal_status;

static void on_sigbus(int sig, siginfo_t *info, void *uc);

static void unguarded(int sig) {
    if (fatal_len > 0) {
        ssize_t w = write(2, fatal_msg, (size_t)fatal_len);
        (void)w;
        _exit(fatal_status);
    }
    if (!chaining) {
        /* Hand over to the previous handler: re-install it and re-raise (SIGBUS is not blocked here, SA_NODEFER),
         * so faulthandler prints its traceback, or the default action ends the process with SIGBUS. */
        chaining = 1;
        sigaction(sig, &prev_act, NULL);
    } else {
        /* The previous handler sent it back to us (it had us as its own predecessor): stop the loop. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, NULL);
    }
    raise(sig);
}

static void on_sigbus(int sig, siginfo_t *info, void *uc) {
    (void)info;
    (void)uc;
    sigjmp_buf *jb = qs_guard_jb;
    if (jb) siglongjmp(*jb, 1);
    unguarded(sig);
}

void qs_guard_install(void) {
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus) return;
    qs_mutex_lock(&install_lock);
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_sigbus;
    act.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&act.sa_mask);
    struct sigaction old;
    if (sigaction(SIGBUS, &act, &old) == 0 && !((old.sa_flags & SA_SIGINFO) && old.sa_sigaction == on_sigbus)) {
        prev_act = old;
        chaining = 0;
    }
    qs_mutex_unlock(&install_lock);
}

void qs_guard_rethrow(void) {
    sigjmp_buf *jb = qs_guard_jb;
    if (jb) siglongjmp(*jb, 1);
    raise(SIGBUS); /* no guard on this thread: behave as an unguarded fault would */
    abort();
}

void qs_guard_set_fatal_message(const char *msg, int status) {
    qs_guard_install();
    fatal_len = 0;
    if (!msg) return;
    size_t n = strlen(msg);
    if (n > sizeof fatal_msg) n = sizeof fatal_msg;
    memcpy(fatal_msg, msg, n);
    fatal_status = status;
    fatal_len = (sig_atomic_t)n;
}

static QS_TLS int last_fault;

void qs_guard_note_fault(void) { last_fault = 1; }

int qs_guard_last_fault(void) {
    int f = last_fault;
    last_fault = 0;
    return f;
}

#else
/* ---------------------------------------------------------------- Windows: no guard (qs_guard.h says why) */
void qs_guard_install(void) {}

void qs_guard_rethrow(void) { abort(); /* unreachable: no task is ever marked faulted */ }

void qs_guard_set_fatal_message(const char *msg, int status) {
    (void)msg;
    (void)status;
}

/* No fault is ever caught, so none is recorded: no thread-local either (MinGW's would need libgcc's emutls DLL). */
void qs_guard_note_fault(void) {}

int qs_guard_last_fault(void) { return 0; }
#endif

static int copy_bytes(uint8_t *dst, const uint8_t *src, int64_t n) {
    memcpy(dst, src, (size_t)n);
    return 0;
}

int qs_copy_mapped(uint8_t *dst, const uint8_t *src, int64_t n) {
    if (n < 0) return -1;
    int rc;
    QS_GUARDED(rc, copy_bytes(dst, src, n));
    return rc;
}
