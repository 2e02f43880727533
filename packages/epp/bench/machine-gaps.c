// The machine's own scheduling floor: N threads that never yield, each reading the monotonic clock in a loop for
// --duration-ms and recording every gap between two reads (the time it did not run: preempted by another thread,
// the kernel, or the hypervisor taking the virtual CPU). No server and no load generator: what any process on this
// machine can expect from its CPUs when N of them are busy. Prints one JSON line: per gap bucket the count over all
// threads (a gap counts in the highest bound it reaches), the longest gap, and the time lost in gaps of 0.5 ms or
// more as a share of the run.
// Written here (not a library's) because it must add nothing between two clock reads.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const double BOUNDS_MS[] = {0.5, 1, 2, 5, 10, 20};
#define BUCKETS (sizeof BOUNDS_MS / sizeof BOUNDS_MS[0])

typedef struct { double duration_ms; long counts[BUCKETS]; double max_ms; double lost_ms; } Spinner;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *spin(void *arg) {
  Spinner *s = arg;
  double start = now_ms(), last = start;
  for (;;) {
    double t = now_ms(), gap = t - last;
    last = t;
    if (t - start >= s->duration_ms) break;
    if (gap > s->max_ms) s->max_ms = gap;
    if (gap < BOUNDS_MS[0]) continue;
    s->lost_ms += gap;
    for (size_t b = BUCKETS; b-- > 0;)
      if (gap >= BOUNDS_MS[b]) { s->counts[b]++; break; }
  }
  return NULL;
}

int main(int argc, char **argv) {
  int threads = 1;
  double duration_ms = 3000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--duration-ms")) duration_ms = atof(argv[i + 1]);
    else { fprintf(stderr, "unknown flag %s (--threads N --duration-ms N)\n", argv[i]); return 2; }
  }
  if (threads < 1 || threads > 256 || !(duration_ms > 0)) { fprintf(stderr, "--threads 1..256, --duration-ms > 0\n"); return 2; }
  Spinner *s = calloc(threads, sizeof *s);
  pthread_t *ids = calloc(threads, sizeof *ids);
  for (int i = 0; i < threads; i++) { s[i].duration_ms = duration_ms; pthread_create(&ids[i], NULL, spin, &s[i]); }
  long counts[BUCKETS] = {0};
  double max_ms = 0, lost_ms = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(ids[i], NULL);
    for (size_t b = 0; b < BUCKETS; b++) counts[b] += s[i].counts[b];
    if (s[i].max_ms > max_ms) max_ms = s[i].max_ms;
    lost_ms += s[i].lost_ms;
  }
  printf("{\"threads\":%d,\"durationMs\":%.0f,\"gaps\":{", threads, duration_ms);
  for (size_t b = 0; b < BUCKETS; b++) printf("%s\"%g\":%ld", b ? "," : "", BOUNDS_MS[b], counts[b]);
  printf("},\"maxMs\":%.3f,\"lostShare\":%.5f}\n", max_ms, lost_ms / (duration_ms * threads));
  return 0;
}
