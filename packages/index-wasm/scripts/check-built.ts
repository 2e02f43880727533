// Fails unless build/ holds every module, built from the current sources, and each one loads; never
// compiles. The image's runtime stage runs it, so an image that would fail at start is not built.
import { instantiate, instantiateAt, jsonWasmPath, staleReason, BUILD_COMMAND } from "../src/wasm-module.ts";

const why = staleReason();
if (why !== undefined) {
  console.error(`index-wasm: ${why}: build the modules with \`${BUILD_COMMAND}\``);
  process.exit(1);
}
instantiate();
instantiateAt(jsonWasmPath);
console.log("index-wasm: the built modules are current and load");
