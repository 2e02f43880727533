import { describe, expect, test } from "bun:test";
import { parseConfig } from "@kv-epp/epp";
import { ConfigError } from "@kv-epp/options";
import { parseBenchArgs } from "./options.ts";

describe("bench:trace options", () => {
  test("routing's flags read the same in bench:trace as in the EPP (one declaration, the EPP's defaults)", () => {
    for (const flags of [[], ["--cost-shape", "blocks", "--prefill-load-scale", "8"], ["--load-by", "requests", "--prefix-cap-blocks", "0", "--latency-follower-weight", "3", "--latency-follower-weight-max", "2", "--latency-away-weight", "0"]]) {
      const bench = parseBenchArgs(flags);
      const epp = parseConfig(["--pool-name", "pool", ...flags], {}).picker;
      expect(bench.costShape).toEqual(epp.shape);
      expect(bench).toMatchObject({ prefillLoadScale: epp.prefillLoadScale, decodeLoadScale: epp.decodeLoadScale });
      expect(bench.latency).toEqual({ latencyFollowerWeight: epp.latencyFollowerWeight, awayWeight: epp.awayWeight });
    }
  });

  test("a bare argument is the trace; a bad flag or policy is named", () => {
    expect(parseBenchArgs(["my.jsonl", "--workers", "4"])).toMatchObject({ tracePath: "my.jsonl", workers: 4 });
    expect(() => parseBenchArgs(["--workers", "0"])).toThrow(ConfigError);
    expect(() => parseBenchArgs(["--workers", "0"])).toThrow(/--workers: "0"/);
    expect(() => parseBenchArgs(["--policies", "kv-aware,nope"])).toThrow(/--policies: "kv-aware,nope" \(unknown policy "nope"/);
    expect(() => parseBenchArgs(["--latency-away-weight", "-1"])).toThrow(/--latency-away-weight: "-1"/);
  });
});
