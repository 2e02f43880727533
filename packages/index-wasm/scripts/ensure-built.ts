// bun test preload (root bunfig.toml): rebuild the modules only when they are missing or stale (wasm-module.ts).
import { buildWasm, isBuildStale } from "../src/wasm-module.ts";

if (isBuildStale()) buildWasm();
