// After the replay: the last request served is asked again of a replica's /select (a dry run, no load
// recorded). The worker that served it has just cached its prompt from its own tokenization and
// published the blocks; the EPP tokenizes the same body itself. The overlap it finds on that worker
// shows both sides produced the same tokens (the same chat template and tokenizer), independently of
// how busy the run was when the EPP picked.
import { EPP_PORTS } from "./cluster.ts";

export type SelectCheck =
  | { replica: string; worker: string; heldBlocks: number; requestBlocks: number; chosen: string }
  | { replica: string; failed: string };

type SelectAnswer = { worker_id: string; request_blocks: number; scores: Record<string, Record<string, number>> };

/**
 * On a busy machine the EPP's tokenization can pass its budget (--tokenize-budget-ms) and the dry run
 * then knows no blocks of the request; the tokenizer pool finishes and keeps the work, so asking again
 * gets the tokens. A few asks, then the answer as it is.
 */
const ASKS = 5;

export async function selectCheck(replica: { name: string; ip: string }, body: Uint8Array, worker: string): Promise<SelectCheck> {
  try {
    let a: SelectAnswer | undefined;
    for (let ask = 0; ask < ASKS && !(a && a.request_blocks > 0); ask++) {
      if (ask > 0) await Bun.sleep(200); // the pool's tokenization of the last ask finishing
      const res = await fetch(`http://${replica.ip}:${EPP_PORTS.selection}/select`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
        signal: AbortSignal.timeout(10_000),
      });
      if (!res.ok) return { replica: replica.name, failed: `/select answered ${res.status}: ${await res.text()}` };
      a = (await res.json()) as SelectAnswer;
    }
    const held = Object.values(a!.scores[worker] ?? {}).reduce((x, y) => Math.max(x, y), 0);
    return { replica: replica.name, worker, heldBlocks: held, requestBlocks: a!.request_blocks, chosen: a!.worker_id };
  } catch (e) {
    return { replica: replica.name, failed: e instanceof Error ? e.message : String(e) };
  }
}

export function selectCheckText(c: SelectCheck | undefined): string {
  if (!c) return "not run";
  if ("failed" in c) return `${c.replica}: ${c.failed}`;
  return (
    `${c.replica}'s /select (dry run) of the last request served, tokenized by the EPP: ${c.worker}, which served it, ` +
    `holds ${c.heldBlocks} of its ${c.requestBlocks} blocks (from the worker's own tokenization); it would pick ${c.chosen}`
  );
}
