// One replay request, as a client (DEALER) of a worker's replay ROUTER (vLLM's protocol, see replay.ts):
// asks for the batches [from, to) and says whether the answer covered that range exactly. Used where a
// consumer, not the listener, must fill a hole it found itself (a recovered index whose cursor is older
// than the first batch its listener buffered).
import { DEFAULT_KV_MAX_MESSAGE_SIZE } from "./batch-bound.ts";
import { parseReplayReply, encodeSeq } from "./replay.ts";
import type { SocketOptions } from "./zmtp/base.ts";
import { DealerSocket } from "./zmtp/dealer.ts";

/** `epoch`: the publisher epoch the reply carried (vLLM's 24-byte seq frame), null when none. */
export type ReplayedBatch = { seq: bigint; epoch: string | null; payload: Buffer };

export type ReplayRangeResult =
  | { kind: "covered"; batches: ReplayedBatch[] }
  /** `got`: batches of the range that did arrive (in order, from its start), for the numbers in a log. */
  | { kind: "uncovered"; reason: "timeout" | "short" | "malformed"; got: number };

export type ReplayRangeOptions = {
  endpoint: string;
  /** First seq wanted. */
  from: bigint;
  /** One past the last seq wanted (to > from). */
  to: bigint;
  /** The whole exchange, connect included (default 2000 ms). */
  timeoutMs?: number;
  socket?: SocketOptions;
};

/**
 * Resolves once the server has sent its end marker (or at the timeout); never rejects. Only the range
 * is kept (a server replays everything from `from` on), so memory is bounded by the range asked for.
 */
export function replayRange(opts: ReplayRangeOptions): Promise<ReplayRangeResult> {
  const want = opts.to - opts.from;
  if (want <= 0n) return Promise.resolve({ kind: "covered", batches: [] });
  const dealer = new DealerSocket({ ...opts.socket, maxMessageSize: opts.socket?.maxMessageSize ?? DEFAULT_KV_MAX_MESSAGE_SIZE });
  const got: ReplayedBatch[] = [];
  let malformed = false;
  return new Promise<ReplayRangeResult>((resolve) => {
    const finish = (timedOut: boolean) => {
      clearTimeout(timer);
      void dealer.close().catch(() => {});
      if (!timedOut && !malformed && BigInt(got.length) === want) resolve({ kind: "covered", batches: got });
      else resolve({ kind: "uncovered", reason: timedOut ? "timeout" : malformed ? "malformed" : "short", got: got.length });
    };
    const timer = setTimeout(() => finish(true), opts.timeoutMs ?? 2000);
    dealer.onMessage((frames) => {
      const r = parseReplayReply(frames);
      if (!r) {
        malformed = true;
        return;
      }
      if (r.kind === "end") return finish(false);
      // Contiguous from `from` only: a batch missing inside the range leaves it uncovered.
      if (r.seq === opts.from + BigInt(got.length) && r.seq < opts.to) got.push({ seq: r.seq, epoch: r.epoch, payload: r.payload });
    });
    dealer.connect(opts.endpoint);
    dealer.send([Buffer.alloc(0), encodeSeq(opts.from)]);
  });
}
