// A measurement said so: JSC schedules collections by heap growth, and streaming a dump allocates short-lived
// BigInts and block objects so fast that garbage reached ~310 MiB above the baseline on the 1M-residency bench
// before the collector ran. Asking Bun for a non-blocking collection every few MiB of body kept the peak under
// 4 MiB at no measurable cost. Outside Bun this does nothing.

const gc: ((force: boolean) => void) | undefined = (globalThis as { Bun?: { gc(force: boolean): void } }).Bun?.gc;

// 2 MiB rather than 4 since the fast paths (module-written JSON, typed batches): the bench's peak above the index
// went from up to 33 MiB (receiver, no index) / 14 MiB (sender) to 27 / 3 MiB, for ~20 ms more CPU per side.
export const GC_EVERY_BYTES = 2 * 1024 * 1024;

/** Returns a function to call with the size of each chunk produced or consumed. */
export function gcPacer(everyBytes = GC_EVERY_BYTES): (bytes: number) => void {
  let since = 0;
  return (bytes) => {
    since += bytes;
    if (since < everyBytes || gc === undefined) return;
    since = 0;
    gc(false);
  };
}
