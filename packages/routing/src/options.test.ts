import { describe, expect, test } from "bun:test";
import { resolveOptions } from "@kv-epp/options";
import { DEFAULT_LATENCY_SETTINGS, pendingPrefixes, ROUTING_OPTIONS, routingSettings } from "./options.ts";
import { PendingPrefixes } from "./pending.ts";

const settings = (argv: string[]) => routingSettings(resolveOptions(ROUTING_OPTIONS, {}, { argv }).values);

describe("routing's options make the settings the Picker, the latency model and the in-flight prefixes read", () => {
  test("the defaults are the constants beside the code they tune", () => {
    const s = settings([]);
    expect(s).toMatchObject({ cost: "latency", queueWeight: 0, queueThreshold: 0, temperature: 0, prefillLoadScale: 16, decodeLoadScale: 1 });
    expect(s.shape).toEqual({ kind: "score", prefix: 3, load: 2, loadBy: "blocks", prefixCapBlocks: 256 });
    expect({ latencyFollowerWeight: s.latencyFollowerWeight, awayWeight: s.awayWeight }).toEqual(DEFAULT_LATENCY_SETTINGS);
    expect(s.inflightPrefix).toEqual({ mode: "on", maxBlocks: 1 << 20, ttlMs: 600_000 });
  });

  test("the blocks shape drops the score's weights; a follower max below its base is the base", () => {
    const s = settings(["--cost-shape", "blocks", "--prefix-weight", "9", "--latency-follower-weight", "5", "--latency-follower-weight-max", "2"]);
    expect(s.shape).toEqual({ kind: "blocks" });
    expect(s.latencyFollowerWeight).toEqual({ base: 5, max: 5 });
  });

  test("in-flight prefixes: none when off, bounded as set when on", () => {
    expect(pendingPrefixes(settings(["--inflight-prefix", "false"]))).toBeUndefined();
    expect(pendingPrefixes(settings(["--inflight-prefix-max-blocks", "64"]))).toBeInstanceOf(PendingPrefixes);
    expect(() => settings(["--inflight-prefix-max-blocks", "0"])).toThrow(/--inflight-prefix-max-blocks: "0"/);
  });
});
