// Ground truth for the EPP's index: what mock workers really cache (their GET /admin/cache) against what an
// EPP's index holds (its GET /dump), compared exactly: every (worker rank, block), its parent, its local
// tokens hash and its copy count. The EPP's tests of recovery and event ingestion assert equality with
// this, not with the EPP's own idea of itself. (Here, not in the testkit: it reads the index's hashes and
// the recovery dump, and those packages' own tests use the testkit.)
import { computeBlockHashes, fromWireExtraKeys } from "@kv-epp/index-wasm";
import { readDump } from "@kv-epp/recovery";

/** One block of one worker rank as an index holds it. */
export type IndexedBlock = { parent: bigint | null; tokensHash: bigint; copies: number };
/** `"<worker_id>/<dp_rank>"` → block hash → block. Ranks without blocks may be absent. */
export type IndexView = Map<string, Map<bigint, IndexedBlock>>;

/** A worker as the EPP names it (`id`: its worker_id there) and where its mock's HTTP server is. */
export type TruthWorker = { id: string; url: string };

export function rankName(workerId: string, dpRank: number): string {
  return `${workerId}/${dpRank}`;
}

type TruthBody = {
  block_size: number;
  ranks: { rank: number; next_seq: string; blocks: { block_hash: string; parent_hash: string | null; token_ids: number[]; extra_keys?: unknown[] | null; copies: number }[] }[];
};

/** Per rank, the seq its published stream has reached when the truth was read (`next_seq - 1` applied). */
export type TruthSeqs = Map<string, bigint>;

/**
 * The workers' caches as an index should hold them: the tokens hash is the EPP's local one, computed
 * from the block's token ids exactly as ingestion does.
 */
export async function fetchWorkerTruth(workers: readonly TruthWorker[]): Promise<{ view: IndexView; nextSeq: TruthSeqs; blockSize: number }> {
  const view: IndexView = new Map();
  const nextSeq: TruthSeqs = new Map();
  let blockSize = 0;
  for (const w of workers) {
    const res = await fetch(`${w.url}/admin/cache`);
    if (!res.ok) throw new Error(`${w.url}/admin/cache answered ${res.status}`);
    const body = (await res.json()) as TruthBody;
    blockSize = body.block_size;
    for (const r of body.ranks) {
      const name = rankName(w.id, r.rank);
      nextSeq.set(name, BigInt(r.next_seq));
      const blocks = new Map<bigint, IndexedBlock>();
      for (const b of r.blocks) {
        const tokensHash = computeBlockHashes(Uint32Array.from(b.token_ids), body.block_size, [fromWireExtraKeys(b.extra_keys)])[0]!;
        blocks.set(BigInt(b.block_hash), { parent: b.parent_hash === null ? null : BigInt(b.parent_hash), tokensHash, copies: b.copies });
      }
      if (blocks.size > 0) view.set(name, blocks);
    }
  }
  return { view, nextSeq, blockSize };
}

/**
 * An EPP's index for one model key, read from its `/dump` (exact u64, streamed). `model`: the
 * `"<model>:<tenant>"` key; by default the dump's only one (an error if it has several).
 */
export async function fetchIndexView(selectionUrl: string, opts: { model?: string; token?: string } = {}): Promise<IndexView> {
  const res = await fetch(`${selectionUrl}/dump`, { headers: opts.token ? { authorization: `Bearer ${opts.token}` } : {} });
  if (!res.ok || !res.body) throw new Error(`${selectionUrl}/dump answered ${res.status}`);
  const byKey = new Map<string, IndexView>();
  for await (const { key, event } of readDump(res.body)) {
    let view = byKey.get(key);
    if (!view) byKey.set(key, (view = new Map()));
    const name = rankName(event.workerId, event.dpRank);
    let blocks = view.get(name);
    if (!blocks) view.set(name, (blocks = new Map()));
    let parent = event.parentHash;
    for (const b of event.blocks) {
      // copies 0: a record on the path of held blocks, not a block the worker holds
      if (b.copies !== 0) blocks.set(b.blockHash, { parent, tokensHash: b.tokensHash, copies: b.copies ?? 1 });
      parent = b.blockHash;
    }
  }
  if (opts.model !== undefined) return byKey.get(opts.model) ?? new Map();
  if (byKey.size > 1) throw new Error(`the dump of ${selectionUrl} has several models (${[...byKey.keys()].join(", ")}): name one`);
  return byKey.values().next().value ?? new Map();
}

