import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import { hostPort } from "@kv-epp/protocol";
import type { Generation, TransferPlan } from "../engine/rank-engine.ts";
import { Handoff } from "./handoff.ts";
import type { MooncakeRequest } from "./mooncake-params.ts";
import { KvTransferFailed } from "./sglang-connector.ts";

/**
 * One worker's stand-in for vLLM's MooncakeConnector (`--role ... --kv-connector mooncake`), the flow of its
 * `mooncake_connector.py`:
 *
 * - Prefill side (`--role prefill` or `both`, vLLM's kv_producer / kv_both): a bootstrap server on
 *   `--mooncake-bootstrap-port` (VLLM_MOONCAKE_BOOTSTRAP_PORT) answers `GET /query` with each DP rank's engine id and
 *   where its worker listens (mooncake-bootstrap.ts). A request with `do_remote_decode` and a `transfer_id` runs,
 *   answers at once with no `kv_transfer_params`, and its blocks stay held under the transfer id until a decode
 *   worker takes them or `abortTimeoutMs` passes (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, 480 s). A decode worker that
 *   asks first waits for them, up to the same timeout (vLLM's "Timeout waiting for P side ready").
 * - Decode side: a request with `do_remote_prefill` asks `remote_bootstrap_addr`'s `/query` for the engine's worker
 *   (once per engine id, as vLLM's `_remote_agents`; a failed query is not kept), then takes the blocks from that
 *   worker and reads the ones it lacks (`msPerBlock` each), computing only the last prompt token (rank-engine.ts's
 *   pull, as the NIXL stand-in does). A failed load fails the request (vLLM's default kv_load_failure_policy
 *   "fail"): the mock answers 500 with the reason.
 *
 * Real Mooncake moves the KV with its transfer engine (RDMA) after a ZeroMQ handshake on each prefill worker's side
 * channel, the `worker_addr` /query lists. Here `worker_addr` names the mock's bootstrap port, where
 * `POST /mooncake/transfer` hands the transfer over (the counts a simulated cache needs, never bytes).
 */
export type MooncakeConnectorOptions = {
  msPerBlock: number;
  abortTimeoutMs: number;
  blockSize: number;
  dpSize: number;
  log: Logger;
};

/** What the prefill's worker hands a decode worker for a transfer id. */
export type MooncakeKv = { transfer_id: string; prompt_tokens: number; blocks: number };

/** /query's entry for one DP rank (vLLM's EngineEntry; tp and pp rank 0 only). */
export type EngineEntry = { engine_id: string; worker_addr: Record<string, Record<string, string>>; pp_size: number; tp_size: number };

/** A transfer the prefill side refuses: unknown engine (404) or never ready (504). */
export class TransferRefused extends Error {
  constructor(readonly status: 404 | 504, message: string) {
    super(message);
  }
}

/** vLLM's httpx default timeout, which its decode's bootstrap query runs with. */
const QUERY_TIMEOUT_MS = 5_000;

type Held = { kv: MooncakeKv; release(): void; timer: ReturnType<typeof setTimeout> };

export class MockMooncakeConnector {
  private readonly engineUuid = randomUUID();
  /** prefill side: finished prefills' blocks, and decode workers waiting for a transfer not yet computed, by `<rank>/<transfer id>` */
  private readonly held = new Handoff<Held>();
  /** decode side: remote engine id -> its worker's address (vLLM's _remote_agents) */
  private readonly agents = new Map<string, string>();
  /** decode side: bootstrap queries in flight, by address */
  private readonly querying = new Map<string, Promise<void>>();
  /** prefill side: where decode workers reach the worker (the bootstrap port), once it listens */
  workerAddr = { host: "127.0.0.1", port: 0 };
  /** prefill side: `GET /query` answered */
  queries = 0;
  /** transfers handed over (prefill side) or taken (decode side) */
  transferred = 0;
  /** decode side: loads that failed (the request failed with them) */
  failed = 0;
  /** requests whose kv_transfer_params vLLM warns about and ignores */
  invalidParams = 0;
  /** prefill side: held blocks freed at the abort timeout, never taken */
  expired = 0;

  constructor(readonly opts: MooncakeConnectorOptions) {}

  /** A DP rank's engine id: vLLM's engine_id (a UUID), a rank's suffixed with it when there are several. */
  engineId(rank: number): string {
    return this.opts.dpSize > 1 ? `${this.engineUuid}_dp${rank}` : this.engineUuid;
  }

  /** `/query`'s answer: one entry per rank, keyed as `x-data-parallel-rank` numbers them (`key(rank)`). */
  query(ranks: readonly number[], key: (rank: number) => number): Record<string, EngineEntry> {
    this.queries++;
    const addr = `tcp://${hostPort(this.workerAddr.host, this.workerAddr.port)}`;
    return Object.fromEntries(ranks.map((r) => [String(key(r)), { engine_id: this.engineId(r), worker_addr: { "0": { "0": addr } }, pp_size: 1, tp_size: 1 }]));
  }

  /** The engine's part of a request that needs no waiting first: a prefill to hold; undefined for any other. */
  plan(req: MooncakeRequest): TransferPlan | undefined {
    if (req.kind === "invalid") {
      this.invalidParams++;
      this.opts.log.warn({ why: req.why }, "invalid kv_transfer_params: the request runs without a KV transfer");
    }
    return req.kind === "send" ? { kind: "send" } : undefined;
  }

