import { EventEmitter } from "node:events";
import { describe, expect, test } from "bun:test";
import type { KvEvent } from "@kv-epp/kv-events";
import { workerKey } from "@kv-epp/protocol";
import { ActiveLoad, LatencyModel, NO_METRICS, Picker, type Candidate, type RoutingContext } from "@kv-epp/routing";
import { readBody } from "@kv-epp/tokenizer";
import pino from "pino";
import { Indexers } from "../indexers/indexers.ts";
import { createMetrics } from "../metrics.ts";
import { BodyBudget } from "./body-budget.ts";
import type { ProcessingRequest, ProcessingResponse } from "./messages.ts";
import { createProcessHandler } from "./server.ts";
import type { TokenizeBody } from "../tokens.ts";

const enc = new TextEncoder();

describe("ext_proc to SGLang workers", () => {
  const BS = 4;
  const ADAPTED = [1, 2, 3, 4, 5, 6, 7, 8];
  const BASE = [11, 12, 13, 14, 15, 16, 17, 18];
  const stored = (hashes: bigint[], tokenIds: number[], lora?: string): KvEvent =>
    ({ type: "BlockStored", blockHashes: hashes, parentBlockHash: null, tokenIds, blockSize: BS, loraId: null, medium: "GPU", ...(lora ? { loraName: lora, extraKeys: hashes.map(() => [lora]) } : {}) }) as KvEvent;

  /**
   * One worker holding ADAPTED's two blocks in adapter "sql"'s identity (as SGLang's events name them) and BASE's in
   * the base model's; every body is tokenized as `tokens`. Returns the decision explained, and why responses went
   * unscored.
   */
  function pool(sglang: boolean, tokenizeBody?: TokenizeBody) {
    const ixs = new Indexers(createMetrics());
    ixs.models.register("m", "default", BS);
    ixs.models.readAdaptersAs(sglang ? "sglang" : "vllm");
    const w = { workerId: "w", dpRank: 0 };
    ixs.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [stored([1n, 2n], ADAPTED, "sql"), stored([3n, 4n], BASE)] } });
    const candidates: Candidate[] = [{ ...w, key: workerKey(w), endpoint: "10.0.0.1:8000", rankHeader: undefined }];
    const load = new ActiveLoad();
    const latency = new LatencyModel();
    const unscored: string[] = [];
    const picker = new Picker({
      indexers: { lookup: (m) => ixs.models.lookup(m), adapterOf: (m) => ixs.models.adapterOf(m) },
      candidates: () => candidates,
      load,
      signals: () => undefined,
      options: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0, shape: { kind: "blocks" }, queueThreshold: 0, cost: "weights" },
      latency,
    });
    const routing: RoutingContext = {
      picker, load, latency, candidates: () => candidates, clock: { now: () => 0 },
      metrics: { ...NO_METRICS, unscored: (r) => unscored.push(r) },
      quality: { watch: () => undefined } as unknown as RoutingContext["quality"], // no response comes here
    };
    const decision = (body: object | string, tokens: number[]): string => {
      const handle = createProcessHandler({
        routing,
        tokenizeBody: tokenizeBody ?? ((req) => ({ fields: readBody(req).fields, tokens: Uint32Array.from(tokens), body: req.body, rewritten: false })),
        metrics: createMetrics(),
        log: pino({ level: "silent" }),
        bodyMode: "auto",
        maxInflight: 0,
        bodyBudget: new BodyBudget(8 << 20),
        explainAll: true,
        sglangBodies: sglang,
      });
      const call = new (class extends EventEmitter {
        readonly written: ProcessingResponse[] = [];
        write(m: ProcessingResponse) {
          this.written.push(m);
        }
        end() {}
      })();
      handle(call as never);
      const send = (m: ProcessingRequest) => call.emit("data", m, 0);
      send({ request: "request_headers", request_headers: { headers: { headers: [] } }, protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED" } });
      send({ request: "request_body", request_body: { body: enc.encode(typeof body === "string" ? body : JSON.stringify(body)), end_of_stream: true } });
      type Set = { header: { key: string; raw_value: Uint8Array } }[];
      const sets = call.written.flatMap((m) => Object.values(m).flatMap((p) => ((p as { response?: { header_mutation?: { set_headers?: Set } } })?.response?.header_mutation?.set_headers ?? [])));
      const explained = sets.find((h) => h.header.key === "x-kv-epp-decision");
      return new TextDecoder().decode(explained?.header.raw_value);
    };
    return { decision, unscored, blocks: () => load.of(workerKey(w)).blocks };
  }
  const overlap = (explanation: string) => /^chosen: worker=w dp_rank=0 overlap=(\d+\/\d+)/.exec(explanation)?.[1];

  test("a request naming an adapter by lora_path or \"<model>:<adapter>\" is scored in the adapter's identity; to vLLM workers, neither names one", () => {
    const sglang = pool(true);
    expect(overlap(sglang.decision({ model: "m", prompt: "p", lora_path: "sql" }, ADAPTED))).toBe("2/2");
    expect(overlap(sglang.decision({ model: "m:sql", prompt: "p" }, ADAPTED))).toBe("2/2");
    expect(overlap(sglang.decision({ model: "m:sql", prompt: "p" }, BASE))).toBe("0/2");
    expect(overlap(sglang.decision({ model: "m", prompt: "p" }, ADAPTED))).toBe("0/2");
    const vllm = pool(false);
    expect(overlap(vllm.decision({ model: "m", prompt: "p", lora_path: "sql" }, ADAPTED))).toBe("0/2");
    expect(overlap(vllm.decision({ model: "m", prompt: "p", lora_path: "sql" }, BASE))).toBe("2/2");
  });

  test("a request with an extra_key is routed by load, charged for its length and unscored; the same without one is matched", () => {
    const sglang = pool(true);
    expect(overlap(sglang.decision({ model: "m", prompt: "p" }, BASE))).toBe("2/2");
    expect(sglang.unscored).toEqual([]);
    expect(overlap(sglang.decision({ model: "m", prompt: "p", extra_key: "tenant-a" }, BASE))).toBe("0/2");
    expect(sglang.unscored).toEqual(["cache_namespace"]);
    // vLLM has no such field: the same body is matched.
    expect(overlap(pool(false).decision({ model: "m", prompt: "p", extra_key: "tenant-a" }, BASE))).toBe("2/2");
  });

  // Read with the body (its top-level members, as JSON reads them), whatever its size: 1 MiB was the old byte
  // search's bound, past which a body holding the text "extra_key" anywhere was routed by load.
  test("a body over 1 MiB is routed by its top-level lora_path and extra_key, not by where their names appear", () => {
    const sglang = pool(true);
    const long = "x".repeat(1 << 20);
    expect(overlap(sglang.decision({ model: "m", prompt: long, metadata: { extra_key: "k" } }, BASE))).toBe("2/2");
    expect(overlap(sglang.decision({ model: "m", prompt: long, lora_path: "sql" }, ADAPTED))).toBe("2/2");
    expect(sglang.unscored).toEqual([]);
    expect(overlap(sglang.decision({ model: "m", prompt: long, extra_key: "k" }, BASE))).toBe("0/2");
    expect(sglang.unscored).toEqual(["cache_namespace"]);
  });

  /**
   * Tokenizes every body as `ids`, a block at a time as a pool member tells its known prefix, and stops where the
   * caller's `settles` says the pick is settled, answering with the whole length estimated; `told` is how far it went.
   */
  function member(ids: number[]) {
    const seen = { told: 0 };
    const tokenizeBody: TokenizeBody = (req, _signal, settles) => {
      const { fields } = readBody(req);
      for (seen.told = BS; seen.told < ids.length; seen.told += BS) {
        const known = Uint32Array.from(ids.slice(0, seen.told));
        if (settles?.(fields, known, ids.length)) return { fields, tokens: known, promptTokens: ids.length, body: req.body, rewritten: false };
      }
      return { fields, tokens: Uint32Array.from(ids), body: req.body, rewritten: false };
    };
    return { seen, tokenizeBody };
  }

  test("with --route-on-settled-prefix=false a long text with an extra_key is still answered once its fields are read, charged for its whole length", () => {
    const long = Array.from({ length: 40 }, (_, i) => 100 + i); // 10 blocks
    const text = member(long);
    const sglang = pool(true, text.tokenizeBody);
    const charged = sglang.blocks();
    expect(overlap(sglang.decision({ model: "m", prompt: "p", extra_key: "tenant-a" }, long))).toBe("0/10");
    expect(text.seen.told).toBe(BS);
    expect(sglang.blocks() - charged).toBe(10);
    // Without the key (or to vLLM workers, for which it is no field) the option holds: tokenized whole.
    sglang.decision({ model: "m", prompt: "p" }, long);
    expect(text.seen.told).toBe(long.length);
    const vllmText = member(long);
    pool(false, vllmText.tokenizeBody).decision({ model: "m", prompt: "p", extra_key: "tenant-a" }, long);
    expect(vllmText.seen.told).toBe(long.length);
  });

  test("a key written with JSON escapes is the key JSON reads", () => {
    const sglang = pool(true);
    expect(overlap(sglang.decision('{"model": "m", "prompt": "p", "extra\\u005fkey": "k"}', BASE))).toBe("0/2");
    expect(sglang.unscored).toEqual(["cache_namespace"]);
    expect(overlap(sglang.decision('{"model": "m", "prompt": "p", "lora\\u005fpath": "sql"}', ADAPTED))).toBe("2/2");
  });
});
