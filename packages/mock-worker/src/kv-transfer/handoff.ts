/**
 * Where a prefill side's finished KV meets the decode side that asks for it, by key (an SGLang room, a Mooncake
 * engine rank and transfer id): whichever comes first waits for the other. A value put while a taker waits goes to
 * the longest-waiting taker at once; otherwise it is kept until taken or withdrawn. The connectors own what a value
 * holds (blocks, timers) and when it expires.
 */
export class Handoff<T> {
  private readonly kept = new Map<string, T>();
  private readonly takers = new Map<string, Set<(value: T) => void>>();

  /** Values kept, not yet taken. */
  get size(): number {
    return this.kept.size;
  }

  /** Hands `value` to a waiting taker (true), or keeps it under `key` until taken or withdrawn (false). */
  put(key: string, value: T): boolean {
    const taker = this.takers.get(key)?.values().next().value;
    if (taker) {
      taker(value);
      return true;
    }
    this.kept.set(key, value);
    return false;
  }

  /** Drops `value` if it is still the one kept under `key` (true), as an expiry or an abort does. */
  withdraw(key: string, value: T): boolean {
    if (this.kept.get(key) !== value) return false;
    this.kept.delete(key);
    return true;
  }

  /** Every value kept, dropped from here (the worker is closing: their owner frees them). */
  drain(): T[] {
    const values = [...this.kept.values()];
    this.kept.clear();
    return values;
  }

  /** The value under `key`, now or once put; rejects with the signal's reason when it aborts first. */
  take(key: string, signal: AbortSignal): Promise<T> {
    const ready = this.kept.get(key);
    if (ready !== undefined) {
      this.kept.delete(key);
      return Promise.resolve(ready);
    }
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise<T>((resolve, reject) => {
      let set = this.takers.get(key);
      if (!set) this.takers.set(key, (set = new Set()));
      const leave = () => {
        signal.removeEventListener("abort", onAbort);
        set.delete(taker);
        if (set.size === 0 && this.takers.get(key) === set) this.takers.delete(key);
      };
      const taker = (value: T) => {
        leave();
        resolve(value);
      };
      const onAbort = () => {
        leave();
        reject(signal.reason);
      };
      set.add(taker);
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }
}