  /** Prefill side, once a `send` request finished: its blocks are held under the transfer id. False when the engine held none. */
  offer(transferId: string, gen: Generation, rank: number): boolean {
    const held = gen.held;
    if (!held) return false;
    const key = `${rank}/${transferId}`;
    const entry: Held = {
      kv: { transfer_id: transferId, prompt_tokens: gen.promptTokens, blocks: Math.ceil(gen.promptTokens / this.opts.blockSize) },
      release: () => held.release(),
      timer: setTimeout(() => {
        if (!this.held.withdraw(key, entry)) return;
        this.expired++;
        this.opts.log.warn({ transferId }, "prefilled blocks never taken by a decode worker: freed at the abort timeout");
        held.release();
      }, this.opts.abortTimeoutMs),
    };
    entry.timer.unref?.();
    this.held.put(key, entry);
    return true;
  }

  /**
   * Prefill side, for a decode worker: the transfer's KV once the prefill on the engine's rank finished (its blocks
   * are then freed: sent), or a refusal.
   */
  async take(transferId: string, engineId: string, ranks: readonly number[], signal: AbortSignal): Promise<MooncakeKv> {
    const rank = ranks.find((r) => this.engineId(r) === engineId);
    if (rank === undefined) throw new TransferRefused(404, `engine ${engineId} is not served here`);
    const timeout = AbortSignal.timeout(this.opts.abortTimeoutMs);
    let h: Held;
    try {
      h = await this.held.take(`${rank}/${transferId}`, AbortSignal.any([signal, timeout]));
    } catch (e) {
      if (signal.aborted || !timeout.aborted) throw e;
      this.opts.log.warn({ transferId }, "no prefill for the transfer: timed out waiting for P side ready");
      throw new TransferRefused(504, "Timeout waiting for P side ready.");
    }
    clearTimeout(h.timer);
    h.release();
    this.transferred++;
    return h.kv;
  }

  /** Decode side, before the engine: the pull plan for a `receive` request, or KvTransferFailed (the request fails). */
  async receive(req: Extract<MooncakeRequest, { kind: "receive" }>, signal: AbortSignal): Promise<TransferPlan> {
    const fail = (why: string) => {
      this.failed++;
      this.opts.log.warn({ transferId: req.transferId, bootstrap: req.bootstrapAddr, why }, "Mooncake KV load failed");
      return new KvTransferFailed(`KV load for transfer ${req.transferId} failed (kv_load_failure_policy "fail"): ${why}`);
    };
    if (!this.agents.has(req.engineId)) await this.queryBootstrap(req.bootstrapAddr);
    const addr = this.agents.get(req.engineId);
    if (addr === undefined) throw fail(`remote engine_id ${req.engineId} not found from bootstrap server ${req.bootstrapAddr}`);
    let kv: MooncakeKv;
    try {
      const res = await fetch(`http://${addr.replace(/^tcp:\/\//, "")}/mooncake/transfer`, {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ transfer_id: req.transferId, engine_id: req.engineId }),
        // vLLM's receiver lets the prefill side time out first (RCVTIMEO: its abort timeout plus 60 s).
        signal: AbortSignal.any([signal, AbortSignal.timeout(this.opts.abortTimeoutMs + 60_000)]),
      });
      const body = (await res.json().catch(() => ({}))) as Partial<MooncakeKv> & { err_msg?: string };
      if (!res.ok) throw fail(body.err_msg ?? `transfer answered ${res.status}`);
      kv = body as MooncakeKv;
    } catch (e) {
      if (e instanceof KvTransferFailed) throw e;
      if (signal.aborted) throw signal.reason;
      throw fail(`transfer failed: ${(e as Error).message}`);
    }
    this.transferred++;
    return { kind: "receive", remoteBlocks: kv.blocks, msPerBlock: this.opts.msPerBlock, onPulled: () => {} };
  }

  /** vLLM's _connect_to_prefiller_bootstrap: every engine the answer lists is remembered; a failure only logged. */
  private queryBootstrap(addr: string): Promise<void> {
    let q = this.querying.get(addr);
    if (q) return q;
    q = (async () => {
      try {
        const res = await fetch(`${addr}/query`, { signal: AbortSignal.timeout(QUERY_TIMEOUT_MS) });
        if (!res.ok) throw new Error(`HTTP ${res.status}`);
        const data = (await res.json()) as Record<string, Partial<EngineEntry>>;
        for (const entry of Object.values(data)) {
          const worker = entry.worker_addr?.["0"]?.["0"];
          if (typeof entry.engine_id === "string" && typeof worker === "string") this.agents.set(entry.engine_id, worker);
        }
      } catch (err) {
        this.opts.log.error({ err, bootstrap: addr }, "Failed to connect to bootstrap server");
      } finally {
        this.querying.delete(addr);
      }
    })();
    this.querying.set(addr, q);
    return q;
  }

  /** Frees everything held (the worker is closing). */
  close(): void {
    for (const h of this.held.drain()) {
      clearTimeout(h.timer);
      h.release();
    }
  }
}
