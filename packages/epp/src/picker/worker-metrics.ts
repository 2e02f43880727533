// Load scraped from each worker's vLLM Prometheus endpoint: an extra signal next to the load the EPP
// tracks itself (which misses requests that did not come through this replica).

export type WorkerMetrics = { running: number; waiting: number; kvUsage: number; at: number };

/** Reads the gauges vLLM exposes (`vllm:num_requests_running`, `..._waiting`, KV usage), summing label sets. */
export function parseVllmMetrics(text: string, at = Date.now()): WorkerMetrics {
  const out: WorkerMetrics = { running: 0, waiting: 0, kvUsage: 0, at };
  for (const line of text.split("\n")) {
    if (line.length === 0 || line.charCodeAt(0) === 35 /* # */) continue;
    const name = line.slice(0, line.search(/[{\s]/));
    const v = Number(line.slice(line.lastIndexOf(" ") + 1));
    if (!Number.isFinite(v)) continue;
    switch (name) {
      case "vllm:num_requests_running":
        out.running += v;
        break;
      case "vllm:num_requests_waiting":
        out.waiting += v;
        break;
      case "vllm:gpu_cache_usage_perc":
      case "vllm:kv_cache_usage_perc":
        out.kvUsage = Math.max(out.kvUsage, v);
        break;
    }
  }
  return out;
}

export type ScrapeTarget = { workerId: string; url: string };

export class WorkerMetricsScraper {
  readonly #latest = new Map<string, WorkerMetrics>();
  #targets: ScrapeTarget[] = [];
  #timer: ReturnType<typeof setInterval> | undefined;
  #running = false;

  constructor(
    private readonly opts: {
      intervalMs: number;
      timeoutMs?: number;
      onError: (workerId: string, err: unknown) => void;
      onSuccess?: (workerId: string) => void;
    },
  ) {}

  setTargets(targets: ScrapeTarget[]): void {
    this.#targets = targets;
    const ids = new Set(targets.map((t) => t.workerId));
    for (const id of this.#latest.keys()) if (!ids.has(id)) this.#latest.delete(id);
  }

  get(workerId: string): WorkerMetrics | undefined {
    return this.#latest.get(workerId);
  }

  start(): void {
    if (this.opts.intervalMs <= 0 || this.#timer) return;
    this.#timer = setInterval(() => void this.scrapeOnce(), this.opts.intervalMs);
    this.#timer.unref?.();
    void this.scrapeOnce();
  }

  async scrapeOnce(): Promise<void> {
    if (this.#running) return; // a slow worker must not pile up overlapping rounds
    this.#running = true;
    try {
      await Promise.all(
        this.#targets.map(async (t) => {
          try {
            const res = await fetch(t.url, { signal: AbortSignal.timeout(this.opts.timeoutMs ?? 2000) });
            if (!res.ok) throw new Error(`HTTP ${res.status}`);
            this.#latest.set(t.workerId, parseVllmMetrics(await res.text()));
            this.opts.onSuccess?.(t.workerId);
          } catch (err) {
            this.#latest.delete(t.workerId);
            this.opts.onError(t.workerId, err);
          }
        }),
      );
    } finally {
      this.#running = false;
    }
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
