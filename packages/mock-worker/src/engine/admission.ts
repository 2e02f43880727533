/** A bounded set of running requests with a FIFO waiting queue (vLLM's running / waiting lists). */
export class Admission {
  private runningCount = 0;
  private readonly queue: { admit: () => void; reject: (e: unknown) => void; signal?: AbortSignal }[] = [];

  constructor(private readonly maxRunning: number) {}

  get running(): number {
    return this.runningCount;
  }

  get waiting(): number {
    return this.queue.length;
  }

  /** Resolves when the request may run; the caller must call `leave()` exactly once afterwards. */
  enter(signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.runningCount < this.maxRunning && this.queue.length === 0) {
      this.runningCount++;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const entry = { admit: resolve, reject, signal };
      this.queue.push(entry);
      signal?.addEventListener(
        "abort",
        () => {
          const i = this.queue.indexOf(entry);
          if (i >= 0) {
            this.queue.splice(i, 1);
            reject(signal.reason);
          }
        },
        { once: true },
      );
    });
  }

  leave(): void {
    const next = this.queue.shift();
    if (next) next.admit();
    else this.runningCount--;
  }
}
