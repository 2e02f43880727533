// Public entry of @kv-epp/mock-worker: the worker as a library (for in-process tests and the trace
// benchmark) and its two models, usable on their own in simulated time.
export { startMockWorker, type MockWorker, type MockWorkerOptions, type MockWorkerRank } from "./worker.ts";
export { PrefixCacheSim, type CachedBlock, type CacheEvent, type Acquisition, type Lease, type PrefixCacheOptions } from "./cache/prefix-cache.ts";
export { blockExtraKeys, chainBlockIds, foldDigest, type BlockId, type MediaItem, type RequestIdentity } from "./cache/block-hash.ts";
export { StepScheduler, DEFAULT_TIMING, idleTtftMs, type TimingParams, type StepResult } from "./engine/scheduler.ts";
export { RankEngine, type Generation } from "./engine/rank-engine.ts";
export { RankEvents } from "./events/event-stream.ts";
export { parseKvGroups, type KvGroup } from "./events/kv-groups.ts";
export { parseConfig, resolveConfig, usage, ConfigError, type MockWorkerConfig } from "./config.ts";
export { FaultRequest } from "./http/admin-routes.ts";
export type { CacheTruth, TruthRank, TruthBlock } from "./http/cache-truth.ts";
