// A worker rank, the unit everything routes to and indexes by, and its one string key.

/** One engine rank: the worker (vLLM instance, by id) and its global data-parallel rank. */
export type WorkerRef = { readonly workerId: string; readonly dpRank: number };

/**
 * The map key of a rank: `${workerId}\u0000${dpRank}`. NUL cannot occur in a worker id taken from
 * config, a pod name or an intent, so the key splits back without escaping (parseWorkerKey).
 */
export function workerKey(w: WorkerRef): string {
  return workerKeyOf(w.workerId, w.dpRank);
}

/** workerKey without building a WorkerRef (hot paths that hold the two fields apart). */
export function workerKeyOf(workerId: string, dpRank: number): string {
  return `${workerId}\u0000${dpRank}`;
}

export function parseWorkerKey(key: string): WorkerRef {
  const cut = key.lastIndexOf("\u0000");
  if (cut < 0) throw new Error(`not a worker key: ${JSON.stringify(key)}`);
  return { workerId: key.slice(0, cut), dpRank: Number(key.slice(cut + 1)) };
}

/**
 * Where one rank's KV events are read: its PUB endpoint, its replay (ROUTER) endpoint, the topic its
 * publisher uses (absent: the reader's default), whether the reader binds instead of dialing, and the
 * block size its intent states (absent: the model's).
 */
export type RankSource = {
  dpRank: number;
  kvEvents: string;
  replay?: string;
  topic?: string;
  bind?: boolean;
  blockSize?: number;
};
