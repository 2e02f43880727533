// The one place this package takes the simulation's pieces from its sibling packages.
export { PrefixCacheSim, TimingModel, DEFAULT_TIMING, chainBlockIds, type CacheEvent, type TimingParams } from "@kv-epp/mock-worker";
// TEMPORARY: @kv-epp/epp's public entry does not export the picker's cost function and load tracking
// yet; these relative imports become `from "@kv-epp/epp"` once it exports
// `cost, choose, type Weights` (picker/cost.ts) and `ActiveLoad, type Lease` (picker/load.ts).
export { cost, choose, type Weights } from "../../epp/src/picker/cost.ts";
export { ActiveLoad, type Lease as LoadLease } from "../../epp/src/picker/load.ts";
