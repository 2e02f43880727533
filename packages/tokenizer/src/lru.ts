/** A map that keeps its `max` most recently used entries. */
export class Lru<K, V> {
  private readonly entries = new Map<K, V>();

  constructor(private readonly max: number) {}

  get(key: K): V | undefined {
    const v = this.entries.get(key);
    if (v === undefined) return undefined;
    // Map iterates in insertion order: re-inserting makes it the most recent.
    this.entries.delete(key);
    this.entries.set(key, v);
    return v;
  }

  /** Stores `value` under `key`, dropping the least recently used entry past `max`; returns `value`. */
  set(key: K, value: V): V {
    this.entries.delete(key);
    this.entries.set(key, value);
    if (this.entries.size > this.max) this.entries.delete(this.entries.keys().next().value as K);
    return value;
  }

  get size(): number {
    return this.entries.size;
  }
}
