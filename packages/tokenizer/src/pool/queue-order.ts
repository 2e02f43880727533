// Which queued request a free member takes next. First come, first served let one long fresh text hold every
// short pick queued behind it on its member for the whole of its tokenization (the very stall the pool exists
// to avoid, moved from the event loop to a member). Shortest first alone would starve a long text behind a
// stream of short ones. So each request is due when it would have finished had it started the moment it came:
// its arrival plus its expected cost at a member's fresh rate, and the member takes the earliest due. A short
// pick arriving while a long text waits goes first; one arriving after the long text's due instant does not:
// no request is passed by one that came after its own due instant.

/** What the order needs of a queued request: when it came (ms) and its expected cost (fresh characters, see placement.ts). */
export type Queued = { submitted: number; cost: number };

/**
 * Fresh characters a member tokenizes per millisecond, idle: ~128 Ki characters of the agentic workload in
 * ~10 ms (placement.ts). Only the ratio of cost to waiting matters here, and a busy machine slows both alike.
 */
export const FRESH_CHARS_PER_MS = 13_000;

/** When a request would finish had it started on arrival. */
export const dueAt = (q: Queued): number => q.submitted + q.cost / FRESH_CHARS_PER_MS;

/** The index of the request to take next (the earliest due; the earliest queued on a tie), or -1 for none. */
export function nextDue(queue: readonly Queued[]): number {
  let best = -1;
  let bestDue = Infinity;
  for (let i = 0; i < queue.length; i++) {
    const due = dueAt(queue[i]!);
    if (due < bestDue) {
      best = i;
      bestDue = due;
    }
  }
  return best;
}
