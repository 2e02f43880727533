import { parseArgs } from "node:util";
import { z } from "zod";
import { isHostPort } from "./prefiller-header.ts";

/**
 * The sidecar's configuration, parsed once: each flag `--some-name` also reads `PD_SIDECAR_SOME_NAME`,
 * a flag wins over its variable, a bad value stops the start naming the flag (or variable) and value.
 */
const OPTIONS = {
  listen: { schema: z.union([z.ipv4(), z.ipv6()], { error: "expected an IP address" }).default("0.0.0.0"), help: "IP the sidecar binds" },
  port: { schema: z.coerce.number().int().min(0).max(65535).default(8000), help: "port the gateway calls (the pod's InferencePool target port)" },
  decoder: { schema: z.url({ protocol: /^https?$/ }).default("http://127.0.0.1:8200"), help: "the local decode worker's base URL (vLLM in the same pod)" },
  "allowed-prefillers": {
    schema: z.string().default("").transform((v) => v.split(",").map((s) => s.trim()).filter((s) => s.length > 0))
      .refine((list) => list.every(isHostPort), "expected host:port,..."),
    help: "host:port list the prefill leg may call (others: 403); empty: any host:port (llm-d's SSRF protection off)",
  },
  "prefill-timeout-ms": { schema: z.coerce.number().int().positive().default(300_000), help: "longest wait for a prefill worker's answer" },
  "log-level": { schema: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"), help: "pino level" },
} as const;

type Options = typeof OPTIONS;
type CamelCase<S extends string> = S extends `${infer H}-${infer T}` ? `${H}${Capitalize<CamelCase<T>>}` : S;
export type SidecarConfig = { [K in keyof Options as CamelCase<K & string>]: z.output<Options[K]["schema"]> };

export class ConfigError extends Error {
  override name = "ConfigError";
}

export const envName = (flag: string) => `PD_SIDECAR_${flag.toUpperCase().replaceAll("-", "_")}`;
const camel = (flag: string) => flag.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());

export function parseConfig(argv: string[], env: Record<string, string | undefined> = {}): SidecarConfig {
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({ args: argv, options: Object.fromEntries(Object.keys(OPTIONS).map((f) => [f, { type: "string" as const }])), strict: true }).values;
  } catch (e) {
    throw new ConfigError(`${(e as Error).message}\n${usage()}`);
  }
  const out: Record<string, unknown> = {};
  for (const [flag, opt] of Object.entries(OPTIONS)) {
    const fromFlag = values[flag] as string | undefined;
    const given = fromFlag ?? env[envName(flag)];
    const parsed = opt.schema.safeParse(given);
    if (!parsed.success) {
      const why = parsed.error.issues.map((i) => i.message).join("; ");
      throw new ConfigError(`invalid ${fromFlag !== undefined ? `--${flag}` : envName(flag)} ${JSON.stringify(given)}: ${why}`);
    }
    out[camel(flag)] = parsed.data;
  }
  return out as SidecarConfig;
}

/** Options given in code, validated like flags. */
export function resolveConfig(given: Partial<Record<keyof SidecarConfig, string | number | string[]>>): SidecarConfig {
  const argv = Object.entries(given).flatMap(([k, v]) => [`--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`, Array.isArray(v) ? v.join(",") : String(v)]);
  return parseConfig(argv);
}

export function usage(): string {
  const lines = Object.entries(OPTIONS).map(([flag, o]) => `  --${flag.padEnd(20)} ${envName(flag).padEnd(30)} ${o.help}`);
  return `usage: bun run pd-sidecar [flags]   (each flag also reads its environment variable)\n${lines.join("\n")}`;
}
