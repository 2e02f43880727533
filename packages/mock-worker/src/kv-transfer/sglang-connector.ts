import type { Logger } from "pino";
import { hostPort } from "@kv-epp/protocol";
import type { Generation, TransferPlan } from "../engine/rank-engine.ts";
import { Handoff } from "./handoff.ts";
import type { Bootstrap } from "./sglang-params.ts";

/**
 * One worker's stand-in for SGLang's disaggregation (`--disaggregation-mode prefill|decode`), the flow of
 * SGLang's `disaggregation/prefill.py` and `decode.py` over its KV managers (Mooncake, NIXL, ...):
 *
 * - Prefill side: a request carrying a bootstrap room computes its prompt and one output token, and its
 *   blocks stay held under the room until the decode server that names the same room takes them; only then
 *   does the prefill answer, streamed or not (SGLang ends a prefill with `FINISH_LENGTH(length=0)` once its KV
 *   transfer succeeded, and sends its output only then). A room no decode server asks for fails after
 *   `bootstrapTimeoutMs` (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT) with a 500, and its blocks are freed. (SGLang
 *   waits for the decode's handshake before it computes the prompt; the mock computes first, then waits.)
 * - Decode side: a request carrying `bootstrap_host`, `bootstrap_port` and `bootstrap_room` asks the prefill
 *   server's bootstrap port for the room's KV, then reads the blocks it lacks (`msPerBlock` each) and computes
 *   only the last prompt token, as the vLLM-style pull does (rank-engine.ts). A room that never arrives fails
 *   after `waitingTimeoutMs` (SGLANG_DISAGGREGATION_WAITING_TIMEOUT), a bootstrap server that cannot be reached (or
 *   answers an error) at once; both are SGLang's 500 (`prepare_abort` with INTERNAL_SERVER_ERROR) with SGLang's
 *   message (`KVTransferError(bootstrap_room=N): ...`). At once is older SGLang's: newer releases ask the bootstrap
 *   server again, up to 15 times 1 s apart, before they fail the request.
 *
 * Real SGLang moves the KV over RDMA (Mooncake, NIXL, ...) after a handshake through the prefill server's
 * bootstrap server; here the bootstrap port itself hands the room over (`GET /kv/<room>`, sglang-bootstrap.ts),
 * which carries only the counts a simulated cache needs. The decode reads the blocks it lacks by their hashes,
 * as the NIXL stand-in does: its cache then holds the prompt's blocks under the same hashes.
 */
export type SglangConnectorOptions = {
  mode: "prefill" | "decode";
  msPerBlock: number;
  blockSize: number;
  /** decode side: SGLANG_DISAGGREGATION_WAITING_TIMEOUT */
  waitingTimeoutMs: number;
  /** prefill side: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT */
  bootstrapTimeoutMs: number;
  /** --disaggregation-bootstrap-port as configured (0 on a prefill server: set ownBootstrapPort once bound) */
  bootstrapPort: number;
  log: Logger;
};

/** What the bootstrap port hands a decode server for a room. */
export type RoomKv = { bootstrap_room: string; prompt_tokens: number; blocks: number };

/** A transfer SGLang aborts with a 500 (`prepare_abort(..., INTERNAL_SERVER_ERROR)`). */
export class KvTransferFailed extends Error {}

type Offered = { kv: RoomKv; taken(): void };

export class MockSglangConnector {
  /** prefill side: rooms whose KV is ready and not yet taken, and decode servers waiting for a room not yet computed */
  private readonly rooms = new Handoff<Offered>();
  /** rooms handed to (prefill side) or taken from (decode side) a peer */
  transferred = 0;
  /** rooms that failed: not taken in time (prefill side), not received or no prefill server (decode side) */
  failed = 0;
  /**
   * This server's own `--disaggregation-bootstrap-port` (as bound, on a prefill server): SGLang's scheduler puts it in
   * place of a request's null `bootstrap_port`.
   */
  ownBootstrapPort: number;

  constructor(readonly opts: SglangConnectorOptions) {
    this.ownBootstrapPort = opts.bootstrapPort;
  }

  /** Rooms held for a decode server (prefill side). */
  get heldRooms(): number {
    return this.rooms.size;
  }

