import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { EPP_RUNTIME_ENV } from "./runtime-env.ts";

const ROOT = join(import.meta.dir, "../../..");
const entries = Object.entries(EPP_RUNTIME_ENV);

test("the image starts the EPP with the runtime environment", () => {
  const dockerfile = readFileSync(join(ROOT, "deploy/Dockerfile"), "utf8");
  const runtime = dockerfile.slice(dockerfile.lastIndexOf("\nFROM "));
  expect(entries.length).toBeGreaterThan(0);
  for (const [k, v] of entries) expect(runtime).toMatch(new RegExp(`^ENV[^\\n]*(?:\\\\\\n[^\\n]*)*\\b${k}=${v.replace("-", "\\-")}(\\s|$)`, "m"));
});

test("`bun run epp` starts it with the runtime environment", () => {
  const script = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts.epp!;
  for (const [k, v] of entries) expect(script).toContain(`${k}=${v} `);
  expect(script).toEndWith("bun packages/epp/src/main.ts");
});
