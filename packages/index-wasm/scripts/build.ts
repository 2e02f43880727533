// Builds packages/index-wasm/build/index.wasm and json-scan.wasm from assembly/ (root postinstall, `bun run test`).
// Without --force it only rebuilds when a module is missing or was built from other sources (wasm-module.ts).
import { buildWasm, isBuildStale, jsonWasmPath, wasmPath } from "../src/wasm-module.ts";

const force = process.argv.includes("--force");
if (force || isBuildStale()) {
  const t0 = performance.now();
  buildWasm();
  console.log(`index-wasm: built ${wasmPath} and ${jsonWasmPath} in ${Math.round(performance.now() - t0)} ms`);
}
