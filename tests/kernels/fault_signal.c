/* A fault inside a kernel-team thread reaches the process's SIGSEGV handler (NOTE [ Fault
 * signals reach the handler ] in pyx/include/ll_pool.h): the team's threads are created with
 * every other signal blocked, and a fault blocked in the thread that raises it kills the
 * process without running any handler, Python's faulthandler included (a crash in a kernel
 * thread then printed nothing but "Segmentation fault"). Every item of a job of 8 on a team of 4
 * that a team thread runs (not the waiting main thread) writes through NULL; the handler says
 * so and exits 3. Built and run by test_team.py. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ll_pool.h"

static void on_fault(int sig) {
    static const char msg[] = "handler ran\n";
    (void)sig;
    if (write(1, msg, sizeof msg - 1) < 0) _exit(4);
    _exit(3);
}

static pthread_t main_thread;
static volatile int *nowhere; /* NULL, read at run time */

static void fn(void *c, int64_t i, int tid) {
    (void)c;
    (void)i;
    (void)tid;
    if (!pthread_equal(pthread_self(), main_thread)) *nowhere = 1;
}

int main(void) {
    main_thread = pthread_self();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, NULL);
    ll_pool *p = ll_pool_new(4);
    if (p == NULL) return 2;
    ll_job job;
    memset(&job, 0, sizeof job);
    job.fn = fn;
    job.ctx = NULL;
    job.n = 8;
    job.limit = 4;
    ll_pool_submit(p, &job);
    ll_pool_wait(p, &job);
    ll_pool_free(p);
    printf("no fault\n");
    return 0;
}
