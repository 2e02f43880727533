import { describe, expect, test } from "bun:test";
import { writeStaticConfig } from "../test/helpers.ts";
import { ConfigError, parseConfig, usesKubernetes } from "./config.ts";
import { serving } from "./workers/registry.ts";
import { staticWorkers } from "./workers/static.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const file = writeStaticConfig([{ id: "a", address: `${LOOPBACK}.4.1:8000`, kvEvents: `tcp://${LOOPBACK}.4.1:5557` }], [`http://${LOOPBACK}.4.2:9093`]);

describe("config", () => {
  test("defaults follow the fixed names (docs/CONTRACTS.md §11); static peers enable static recovery", () => {
    const c = parseConfig(["--config", file], {});
    expect(c.ports).toEqual({ grpc: 9002, grpcHealth: 9003, metrics: 9090, replicaAgg: 9092, selection: 9093 });
    expect(c.listen).toBe("0.0.0.0");
    expect(c.recoveryTimeoutMs).toBe(30000);
    expect(c.workers).toEqual({ mode: "static", list: [{ id: "a", address: `${LOOPBACK}.4.1:8000`, kvEvents: `tcp://${LOOPBACK}.4.1:5557`, dpSize: 1, dpStartRank: 0, kvEventsBind: false }] });
    expect(c.recovery).toEqual({ mode: "static", peers: [`http://${LOOPBACK}.4.2:9093`] });
    expect(c.model).toEqual({ name: "test-model", tenant: "default", blockSize: 16, loraAdapters: [] });
    expect(c.kvHeartbeatMs).toBe(5000);
    expect(c.conformanceTestHooks).toBe(false);
    // As GAIE's EPP: TLS unless told otherwise, with a certificate of its own when given none.
    expect(c.tls).toEqual({ mode: "self-signed" });
  });

  test("--secure-serving=false (DYN_SECURE_SERVING=false) gives h2c; cert files give TLS with them", () => {
    expect(parseConfig(["--config", file, "--secure-serving=false"], {}).tls).toEqual({ mode: "off" });
    expect(parseConfig(["--config", file], { DYN_SECURE_SERVING: "false" }).tls).toEqual({ mode: "off" });
    expect(parseConfig(["--config", file, "--tls-cert-file", "/c.pem", "--tls-key-file", "/k.pem"], {}).tls).toEqual({
      mode: "files",
      certFile: "/c.pem",
      keyFile: "/k.pem",
    });
  });

  test("a static worker may list several API servers (external DP load balancing): dpSize ranks behind each, in order", () => {
    const multi = writeStaticConfig([{ id: "a", address: [`${LOOPBACK}.4.1:8000`, `${LOOPBACK}.4.1:8001`], kvEvents: `tcp://${LOOPBACK}.4.1:5557`, dpSize: 2 }]);
    const c = parseConfig(["--config", multi], {});
    if (c.workers.mode !== "static") throw new Error("static mode expected");
    const [w] = staticWorkers(c.workers.list);
    expect(w).toMatchObject({
      address: `${LOOPBACK}.4.1:8000`,
      dpSize: 4,
      servers: [
        { address: `${LOOPBACK}.4.1:8000`, ranks: [0, 1] },
        { address: `${LOOPBACK}.4.1:8001`, ranks: [2, 3] },
      ],
    });
    expect([0, 1, 2, 3].map((r) => serving(w!, r, 4))).toEqual([
      { endpoint: `${LOOPBACK}.4.1:8000`, rankHeader: 0 },
      { endpoint: `${LOOPBACK}.4.1:8000`, rankHeader: 1 },
      { endpoint: `${LOOPBACK}.4.1:8001`, rankHeader: 0 },
      { endpoint: `${LOOPBACK}.4.1:8001`, rankHeader: 1 },
    ]);
  });

  test("environment variables apply and flags win over them", () => {
    const env = { DYN_EPP_CONFIG: file, DYN_EPP_GRPC_PORT: "7000", DYN_EPP_METRICS_PORT: "7001", DYN_EPP_PEER_SERVICE: "dynamo-epp-peer", POD_NAMESPACE: "ns1" };
    const c = parseConfig(["--grpc-port", "7100"], env);
    expect(c.ports.grpc).toBe(7100);
    expect(c.ports.metrics).toBe(7001);
    expect(c.recovery).toEqual({ mode: "kubernetes", peerService: "dynamo-epp-peer", namespace: "ns1" });
  });

  test("cost shape: the score shape by default; today's blocks weights with --cost-shape blocks; every knob also an env variable", () => {
    expect(parseConfig(["--config", file], {}).picker.shape).toEqual({ kind: "score", prefix: 3, load: 2, loadBy: "blocks", prefixCapBlocks: 256 });
    expect(parseConfig(["--config", file, "--cost-shape", "blocks"], {}).picker).toMatchObject({ shape: { kind: "blocks" }, prefillLoadScale: 16, decodeLoadScale: 1 });
    const env = { DYN_EPP_COST_SHAPE: "score", DYN_EPP_PREFIX_WEIGHT: "4", DYN_EPP_LOAD_WEIGHT: "1.5", DYN_EPP_LOAD_BY: "requests", DYN_EPP_PREFIX_CAP_BLOCKS: "0" };
    expect(parseConfig(["--config", file], env).picker.shape).toEqual({ kind: "score", prefix: 4, load: 1.5, loadBy: "requests", prefixCapBlocks: 0 });
    expect(parseConfig(["--config", file], { DYN_EPP_COST_SHAPE: "blocks" }).picker.shape).toEqual({ kind: "blocks" });
  });

  test("follower weight: 1 rising to 12 with the eviction regret by default; equal (or a max below the base) is a fixed weight; a negative base is refused", () => {
    const fw = (args: string[], env = {}) => parseConfig(["--config", file, ...args], env).picker.latencyFollowerWeight;
    expect(fw([])).toEqual({ base: 1, max: 12 });
    expect(fw(["--latency-follower-weight", "3", "--latency-follower-weight-max", "3"])).toEqual({ base: 3, max: 3 });
    expect(fw(["--latency-follower-weight", "8"])).toEqual({ base: 8, max: 12 });
    expect(fw(["--latency-follower-weight", "14"])).toEqual({ base: 14, max: 14 });
    expect(fw([], { DYN_EPP_LATENCY_FOLLOWER_WEIGHT_MAX: "10" })).toEqual({ base: 1, max: 10 });
    expect(() => fw(["--latency-follower-weight=-1"])).toThrow(/--latency-follower-weight.*-1/);
  });

  test("away weight: half the request's prefill by default, 0 turns it off, a negative one is refused", () => {
    const aw = (args: string[], env = {}) => parseConfig(["--config", file, ...args], env).picker.awayWeight;
    expect(aw([])).toBe(0.5);
    expect(aw(["--latency-away-weight", "0"])).toBe(0);
    expect(aw([], { DYN_EPP_LATENCY_AWAY_WEIGHT: "1.5" })).toBe(1.5);
    expect(() => aw(["--latency-away-weight=-1"])).toThrow(/--latency-away-weight.*-1/);
  });

  test("Kubernetes mode from --pool-name", () => {
    const c = parseConfig(["--pool-name", "pool", "--model", "m", "--block-size", "32", "--dp-size", "2"], { POD_NAMESPACE: "ns" });
    expect(c.workers).toEqual({ mode: "kubernetes", poolName: "pool", namespace: "ns", kvEventsPort: 5557, kvReplayPort: undefined, dpSize: 2 });
    expect(c.model.blockSize).toBe(32);
    expect(c.recovery).toEqual({ mode: "disabled" });
  });

  test.each([
    [["--config", file, "--grpc-port", "70000"], /--grpc-port: "70000"/],
    [["--config", file, "--grpc-port", "abc"], /--grpc-port: "abc"/],
    [["--config", file, "--body-mode", "sideways"], /--body-mode: "sideways"/],
    [["--config", file, "--kv-heartbeat-ms", "1.5"], /--kv-heartbeat-ms: "1.5"/],
    [["--config", file, "--tls-cert-file", "/c.pem"], /--tls-cert-file and --tls-key-file go together/],
    [["--config", file, "--secure-serving=false", "--tls-cert-file", "/c.pem", "--tls-key-file", "/k.pem"], /--tls-cert-file is given but --secure-serving is false/],
    [["--config", file, "--frobnicate", "1"], /frobnicate/],
    [["--config", file, "--objective-priorities", "batch=-1,chat"], /--objective-priorities.*"chat" \(expected name=integer\)/],
    [["--config", file, "--grpc-port="], /--grpc-port: ""/],
    [["--config", file, "--grpc-port", "0x10"], /--grpc-port: "0x10"/],
    [["--config", file, "--temperature", " "], /--temperature: " "/],
    [["--config", file, "--cost-shape", "round"], /--cost-shape: "round" \(expected score\|blocks\)/],
    [["--config", file, "--load-by", "tokens"], /--load-by: "tokens" \(expected requests\|blocks\)/],
    [["--config", file, "--prefix-cap-blocks", "1.5"], /--prefix-cap-blocks: "1.5"/],
    [["--config", file, "--scrape-interval-ms", "3000000000"], /--scrape-interval-ms: "3000000000"/],
    [["--pool-name", "p", "--kv-events-port", "65535", "--dp-size", "2"], /--kv-events-port: "65535" \(rank 1/],
    [["--config", writeStaticConfig([{ id: "a", address: `${LOOPBACK}.4.1:8000`, kvEvents: `tcp://${LOOPBACK}.4.1:70000` }])], /workers.0.kvEvents.*port above 65535/],
    [
      ["--config", writeStaticConfig([0, 1].map((i) => ({ id: "a", address: `${LOOPBACK}.4.${i}:8000`, kvEvents: `tcp://${LOOPBACK}.4.${i}:5557` })))],
      /worker ids must be unique/,
    ],
    [["--config", "/nonexistent/epp.yaml"], /\/nonexistent\/epp.yaml/],
    [[], /--config FILE.*--pool-name/],
  ])("%p is rejected with a message naming the flag and value", (argv, message) => {
    expect(() => parseConfig(argv as string[], {})).toThrow(ConfigError);
    expect(() => parseConfig(argv as string[], {})).toThrow(message);
  });

  test("a bad environment value names the variable and the flag", () => {
    expect(() => parseConfig(["--config", file], { DYN_EPP_RECOVERY_HTTP_TIMEOUT_MS: "-5" })).toThrow(
      /DYN_EPP_RECOVERY_HTTP_TIMEOUT_MS \(--recovery-timeout-ms\): "-5"/,
    );
  });

  test("replica-agg: on by default, peers from static peers (host + replica-agg port, or the object form)", () => {
    const peers = writeStaticConfig([], [`http://${LOOPBACK}.8.2:9093`, { url: `http://${LOOPBACK}.8.3:9093`, replicaAgg: `tcp://${LOOPBACK}.8.3:19092` }] as never);
    expect(parseConfig(["--config", peers], {}).replicaAgg).toEqual({
      mode: "on",
      heartbeatMs: 1000,
      timeoutMs: 3000,
      peers: { mode: "static", endpoints: [`tcp://${LOOPBACK}.8.2:9092`, `tcp://${LOOPBACK}.8.3:19092`] },
    });
    // The own --replica-agg-port is the peers' default too; recovery keeps the selection-http URLs.
    const c = parseConfig(["--config", peers, "--replica-agg-port", "7092"], {});
    expect(c.replicaAgg).toMatchObject({ peers: { endpoints: [`tcp://${LOOPBACK}.8.2:7092`, `tcp://${LOOPBACK}.8.3:19092`] } });
    expect(c.recovery).toEqual({ mode: "static", peers: [`http://${LOOPBACK}.8.2:9093`, `http://${LOOPBACK}.8.3:9093`] });
    expect(parseConfig(["--config", peers, "--replica-agg", "false"], {}).replicaAgg).toEqual({ mode: "off" });
    expect(parseConfig(["--config", peers], { DYN_EPP_REPLICA_AGG: "false" }).replicaAgg).toEqual({ mode: "off" });
    expect(parseConfig(["--config", peers, "--replica-agg", "--listen", `${LOOPBACK}.8.9`], {}).replicaAgg.mode).toBe("on");
    expect(parseConfig(["--config", file], { DYN_EPP_PEER_SERVICE: "dynamo-epp-peer", POD_NAMESPACE: "llm" }).replicaAgg).toMatchObject({
      peers: { mode: "kubernetes", peerService: "dynamo-epp-peer", namespace: "llm" },
    });
  });

  test("replica-agg: a timeout within one heartbeat, or a malformed replicaAgg endpoint, is rejected", () => {
    expect(() => parseConfig(["--config", file, "--replica-agg-timeout-ms", "500"], {})).toThrow(/--replica-agg-timeout-ms: "500" \(expected > the heartbeat/);
    const bad = writeStaticConfig([], [{ url: `http://${LOOPBACK}.8.3:9093`, replicaAgg: `${LOOPBACK}.8.3:9092` }] as never);
    expect(() => parseConfig(["--config", bad], {})).toThrow(/peers\.0/);
  });

  test("a worker's DP load-balancing mode is one of vLLM's, and contradicts neither its addresses nor its size", () => {
    const w = (extra: object) => writeStaticConfig([{ id: "a", address: `${LOOPBACK}.4.1:8000`, kvEvents: `tcp://${LOOPBACK}.4.1:5557`, ...extra }]);
    const lb = (extra: object) => (parseConfig(["--config", w(extra)], {}).workers as { list: { dpLb?: string }[] }).list[0]!.dpLb;
    expect(lb({})).toBeUndefined();
    expect(lb({ dpLb: "hybrid", dpSize: 2, dpStartRank: 2 })).toBe("hybrid");
    expect(() => parseConfig(["--config", w({ dpLb: "round-robin" })], {})).toThrow(/workers\.0\.dpLb/);
    expect(() => parseConfig(["--config", w({ dpLb: "internal", address: [`${LOOPBACK}.4.1:8000`, `${LOOPBACK}.4.1:8001`] })], {})).toThrow(/internal DP load balancing has one API server/);
    expect(() => parseConfig(["--config", w({ dpLb: "external", dpSize: 2 })], {})).toThrow(/external DP load balancing runs one API server per rank/);
  });

  test("a worker's role is prefill, decode or both (llm-d's label spelling prefill-decode too); --pd-threshold-tokens defaults to llm-d's 512", () => {
    const w = (extra: object) => writeStaticConfig([{ id: "a", address: "127.0.4.1:8000", kvEvents: "tcp://127.0.4.1:5557", ...extra }]);
    const role = (extra: object) => (parseConfig(["--config", w(extra)], {}).workers as { list: { role?: string }[] }).list[0]!.role;
    expect(role({})).toBeUndefined();
    expect(role({ role: "prefill" })).toBe("prefill");
    expect(role({ role: "prefill-decode" })).toBe("both");
    expect(() => parseConfig(["--config", w({ role: "encode" })], {})).toThrow(/workers\.0\.role = "encode"/);
    expect(parseConfig(["--config", w({})], {}).picker.pdThresholdTokens).toBe(512);
    expect(parseConfig(["--config", w({}), "--pd-threshold-tokens", "0"], {}).picker.pdThresholdTokens).toBe(0);
    expect(parseConfig(["--config", w({})], { DYN_EPP_PD_THRESHOLD_TOKENS: "2048" }).picker.pdThresholdTokens).toBe(2048);
  });

  test("the Kubernetes client is needed by the pool's pods, a peer Service or Lease-backed intents, by nothing of static mode", () => {
    const uses = (args: string[]) => usesKubernetes(parseConfig(args, {}));
    expect(uses(["--config", file])).toBe(false);
    expect(uses(["--config", file, "--intent-discovery", `http://${LOOPBACK}.7.2:7070`])).toBe(false);
    expect(uses(["--pool-name", "p"])).toBe(true);
    expect(uses(["--config", file, "--peer-service", "epp-peer", "--replica-agg", "false"])).toBe(true);
    expect(uses(["--config", file, "--peer-service", "epp-peer"])).toBe(true);
    expect(uses(["--config", file, "--intent-discovery", "kubernetes"])).toBe(true);
  });

  test("a bad static file names the field and value", () => {
    const bad = writeStaticConfig([{ id: "a", address: "nope", kvEvents: `tcp://${LOOPBACK}.4.1:5557` }]);
    expect(() => parseConfig(["--config", bad], {})).toThrow(/workers\.0\.address = "nope"/);
  });
});

describe("bun run epp", () => {
  const run = (args: string[]) => {
    const p = Bun.spawnSync(["bun", `${import.meta.dir}/main.ts`, ...args], { stderr: "pipe", stdout: "pipe" });
    return { code: p.exitCode, stderr: p.stderr.toString() };
  };

  test("a bad flag value stops the start with exit 2 and a message naming flag and value", () => {
    const r = run(["--config", file, "--metrics-port", "http"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('invalid value for --metrics-port: "http"');
  });

  test("an unusable tokenizer dir stops the start naming --tokenizer-dir", () => {
    const r = run(["--config", file, "--tokenizer-dir", "/nonexistent-tokenizer", "--listen", `${LOOPBACK}.4.250`]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--tokenizer-dir: "/nonexistent-tokenizer"');
  });
});
