// The sidecar's options, declared once on @kv-epp/options: each flag `--some-name` also reads
// `PD_SIDECAR_SOME_NAME`; flag > variable > default (a library caller's options stand between the
// variable and the default); a bad value stops the start naming the flag (or variable) and the value.
import { ConfigError, count, group, opt, port, positive, resolveOptions, usageText, type Values } from "@kv-epp/options";
import { z } from "zod";
import { isHostPort } from "./prefiller-header.ts";

const PD_SIDECAR_PROGRAM = { envPrefix: "PD_SIDECAR_" } as const;
/** A port the sidecar connects to (the shared `port` allows 0, an ephemeral port to bind, which no peer listens on). */
const peerPort = z.number().int().min(1).max(65535);

export const PD_SIDECAR_OPTIONS = {
  ...group("Server", {
    listen: opt.string(z.union([z.ipv4(), z.ipv6()], { error: "expected an IP address" }).default("0.0.0.0"), "IP the sidecar binds"),
    port: opt.int(port.default(8000), "port the gateway calls (the pod's InferencePool target port)"),
    logLevel: opt.choice(["fatal", "error", "warn", "info", "debug", "trace", "silent"], "info", "pino level"),
  }),
  ...group("Legs", {
    decoder: opt.string(z.url({ protocol: /^https?$/ }).default("http://127.0.0.1:8200"), "the local decode worker's base URL (vLLM in the same pod)"),
    allowedPrefillers: opt.list(
      z.array(z.string()).default([]).refine((list) => list.every(isHostPort), "expected host:port,..."),
      "host:port list the prefill leg may call (others: 403); empty: any host:port (llm-d's SSRF protection off)",
    ),
    prefillTimeoutMs: opt.int(positive.default(300_000), "longest wait for a prefill worker's answer, every retry and pause included"),
    prefillMaxRetries: opt.int(count.default(0), "attempts after the first when the prefill worker answers 502, 503 or 504 or cannot be reached (llm-d's --prefill-max-retries); 0: none"),
    prefillRetryBackoffMs: opt.int(positive.default(200), "pause before each prefill retry (llm-d's --prefill-retry-backoff)"),
    prefillerSampling: opt.bool(z.boolean().default(false), "draw the prefill worker among the header's candidates, not the first (llm-d's --enable-prefiller-sampling)"),
    kvConnector: opt.choice(
      ["nixlv2", "sglang", "mooncake"],
      "nixlv2",
      "the KV protocol between the workers (llm-d's --kv-connector): nixlv2, vLLM's NixlConnector (prefill leg, then decode leg with its kv_transfer_params); sglang, SGLang's bootstrap rooms (both legs at once); mooncake, vLLM's MooncakeConnector (engine id from the prefill's bootstrap server, both legs at once)",
    ),
    sglangBootstrapPort: opt.int(peerPort.default(8998), "with --kv-connector sglang: the prefill workers' bootstrap port (SGLang's --disaggregation-bootstrap-port; llm-d reads SGLANG_BOOTSTRAP_PORT)"),
    mooncakeBootstrapPort: opt.int(peerPort.default(8998), "with --kv-connector mooncake: the prefill workers' Mooncake bootstrap port (vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT; llm-d's --mooncake-bootstrap-port reads MOONCAKE_BOOTSTRAP_PORT)"),
  }),
};

export type SidecarConfig = Values<typeof PD_SIDECAR_OPTIONS>;

export { ConfigError };

export function parseConfig(argv: string[], env: Record<string, string | undefined> = {}): SidecarConfig {
  return resolveOptions(PD_SIDECAR_OPTIONS, PD_SIDECAR_PROGRAM, { argv, env }).values;
}

/** Options given in code, validated like flags; defaults fill the rest. */
export function resolveConfig(given: Partial<SidecarConfig>): SidecarConfig {
  return resolveOptions(PD_SIDECAR_OPTIONS, PD_SIDECAR_PROGRAM, { file: { label: "the options given", values: given } }).values;
}

export function usage(): string {
  return usageText(PD_SIDECAR_OPTIONS, { ...PD_SIDECAR_PROGRAM, command: "bun run pd-sidecar", note: "Each flag also reads its variable; flag > variable > default." });
}
