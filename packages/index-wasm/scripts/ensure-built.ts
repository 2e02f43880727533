// bun test preload (root bunfig.toml): rebuild the index module only when its sources changed.
import { buildWasm, isBuildStale } from "../src/wasm-module.ts";

if (isBuildStale()) buildWasm();
