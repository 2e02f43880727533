// Min-heap of timed callbacks for the discrete-event simulation. Equal times run in scheduling order,
// so a run is deterministic.

type Entry = { at: number; seq: number; run: (now: number) => void };

export class EventQueue {
  private readonly heap: Entry[] = [];
  private seq = 0;
  /** virtual time of the event being run, or of the last `runUntil` bound */
  now = 0;

  get size(): number {
    return this.heap.length;
  }

  /** Time of the next event, or Infinity when none is scheduled. */
  peekTime(): number {
    return this.heap[0]?.at ?? Number.POSITIVE_INFINITY;
  }

  schedule(at: number, run: (now: number) => void): void {
    const e = { at, seq: this.seq++, run };
    const h = this.heap;
    h.push(e);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(e, h[p]!)) break;
      h[i] = h[p]!;
      i = p;
    }
    h[i] = e;
  }

  /** Runs every event due at or before `t`, in time order (events may schedule more). */
  runUntil(t: number): void {
    while (this.heap.length > 0 && this.heap[0]!.at <= t) {
      const e = this.pop();
      this.now = e.at;
      e.run(e.at);
    }
    if (t !== Number.POSITIVE_INFINITY && t > this.now) this.now = t;
  }

  private pop(): Entry {
    const h = this.heap;
    const top = h[0]!;
    const last = h.pop()!;
    if (h.length > 0) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= h.length) break;
        const r = l + 1;
        const c = r < h.length && before(h[r]!, h[l]!) ? r : l;
        if (!before(h[c]!, last)) break;
        h[i] = h[c]!;
        i = c;
      }
      h[i] = last;
    }
    return top;
  }
}

function before(a: Entry, b: Entry): boolean {
  return a.at < b.at || (a.at === b.at && a.seq < b.seq);
}
