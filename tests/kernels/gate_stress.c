/* Stress of the kernel team's gated jobs and staged items (pyx/include/ll_pool.h, NOTE [ Staged
 * items ]): two submitter threads, each round a batch in production, a batch behind a closed
 * gate whose items idle threads stage, and sometimes a third batch queued while the gate is
 * closed (a batch the gate's opening waits for: it must run although threads hold staged
 * items). The gated batch is then opened or taken back. An opened batch must have every item
 * written exactly once, its staged items included; a withdrawn one none, and its memory is
 * scribbled over as soon as ll_pool_withdraw returns, so a thread that touched it later would
 * corrupt the counts (and AddressSanitizer, when the test builds with it, reports the use after
 * free). Built and run by test_team.py. */
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#include "ll_pool.h"

#define TEAM 4
typedef struct { int *hits; int *out; int n; int64_t scratch_item[TEAM][LL_STAGE_PER_THREAD]; int scratch_val[TEAM][LL_STAGE_PER_THREAD]; } ctx_t;
static void spin(int64_t i) { volatile int s = 0; for (int k = 0; k < (int)(i % 7) * 300; k++) s += k; }
static void fn(void *c, int64_t i, int tid) {
  ctx_t *x = c; (void)tid; spin(i);
  __atomic_fetch_add(&x->hits[i], 1, __ATOMIC_RELAXED); x->out[i] = (int)i * 3 + 1; }
static int stage(void *c, int64_t i, int tid, int slot) {   /* runs item i into thread tid's scratch slot */
  ctx_t *x = c; spin(i); x->scratch_item[tid][slot] = i; x->scratch_val[tid][slot] = (int)i * 3 + 1;
  return (i % 5) != 4; }
static void flush(void *c, int tid, int slot) {
  ctx_t *x = c; int64_t i = x->scratch_item[tid][slot];
  __atomic_fetch_add(&x->hits[i], 1, __ATOMIC_RELAXED); x->out[i] = x->scratch_val[tid][slot]; }
static ll_pool *P;
static long staged_total;
static void init(ll_job *j, ctx_t *x, int n, int limit) {
  memset(j, 0, sizeof(*j)); memset(x, 0, sizeof(*x));
  x->n = n; x->hits = calloc(n, sizeof(int)); x->out = calloc(n, sizeof(int));
  j->fn = fn; j->ctx = x; j->n = n; j->limit = limit; j->stage = stage; j->flush = flush; j->stage_max = 1 + n % 9; }
static long check(ctx_t *x, int expect) {
  long bad = 0;
  for (int i = 0; i < x->n; i++) bad += x->hits[i] != expect || x->out[i] != (expect ? i * 3 + 1 : 0);
  return bad; }
static void *sub(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg; long bad = 0;
  for (int r = 0; r < 3000; r++) {
    ll_job a, g, b; ctx_t ca, cg, cb;
    init(&a, &ca, 1 + rand_r(&seed) % 40, 1 + rand_r(&seed) % TEAM);
    init(&g, &cg, 1 + rand_r(&seed) % 40, 1 + rand_r(&seed) % TEAM);
    ll_pool_submit(P, &a);
    ll_pool_submit_gated(P, &g, 1);
    ll_pool_wait(P, &a);
    bad += check(&ca, 1);
    int extra = rand_r(&seed) % 3 == 0;
    if (extra) {   /* queued behind the gated batch, whose staged items some threads hold */
      init(&b, &cb, 1 + rand_r(&seed) % 40, 1 + rand_r(&seed) % TEAM);
      ll_pool_submit(P, &b);
      ll_pool_wait(P, &b);
      bad += check(&cb, 1);
      free(cb.hits); free(cb.out);
    }
    __atomic_fetch_add(&staged_total, (long)ll_pool_staged(P, &g), __ATOMIC_RELAXED);
    if (rand_r(&seed) % 2) {
      ll_pool_open(P, &g);
      ll_pool_wait(P, &g);
      bad += check(&cg, 1);
    } else if (ll_pool_withdraw(P, &g)) {
      bad += check(&cg, 0);
    } else {
      bad += 1000000;   /* a closed gate is always taken back */
    }
    memset(&g, 0xAB, sizeof(ll_job)); memset(&a, 0xAB, sizeof(ll_job));
    free(ca.hits); free(ca.out); free(cg.hits); free(cg.out);
  }
  return (void *)bad;
}
int main() {
  P = ll_pool_new(TEAM); if (!P) return 2;
  pthread_t t[2]; long bad = 0;
  for (int k = 0; k < 2; k++) pthread_create(&t[k], NULL, sub, (void *)(uintptr_t)(k + 7));
  for (int k = 0; k < 2; k++) { void *r; pthread_join(t[k], &r); bad += (long)r; }
  ll_pool_free(P);
  printf("staged %ld, bad items %ld\n", staged_total, bad); return bad != 0 || staged_total == 0;
}