  /**
   * Prefill side, after the request's engine run: its blocks are held under the room until a decode server
   * takes them (resolves) or the bootstrap timeout passes (rejects with SGLang's message); freed either way.
   */
  async offer(room: bigint, gen: Generation, rid: string, signal: AbortSignal): Promise<void> {
    const key = room.toString();
    const kv: RoomKv = { bootstrap_room: key, prompt_tokens: gen.promptTokens, blocks: Math.ceil(gen.promptTokens / this.opts.blockSize) };
    const started = performance.now();
    try {
      await new Promise<void>((resolve, reject) => {
        const done = () => {
          clearTimeout(timer);
          signal.removeEventListener("abort", onAbort);
          this.rooms.withdraw(key, offered);
        };
        const timer = setTimeout(() => {
          done();
          this.failed++;
          const s = ((performance.now() - started) / 1000).toFixed(1);
          this.opts.log.warn({ room: key }, "no decode server took the room: freed at the bootstrap timeout");
          // SGLang's prefill fails a room while bootstrapping (its bootstrap queue, before the prompt is computed).
          reject(new KvTransferFailed(`Prefill bootstrap failed for request rank=0 req.rid='${rid}' req.bootstrap_room=${key} with exception KVTransferError(bootstrap_room=${key}): Request ${key} timed out after ${s}s in KVPoll.Bootstrapping`));
        }, this.opts.bootstrapTimeoutMs);
        timer.unref?.();
        const onAbort = () => {
          done();
          reject(signal.reason);
        };
        const offered: Offered = {
          kv,
          taken: () => {
            done();
            this.transferred++;
            resolve();
          },
        };
        // Aborted already (the client left during the engine run): nothing to hold.
        if (signal.aborted) return onAbort();
        signal.addEventListener("abort", onAbort, { once: true });
        this.rooms.put(key, offered);
      });
    } finally {
      gen.held?.release();
    }
  }

  /** The bootstrap port's side: the room's KV once the prefill computed it, or the caller's abort. */
  async take(key: string, signal: AbortSignal): Promise<RoomKv> {
    const offered = await this.rooms.take(key, signal);
    offered.taken();
    return offered.kv;
  }

  /**
   * Decode side, before the engine: the room's KV from the prefill server's bootstrap port, as the engine's
   * pull plan. Rejects with SGLang's message when it never arrives or the prefill server cannot be reached,
   * with the signal's reason when the client left.
   */
  async receive(b: Bootstrap, rid: string, signal: AbortSignal): Promise<TransferPlan> {
    const key = b.room.toString();
    const started = performance.now();
    const addr = hostPort(b.host.replace(/^\[(.*)\]$/, "$1"), b.port);
    // SGLang's phases: the handshake (the bootstrap server's answer) and the transfer (the KV itself).
    const fail = (phase: "handshake" | "transfer", why: string) => {
      this.failed++;
      this.opts.log.warn({ room: key, peer: addr, why }, "decode transfer failed");
      return new KvTransferFailed(`Decode ${phase} failed for request rank=0 decode_req.req.rid='${rid}' decode_req.req.bootstrap_room=${key} with exception KVTransferError(bootstrap_room=${key}): ${why}`);
    };
    const unreachable = () => fail("handshake", `Could not fetch prefill parallel info from bootstrap_addr: ${addr}`);
    const timeout = AbortSignal.timeout(this.opts.waitingTimeoutMs);
    let kv: RoomKv;
    try {
      const res = await fetch(`http://${addr}/kv/${key}`, { signal: AbortSignal.any([signal, timeout]) });
      // A bootstrap server that answers an error is one SGLang gets no parallel info from.
      if (!res.ok) throw unreachable();
      kv = (await res.json()) as RoomKv;
    } catch (e) {
      if (e instanceof KvTransferFailed) throw e;
      if (signal.aborted) throw signal.reason;
      if (timeout.aborted) throw fail("transfer", `Request ${key} timed out after ${((performance.now() - started) / 1000).toFixed(1)}s in KVPoll.WaitingForInput`);
      throw unreachable();
    }
    this.transferred++;
    return { kind: "receive", remoteBlocks: kv.blocks, msPerBlock: this.opts.msPerBlock, onPulled: () => {} };
  }
}
