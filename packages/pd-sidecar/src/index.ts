// Public entry of @kv-epp/pd-sidecar: llm-d's P/D sidecar protocol in front of a decode worker.
export { startSidecar, type Sidecar, type SidecarOptions } from "./server.ts";
export { parseConfig, resolveConfig, usage, ConfigError, type SidecarConfig } from "./config.ts";
export { PREFILLER_HEADER } from "./prefiller-header.ts";
export { prefillBody, decodeBody, prefillOutcome } from "./prefill-request.ts";
