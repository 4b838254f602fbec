/* Stress of the kernel team's job queue (pyx/include/ll_pool.h, NOTE [ One queue across
 * batches ]): three submitter threads queue 3,000 rounds of 1-4 jobs each (1-70 items,
 * thread limits 1-8) on a team of 6 and wait for them; every item must run exactly once,
 * and a job's memory is scribbled over as soon as its wait returns, so a team thread that
 * touched it later would corrupt the next round's counts (and AddressSanitizer, when the
 * test builds with it, reports any use after free). Built and run by test_team.py. */
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#include "ll_pool.h"
typedef struct { int *hits; int n; } ctx_t;
static void fn(void *c, int64_t i, int tid) { ctx_t *x = c; __atomic_fetch_add(&x->hits[i], 1, __ATOMIC_RELAXED); (void)tid;
  volatile int s = 0; for (int k = 0; k < (int)(i % 7) * 200; k++) s += k; }
static ll_pool *P;
static void *sub(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg; long bad = 0;
  for (int r = 0; r < 3000; r++) {
    int nj = 1 + rand_r(&seed) % 4; ll_job jobs[4]; ctx_t cx[4];
    for (int k = 0; k < nj; k++) { int n = 1 + rand_r(&seed) % 70; cx[k].n = n; cx[k].hits = calloc(n, sizeof(int));
      jobs[k].fn = fn; jobs[k].ctx = &cx[k]; jobs[k].n = n; jobs[k].limit = 1 + rand_r(&seed) % 8; ll_pool_submit(P, &jobs[k]); }
    for (int k = 0; k < nj; k++) { ll_pool_wait(P, &jobs[k]); for (int i = 0; i < cx[k].n; i++) bad += cx[k].hits[i] != 1;
      memset(&jobs[k], 0xAB, sizeof(ll_job)); free(cx[k].hits); }
  }
  return (void *)bad;
}
int main() {
  P = ll_pool_new(6); if (!P) return 2;
  pthread_t t[3]; long bad = 0;
  for (int k = 0; k < 3; k++) pthread_create(&t[k], NULL, sub, (void *)(uintptr_t)(k + 1));
  for (int k = 0; k < 3; k++) { void *r; pthread_join(t[k], &r); bad += (long)r; }
  ll_pool_free(P);
  printf("threads %s, bad items %ld\n", "6", bad); return bad != 0;
}
