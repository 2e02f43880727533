import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import { hostPort } from "@kv-epp/protocol";
import type { Generation, TransferPlan } from "../engine/rank-engine.ts";
import { decodeParams, type TransferRequest } from "./params.ts";

/**
 * One worker's stand-in for vLLM's NixlConnector (`--role prefill|decode`; a `both` worker has none
 * and ignores `kv_transfer_params`, as vLLM without `--kv-transfer-config`). Prefill side: a finished
 * prefill's blocks are held under its request id until the decode worker says it read them
 * (`POST /nixl/notify`) or `abortTimeoutMs` passes (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT), and the
 * answer carries the parameters that name them. Decode side: a pull is planned for the engine, which
 * waits out its transfer time, then the prefill worker is notified.
 */
export type ConnectorOptions = {
  msPerBlock: number;
  abortTimeoutMs: number;
  blockSize: number;
  log: Logger;
};

export class MockNixlConnector {
  /** vLLM draws an engine id (a UUID) per engine; a DP rank's is suffixed with its rank. */
  private readonly engineUuid = randomUUID();
  private readonly held = new Map<string, { release(): void; timer: ReturnType<typeof setTimeout> }>();
  private nextBlockId = 0;
  /** do_remote_prefill requests that could not pull (vLLM: "Got invalid KVTransferParams"). */
  invalidParams = 0;
  /** held prefills freed by the timeout: their decode worker never read them */
  expired = 0;
  /** notifications to a prefill worker that failed (its blocks then wait for the timeout) */
  notifyFailures = 0;
  /** Where decode workers reach this worker's side channel (its HTTP server), once it listens. */
  sideChannel = { host: "127.0.0.1", port: 0 };

  constructor(private readonly opts: ConnectorOptions) {}

  get heldRequests(): number {
    return this.held.size;
  }

  /** The engine's part of a request's transfer, or undefined for a request that has none. */
  plan(req: TransferRequest): TransferPlan | undefined {
    switch (req.kind) {
      case "none":
        return undefined;
      case "send":
        return { kind: "send" };
      case "invalid":
        this.invalidParams++;
        this.opts.log.warn({ why: req.why }, "invalid kv_transfer_params: the request runs without a KV transfer");
        return undefined;
      case "receive":
        return {
          kind: "receive", remoteBlocks: req.remoteBlocks, msPerBlock: this.opts.msPerBlock,
          onPulled: () => void this.notify(req.host, req.port, req.requestId),
        };
    }
  }

  /**
   * After a `send` request's answer is ready: holds its blocks under a request id and returns the
   * parameters for its decode worker; null when the engine did not hold them (it ended early).
   */
  offer(gen: Generation, requestId: string, rank: number, dpSize: number): ReturnType<typeof decodeParams> | null {
    const held = gen.held;
    if (!held) return null;
    const timer = setTimeout(() => {
      if (!this.held.delete(requestId)) return;
      this.expired++;
      this.opts.log.warn({ request: requestId }, "prefilled blocks never read by a decode worker: freed at the abort timeout");
      held.release();
    }, this.opts.abortTimeoutMs);
    timer.unref?.();
    this.held.set(requestId, { release: held.release, timer });
    // vLLM's ids are slots of the prefill worker's block pool, one per block of the prompt's tokens.
    const n = Math.ceil(gen.promptTokens / this.opts.blockSize);
    const blockIds = Array.from({ length: n }, () => (this.nextBlockId = (this.nextBlockId + 1) % 0x7fffffff));
    return decodeParams({
      blockIds, requestId, host: this.sideChannel.host, port: this.sideChannel.port,
      engineId: dpSize > 1 ? `${this.engineUuid}_dp${rank}` : this.engineUuid,
    });
  }

  /** The decode worker read a held prefill's blocks: they are freed. False for an unknown id. */
  read(requestId: string): boolean {
    const h = this.held.get(requestId);
    if (!h) return false;
    this.held.delete(requestId);
    clearTimeout(h.timer);
    h.release();
    return true;
  }

  /** Frees everything held (the worker is closing). */
  close(): void {
    for (const id of [...this.held.keys()]) this.read(id);
  }

  private async notify(host: string, port: number, requestId: string): Promise<void> {
    try {
      const res = await fetch(`http://${hostPort(host, port)}/nixl/notify`, {
        method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ remote_request_id: requestId }),
        signal: AbortSignal.timeout(10_000),
      });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
    } catch (err) {
      this.notifyFailures++;
      this.opts.log.warn({ err, peer: `${host}:${port}`, request: requestId }, "could not notify the prefill worker: its blocks wait for its abort timeout");
    }
  }
}
