import { Counter, Gauge, type Registry } from "prom-client";
import type { CacheStats, PreprocessorKind } from "./types";

export type MetricsSource = { model: string; kind: PreprocessorKind; cacheStats(): CacheStats };

// Several preprocessors (one per model) may share one registry, and prom-client refuses a metric name twice,
// so the metrics are created once per registry and read every registered source at scrape time. Reading plain
// numbers at scrape time also keeps metric updates off the per-request path.
const sourcesByRegistry = new WeakMap<Registry, Set<MetricsSource>>();

export function registerPreprocessorMetrics(registry: Registry, source: MetricsSource): void {
  let sources = sourcesByRegistry.get(registry);
  if (sources === undefined) {
    sources = new Set();
    sourcesByRegistry.set(registry, sources);
    createMetrics(registry, sources);
  }
  sources.add(source);
}

function createMetrics(registry: Registry, sources: Set<MetricsSource>): void {
  const counter = (name: string, help: string, read: (s: CacheStats) => number) =>
    new Counter({
      name, help, labelNames: ["model"], registers: [registry],
      collect() {
        this.reset();
        for (const s of sources) this.inc({ model: s.model }, read(s.cacheStats()));
      },
    });
  const gauge = (name: string, help: string, read: (s: MetricsSource) => number) =>
    new Gauge({
      name, help, labelNames: ["model"], registers: [registry],
      collect() {
        this.reset();
        for (const s of sources) this.set({ model: s.model }, read(s));
      },
    });
  counter("dynamo_epp_tokenizer_cache_hits_total", "Tokenization segment cache hits", (c) => c.hits);
  counter("dynamo_epp_tokenizer_cache_misses_total", "Tokenization segment cache misses", (c) => c.misses);
  counter("dynamo_epp_tokenizer_cache_evictions_total", "Tokenization segment cache evictions (LRU)", (c) => c.evictions);
  gauge("dynamo_epp_tokenizer_cache_bytes", "Approximate bytes held by the tokenization segment cache", (s) => s.cacheStats().bytes);
  gauge("dynamo_epp_tokenizer_cache_entries", "Segments held by the tokenization segment cache", (s) => s.cacheStats().entries);
  gauge("dynamo_epp_tokenizer_byte_fallback", "1 when the model has no tokenizer and the byte-level fallback is used", (s) =>
    s.kind === "byte-fallback" ? 1 : 0);
}
