import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { EPP_RUNTIME_ENV, eppRuntimeEnv } from "./runtime-env.ts";

const ROOT = join(import.meta.dir, "../../..");
/** `K="${K:--1}"`-style assignments: the runtime environment, each value a caller set kept. */
const assignments = Object.entries(EPP_RUNTIME_ENV).map(([k, v]) => `${k}="\${${k}:-${v}}"`).join(" ");

test("the image's epp entry point starts the EPP with the runtime environment, unless the Deployment sets it", () => {
  const dockerfile = readFileSync(join(ROOT, "deploy/Dockerfile"), "utf8");
  const wrapper = dockerfile.split("\n").filter((l) => l.includes("> /usr/local/bin/epp"));
  expect(wrapper).toEqual([` && printf '#!/bin/sh\\nexec env ${assignments} bun /app/packages/epp/src/main.ts "$@"\\n' > /usr/local/bin/epp \\`]);
  // Nowhere else: the mock worker and the P/D sidecar in the same image were not measured with it.
  for (const k of Object.keys(EPP_RUNTIME_ENV)) expect(dockerfile.split(k).length - 1).toBe(2);
});

test("`bun run epp` starts it with the runtime environment, unless the caller sets it", () => {
  const script = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts.epp;
  expect(script).toBe(`${assignments.replaceAll('"', "")} bun packages/epp/src/main.ts`);
});

test("a spawn's environment keeps a value the caller set", () => {
  expect(eppRuntimeEnv({})).toEqual({ ...EPP_RUNTIME_ENV });
  expect(eppRuntimeEnv({ MIMALLOC_PURGE_DELAY: "250" })).toEqual({ ...EPP_RUNTIME_ENV, MIMALLOC_PURGE_DELAY: "250" });
});
