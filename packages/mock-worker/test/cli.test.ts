import { afterEach, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { defaultText, envName, flagName } from "@kv-epp/options";
import { ConfigError, parseConfig, resolveConfig } from "../src/index.ts";
import { MOCK_WORKER_OPTIONS, MOCK_WORKER_PROGRAM } from "../src/config.ts";
import { waitFor, LOOPBACK, LOOPBACK_PATTERN } from "@kv-epp/testkit";
import { post, subscribe, syncSubscribers } from "./support.ts";

const ROOT = `${import.meta.dir}/../../..`;
const children: Bun.Subprocess[] = [];
afterEach(async () => {
  for (const c of children.splice(0)) {
    c.kill();
    await c.exited;
  }
});

function spawnCli(args: string[], env: Record<string, string> = {}) {
  const child = Bun.spawn(["bun", "run", "mock-worker", ...args], {
    cwd: ROOT, env: { ...process.env, ...env }, stdout: "pipe", stderr: "pipe",
  });
  children.push(child);
  return child;
}

describe("configuration", () => {
  test("flags win over MOCK_WORKER_* variables, defaults fill the rest", () => {
    const c = parseConfig(["--port", "9000", "--dp-size=2", "--topic", ""], { MOCK_WORKER_PORT: "1", MOCK_WORKER_BLOCK_SIZE: "32", MOCK_WORKER_SPEED: "0" });
    expect(c).toMatchObject({ port: 9000, dpSize: 2, topic: "", blockSize: 32, speed: 0, kvEvents: "tcp://*:5557", capacityBlocks: 8192, eventEncoding: "vllm", hashMode: "int" });
    expect(c.replay).toBeUndefined();
  });

  test("a bad value names its flag or variable and the value", () => {
    const bad: [string[], Record<string, string>, RegExp][] = [
      [["--port", "http"], {}, /--port: "http"/],
      [["--event-encoding", "json"], {}, /--event-encoding: "json"/],
      [["--kv-events", "udp://x:1"], {}, /--kv-events: "udp:\/\/x:1"/],
      [["--discovery", `http://${LOOPBACK}.2.1:7070/records`], {}, new RegExp(`--discovery: "http://${LOOPBACK_PATTERN}\\.2\\.1:7070/records"`)],
      [[], { MOCK_WORKER_DISCOVERY: "consul" }, /MOCK_WORKER_DISCOVERY \(--discovery\): "consul"/],
      [[], { MOCK_WORKER_CAPACITY_BLOCKS: "0" }, /MOCK_WORKER_CAPACITY_BLOCKS \(--capacity-blocks\): "0"/],
      [["--bogus", "1"], {}, /unknown argument "--bogus"/],
      [["--model"], {}, /--model needs a value/],
    ];
    for (const [argv, env, message] of bad) expect(() => parseConfig(argv, env)).toThrow(message);
    expect(() => parseConfig(["--port", "-1"])).toThrow(ConfigError);
  });

  test("library options are validated like flags", () => {
    expect(resolveConfig({ dpSize: 2, speed: 0 })).toMatchObject({ dpSize: 2, speed: 0, port: 8000 });
    expect(() => resolveConfig({ dpSize: 0 })).toThrow(/dpSize in the options given: 0/);
    expect(() => resolveConfig({ hashMode: "hex" as never })).toThrow(/hashMode in the options given: "hex"/);
  });
});

describe("the README's table of flags", () => {
  test("names every option's flag, its variable and its default", () => {
    const readme = readFileSync(`${import.meta.dir}/../README.md`, "utf8");
    for (const [key, o] of Object.entries(MOCK_WORKER_OPTIONS)) {
      const head = `| \`--${flagName(key)}\` | \`${envName(key, o, MOCK_WORKER_PROGRAM.envPrefix)}\` | `;
      const row = readme.split("\n").find((l) => l.startsWith(head));
      expect(row, `README row for --${flagName(key)}`).toBeDefined();
      const def = defaultText(o);
      if (def !== undefined) expect(row!.slice(head.length).split(" | ")[0]).toBe(`\`${def === '""' ? def : def.replace(/^"(.*)"$/, "$1")}\``);
    }
  });
});

describe("bun run mock-worker", () => {
  test("serves /health on its listen address and publishes KV events", async () => {
    const child = spawnCli(
      ["--listen", `${LOOPBACK}.2.6`, "--port", "18000", "--kv-events", `tcp://${LOOPBACK}.2.6:15557`, "--block-size", "4", "--capacity-blocks", "64"],
      { MOCK_WORKER_SPEED: "0", MOCK_WORKER_LOG_LEVEL: "warn" },
    );
    const url = `http://${LOOPBACK}.2.6:18000`;
    await waitFor(async () => child.exitCode === null && (await fetch(`${url}/health`).then((r) => r.ok, () => false)), { message: "the worker's /health" });
    const sub = subscribe(`tcp://${LOOPBACK}.2.6:15557`);
    try {
      await syncSubscribers(url, [sub]);
      const res = await post(`${url}/v1/completions`, { prompt: [1, 2, 3, 4, 5, 6, 7, 8], max_tokens: 1 });
      expect(res.status).toBe(200);
      await waitFor(() => sub.messages.length === 1, { message: "a BlockStored from the process" });
      expect(sub.messages[0]!.batch.events[0]).toMatchObject({ type: "BlockStored", tokenIds: [1, 2, 3, 4, 5, 6, 7, 8], blockSize: 4 });
    } finally {
      await sub.close();
    }
  });

  test("a bad flag stops the start with a message naming it", async () => {
    const child = spawnCli(["--listen", `${LOOPBACK}.2.6`, "--block-size", "zero"]);
    expect(await child.exited).toBe(2);
    expect(await new Response(child.stderr).text()).toContain('--block-size: "zero"');
  });
});