export type IndexDiff = {
  equal: boolean;
  /** Blocks the expected side holds and the actual one does not, per rank. */
  missing: number;
  /** Blocks the actual side holds and the expected one does not. */
  extra: number;
  /** Blocks on both sides with another parent, tokens hash or copy count. */
  differing: number;
  /** Blocks compared on the expected side, and their copies summed. */
  blocks: number;
  copies: number;
  /** Up to 10 examples, one line each, for the assertion message. */
  examples: string[];
};

/** Exact comparison of two views; ranks with no blocks equal absent ones. */
export function diffIndexViews(expected: IndexView, actual: IndexView): IndexDiff {
  const d: IndexDiff = { equal: true, missing: 0, extra: 0, differing: 0, blocks: 0, copies: 0, examples: [] };
  const note = (s: string) => void (d.examples.length < 10 && d.examples.push(s));
  const empty = new Map<bigint, IndexedBlock>();
  for (const name of new Set([...expected.keys(), ...actual.keys()])) {
    const want = expected.get(name) ?? empty;
    const got = actual.get(name) ?? empty;
    d.blocks += want.size;
    for (const [h, w] of want) {
      d.copies += w.copies;
      const g = got.get(h);
      if (!g) {
        d.missing++;
        note(`${name}: missing block ${h}`);
      } else if (g.parent !== w.parent || g.tokensHash !== w.tokensHash || g.copies !== w.copies) {
        d.differing++;
        note(`${name}: block ${h} is ${show(g)}, expected ${show(w)}`);
      }
    }
    for (const h of got.keys())
      if (!want.has(h)) {
        d.extra++;
        note(`${name}: extra block ${h}`);
      }
  }
  d.equal = d.missing === 0 && d.extra === 0 && d.differing === 0;
  return d;
}

function show(b: IndexedBlock): string {
  return `{parent ${b.parent}, tokens ${b.tokensHash}, copies ${b.copies}}`;
}

/** One line: "equal (n blocks)" or the counts and examples. */
export function describeDiff(d: IndexDiff): string {
  if (d.equal) return `equal (${d.blocks} blocks)`;
  return `${d.missing} missing, ${d.extra} extra, ${d.differing} differing of ${d.blocks}:\n  ${d.examples.join("\n  ")}`;
}

/** The EPP's index compared with the workers' caches, read now (call it once traffic has stopped). */
export async function compareIndexWithWorkers(selectionUrl: string, workers: readonly TruthWorker[], opts: { model?: string; token?: string } = {}): Promise<IndexDiff> {
  const truth = await fetchWorkerTruth(workers);
  return diffIndexViews(truth.view, await fetchIndexView(selectionUrl, opts));
}

/**
 * Polls until the EPP's index equals the workers' caches (events still in flight when traffic stopped
 * arrive meanwhile); throws with the last difference if it never does.
 */
export async function waitForIndexToMatch(
  selectionUrl: string,
  workers: readonly TruthWorker[],
  opts: { model?: string; token?: string; timeoutMs?: number } = {},
): Promise<IndexDiff> {
  const deadline = Date.now() + (opts.timeoutMs ?? 10_000);
  for (;;) {
    const d = await compareIndexWithWorkers(selectionUrl, workers, opts);
    if (d.equal) return d;
    if (Date.now() >= deadline) throw new Error(`the index at ${selectionUrl} differs from the workers' caches: ${describeDiff(d)}`);
    await Bun.sleep(50);
  }
}
